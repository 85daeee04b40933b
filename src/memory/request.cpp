#include "gpumem/memory/request.hpp"

#include <array>

#include "enum_names.hpp"
#include "gpumem/memory/fields.hpp"
#include <cctype>
#include <charconv>
#include <cmath>
#include <nlohmann/json.hpp>

namespace gpumem {

namespace {
using detail::enum_name;
using detail::parse_enum;
constexpr std::array<std::pair<const char*, Mode>, 4> kModes{{{"train", Mode::Train}, {"lora", Mode::Lora}, {"qlora", Mode::QLora}, {"infer", Mode::Infer}}};
constexpr std::array<std::pair<const char*, Precision>, 5> kPrecisions{{{"fp32", Precision::FP32}, {"fp16", Precision::FP16}, {"bf16", Precision::BF16}, {"amp-fp16", Precision::AmpFP16}, {"amp-bf16", Precision::AmpBF16}}};
constexpr std::array<std::pair<const char*, Optimizer>, 9> kOptimizers{{{"sgd", Optimizer::SGD}, {"sgd-momentum", Optimizer::SGDMomentum}, {"adam", Optimizer::Adam}, {"adamw", Optimizer::AdamW}, {"adamw-8bit", Optimizer::AdamW8bit}, {"adafactor", Optimizer::Adafactor}, {"lion", Optimizer::Lion}, {"paged-adamw", Optimizer::PagedAdamW}, {"paged-adamw8bit", Optimizer::PagedAdamW8bit}}};
constexpr std::array<std::pair<const char*, Recompute>, 4> kRecompute{{{"none", Recompute::None}, {"selective", Recompute::Selective}, {"full", Recompute::Full}, {"ops", Recompute::Ops}}};
constexpr std::array<std::pair<const char*, Attention>, 2> kAttention{{{"eager", Attention::Eager}, {"flash", Attention::Flash}}};
constexpr std::array<std::pair<const char*, Quant>, 5> kQuant{{{"none", Quant::None}, {"int8", Quant::Int8}, {"int4", Quant::Int4}, {"nf4", Quant::NF4}, {"fp4", Quant::FP4}}};
constexpr std::array<std::pair<const char*, OptimizerImpl>, 3> kImpl{{{"foreach", OptimizerImpl::Foreach}, {"fused", OptimizerImpl::Fused}, {"for-loop", OptimizerImpl::ForLoop}}};
constexpr std::array<std::pair<const char*, AllocatorKind>, 2> kAllocator{{{"pytorch", AllocatorKind::PyTorch}, {"none", AllocatorKind::None}}};
constexpr std::array<std::pair<const char*, LoadDtype>, 2> kLoadDtype{{{"weights", LoadDtype::Weights}, {"fp32", LoadDtype::FP32}}};
constexpr std::array<std::pair<const char*, ZeroGrad>, 2> kZeroGrad{{{"set-to-none", ZeroGrad::SetToNone}, {"zero", ZeroGrad::Zero}}};
constexpr std::array<std::pair<const char*, Framework>, 10> kFrameworks{{{"hf", Framework::HF}, {"torchtune", Framework::Torchtune}, {"litgpt", Framework::LitGPT}, {"nanogpt", Framework::NanoGPT}, {"megatron", Framework::Megatron}, {"torchtitan", Framework::Torchtitan}, {"deepspeed", Framework::DeepSpeed}, {"axolotl", Framework::Axolotl}, {"unsloth", Framework::Unsloth}, {"llama-factory", Framework::LlamaFactory}}};
constexpr std::array<std::pair<const char*, CrossEntropy>, 4> kCrossEntropy{{{"full", CrossEntropy::Full}, {"chunked", CrossEntropy::Chunked}, {"fused", CrossEntropy::Fused}, {"fused-linear", CrossEntropy::FusedLinear}}};
constexpr std::array<std::pair<const char*, LogitsLifetime>, 2> kLogits{{{"freed", LogitsLifetime::Freed}, {"kept", LogitsLifetime::Kept}}};
constexpr std::array<std::pair<const char*, Kernels>, 3> kKernels{{{"eager", Kernels::Eager}, {"fused", Kernels::Fused}, {"te", Kernels::TE}}};
constexpr std::array<std::pair<const char*, Fp8Recipe>, 7> kFp8{{{"none", Fp8Recipe::None}, {"delayed", Fp8Recipe::Delayed}, {"current", Fp8Recipe::Current}, {"tensorwise", Fp8Recipe::Tensorwise}, {"rowwise", Fp8Recipe::Rowwise}, {"mxfp8", Fp8Recipe::MXFP8}, {"nvfp4", Fp8Recipe::NVFP4}}};
constexpr std::array<std::pair<const char*, RecomputeMethod>, 2> kRecomputeMethod{{{"uniform", RecomputeMethod::Uniform}, {"block", RecomputeMethod::Block}}};
constexpr std::array<std::pair<const char*, CudaGraphs>, 3> kCudaGraphs{{{"none", CudaGraphs::None}, {"compile", CudaGraphs::Compile}, {"megatron", CudaGraphs::Megatron}}};
}  // namespace

const char* to_string(CudaGraphs v) { return enum_name(v, kCudaGraphs); }
const char* to_string(RecomputeMethod v) { return enum_name(v, kRecomputeMethod); }
namespace {
constexpr std::array<std::pair<const char*, Engine>, 5> kEngines{{{"vllm", Engine::VLLM}, {"sglang", Engine::SGLang}, {"llama.cpp", Engine::LlamaCpp}, {"tgi", Engine::TGI}, {"trtllm", Engine::TRTLLM}}};
}  // namespace
const char* to_string(Engine v) { return enum_name(v, kEngines); }
const char* to_string(Framework v) { return enum_name(v, kFrameworks); }
const char* to_string(CrossEntropy v) { return enum_name(v, kCrossEntropy); }
const char* to_string(LogitsLifetime v) { return enum_name(v, kLogits); }
const char* to_string(Kernels v) { return enum_name(v, kKernels); }
const char* to_string(Fp8Recipe v) { return enum_name(v, kFp8); }

const char* to_string(OptimizerImpl v) { return enum_name(v, kImpl); }
const char* to_string(ZeroGrad v) { return enum_name(v, kZeroGrad); }
const char* to_string(AllocatorKind v) { return enum_name(v, kAllocator); }
const char* to_string(LoadDtype v) { return enum_name(v, kLoadDtype); }
Result<AllocatorKind> parse_allocator(std::string_view s) { return parse_enum(s, kAllocator, "allocator"); }
Result<OptimizerImpl> parse_optimizer_impl(std::string_view s) { return parse_enum(s, kImpl, "optimizer-impl"); }
Result<ZeroGrad> parse_zero_grad(std::string_view s) { return parse_enum(s, kZeroGrad, "zero-grad"); }

const char* to_string(Mode v) { return enum_name(v, kModes); }
const char* to_string(Precision v) { return enum_name(v, kPrecisions); }
const char* to_string(Optimizer v) { return enum_name(v, kOptimizers); }
const char* to_string(Recompute v) { return enum_name(v, kRecompute); }
const char* to_string(Attention v) { return enum_name(v, kAttention); }
const char* to_string(Quant v) { return enum_name(v, kQuant); }

Result<Mode> parse_mode(std::string_view s) { return parse_enum(s, kModes, "mode"); }
Result<Precision> parse_precision(std::string_view s) { return parse_enum(s, kPrecisions, "precision"); }
Result<Optimizer> parse_optimizer(std::string_view s) { return parse_enum(s, kOptimizers, "optimizer"); }
Result<Recompute> parse_recompute(std::string_view s) { return parse_enum(s, kRecompute, "recompute"); }
Result<Attention> parse_attention(std::string_view s) { return parse_enum(s, kAttention, "attention"); }
Result<Quant> parse_quant(std::string_view s) { return parse_enum(s, kQuant, "quant"); }

Result<std::vector<std::int64_t>> parse_count_list(std::string_view s, std::string_view field) {
    std::vector<std::int64_t> out;
    std::string cur;
    auto bad = [&]() {
        return Error{ErrorCode::InvalidArgument,
                     "--" + std::string(field) + ": \"" + std::string(s) + "\" is not a comma-separated list of whole numbers (e.g. 7,8,8,7)",
                     std::string(field)};
    };
    for (std::size_t i = 0; i <= s.size(); ++i) {
        const char c = i < s.size() ? s[i] : ',';
        if (c == ' ') continue;
        if (c != ',') {
            cur.push_back(c);
            continue;
        }
        if (cur.empty()) return bad();
        std::int64_t v = 0;
        const auto [p, ec] = std::from_chars(cur.data(), cur.data() + cur.size(), v);
        if (ec != std::errc() || p != cur.data() + cur.size()) return bad();
        out.push_back(v);
        cur.clear();
    }
    if (out.empty()) return bad();
    return out;
}

Result<Bytes> parse_size(std::string_view in, std::string_view field) {
    std::string s;
    for (char c : in)
        if (!std::isspace(static_cast<unsigned char>(c))) s.push_back(c);
    auto bad = [&](const std::string& why) {
        return Error{ErrorCode::InvalidArgument,
                     "--" + std::string(field) + ": " + why + " (\"" + std::string(in) +
                         "\"); write a size such as 24GiB, 80GB or 512MiB",
                     std::string(field)};
    };
    if (s.empty()) return bad("empty size");
    std::size_t i = 0;
    while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.' || s[i] == '-' || s[i] == '+' ||
                            s[i] == 'e' || s[i] == 'E'))
        ++i;
    // "e" may belong to a unit? Units never start with e, so this is safe.
    double v = 0;
    try {
        std::size_t used = 0;
        v = std::stod(s.substr(0, i), &used);
        if (used != i) return bad("not a number");
    } catch (...) {
        return bad("not a number");
    }
    std::string unit;
    for (char c : s.substr(i)) unit.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
    double mult = 1;
    if (unit.empty() || unit == "b") mult = 1;
    else if (unit == "kib" || unit == "k") mult = 1024.0;
    else if (unit == "mib" || unit == "m") mult = 1024.0 * 1024;
    else if (unit == "gib" || unit == "g") mult = 1024.0 * 1024 * 1024;
    else if (unit == "tib" || unit == "t") mult = 1024.0 * 1024 * 1024 * 1024;
    else if (unit == "kb") mult = 1e3;
    else if (unit == "mb") mult = 1e6;
    else if (unit == "gb") mult = 1e9;
    else if (unit == "tb") mult = 1e12;
    else return bad("unknown unit \"" + unit + "\"");
    const double bytes = v * mult;
    if (!(bytes > 0)) return bad("size must be positive");
    if (bytes > 9.2e18) return bad("size too large");
    return Bytes(static_cast<std::int64_t>(std::llround(bytes)));
}

namespace {
// The job's own fields (not the time model's or another command's), for the
// request object an estimate carries.
bool job_group(const Field& f) {
    static const char* kGroups[] = {"model", "job", "precision", "savers", "framework", "layout", "gpu"};
    for (const char* g : kGroups)
        if (f.group == g) return true;
    return false;
}
}  // namespace

Result<EstimateRequest> request_from_json(const nlohmann::json& body) {
    auto r = parse_request(Command::Estimate, body);
    if (!r) return r.error();
    return std::move(r).value().job;
}

nlohmann::json request_to_json(const EstimateRequest& r) {
    // request_json's fields (not cli-only, not null, not an empty list with no
    // default), kept to the job's groups and the mode's fields.
    Request q;
    q.job = r;
    nlohmann::json j = nlohmann::json::object();
    for (const Field* f : fields_of(Command::Estimate)) {
        if (f->cli_only || f->name == "data" || !job_group(*f) || !(f->modes & mode_bit(r.mode))) continue;
        nlohmann::json v = f->get(q);
        if (v.is_null() || (v.is_array() && v.empty() && f->default_value.is_null())) continue;
        j[f->json_key()] = std::move(v);
    }
    return j;
}

std::string request_to_command(const EstimateRequest& r, std::string_view command) {
    Request q;
    q.job = r;
    const auto c = parse_command(command);
    return request_command(q, c ? c.value() : Command::Estimate);
}

}  // namespace gpumem
