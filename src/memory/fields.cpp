// The request field table (gpumem/memory/fields.hpp): one row per input, its
// conversions from JSON and command-line text, and the writers generated from
// it (request JSON, the reproducing command line, the table as JSON).
#include "gpumem/memory/fields.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <type_traits>

#include "gpumem/core/limits.hpp"
#include "gpumem/model/load.hpp"

namespace gpumem {

namespace {
using json = nlohmann::json;

constexpr std::uint32_t bit(Command c) { return 1u << static_cast<unsigned>(c); }
constexpr std::uint32_t kJob = bit(Command::Estimate) | bit(Command::Timeline) | bit(Command::Fit) | bit(Command::Advise) |
                               bit(Command::Plan) | bit(Command::Sweep) | bit(Command::Doctor) | bit(Command::Calibrate);
constexpr std::uint32_t kCalibrated = kJob & ~bit(Command::Calibrate);  // commands that take --calibration
constexpr std::uint32_t kServe = bit(Command::Serving);
constexpr std::uint32_t kModelCmds = kJob | bit(Command::Params) | bit(Command::CompatDeepSpeed) | kServe;
constexpr std::uint32_t kTime = bit(Command::Estimate) | bit(Command::Timeline) | bit(Command::Advise) | bit(Command::Plan);
constexpr std::uint32_t kEveryCommand = (1u << static_cast<unsigned>(Command::Count)) - 1;
constexpr std::uint8_t kTrainModes = mode_bit(Mode::Train) | mode_bit(Mode::Lora) | mode_bit(Mode::QLora);
constexpr std::uint8_t kLoraModes = mode_bit(Mode::Lora) | mode_bit(Mode::QLora);
constexpr std::uint8_t kInfer = mode_bit(Mode::Infer);

constexpr std::array<const char*, static_cast<std::size_t>(Command::Count)> kCommandNames{
    "estimate", "timeline", "fit", "advise", "plan", "sweep", "doctor", "params", "snapshot", "compat-deepspeed", "compat-megatron", "models", "gpus", "serving", "calibrate"};

// ---- enum traits: the names come from each enum's own to_string ------------
template <class E>
std::vector<std::string> enum_values() {
    std::vector<std::string> v;
    for (int i = 0; i < 64; ++i) {
        const std::string n = to_string(static_cast<E>(i));
        if (n == "?" || n.empty()) break;
        v.push_back(n);
    }
    return v;
}
template <class E>
E enum_from(const std::string& s) {
    for (int i = 0; i < 64; ++i)
        if (s == to_string(static_cast<E>(i))) return static_cast<E>(i);
    fail(ErrorCode::InvalidArgument, "", "unknown value \"" + s + "\"");
}
// KV-cache dtypes by their flag names.
constexpr std::array<std::pair<const char*, DType>, 5> kKvDtypes{
    {{"fp32", DType::F32}, {"fp16", DType::F16}, {"bf16", DType::BF16}, {"fp8", DType::F8_E4M3}, {"int8", DType::I8}}};

template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};
template <class T>
struct is_vector : std::false_type {};
template <class T>
struct is_vector<std::vector<T>> : std::true_type {};

// Canonical JSON <-> C++ value, by the C++ type of the request member.
template <class T>
json to_json_value(const T& v) {
    if constexpr (is_optional<T>::value) {
        return v ? to_json_value(*v) : json();
    } else if constexpr (is_vector<T>::value) {
        json a = json::array();
        for (const auto& x : v) a.push_back(to_json_value(x));
        return a;
    } else if constexpr (std::is_same_v<T, Bytes>) {
        return v.count();
    } else if constexpr (std::is_same_v<T, DType>) {
        for (const auto& [n, d] : kKvDtypes)
            if (d == v) return n;
        return std::string(dtype_name(v));
    } else if constexpr (std::is_enum_v<T>) {
        return std::string(to_string(v));
    } else {
        return v;
    }
}
template <class T>
void from_json_value(T& out, const json& j) {
    if constexpr (is_optional<T>::value) {
        if (j.is_null()) {
            out.reset();
        } else {
            typename T::value_type x{};
            from_json_value(x, j);
            out = std::move(x);
        }
    } else if constexpr (is_vector<T>::value) {
        out.clear();
        for (const auto& x : j) {
            typename T::value_type e{};
            from_json_value(e, x);
            out.push_back(std::move(e));
        }
    } else if constexpr (std::is_same_v<T, Bytes>) {
        out = Bytes(j.get<std::int64_t>());
    } else if constexpr (std::is_same_v<T, DType>) {
        const std::string s = j.get<std::string>();
        for (const auto& [n, d] : kKvDtypes)
            if (s == n) out = d;
    } else if constexpr (std::is_enum_v<T>) {
        out = enum_from<T>(j.get<std::string>());
    } else if constexpr (std::is_same_v<T, int>) {
        out = static_cast<int>(j.get<std::int64_t>());
    } else {
        out = j.get<T>();
    }
}
template <class T>
struct enum_of { using type = T; };
template <class T>
struct enum_of<std::optional<T>> { using type = T; };
template <class T>
struct enum_of<std::vector<T>> { using type = T; };

// A row under construction (a temporary: each modifier moves it on, so the
// table is built without copying a Field).
struct Row {
    Field f;
    Row&& unit(const char* u) && { f.unit = u; return std::move(*this); }
    Row&& modes(std::uint8_t m) && { f.modes = m; return std::move(*this); }
    Row&& min(double v) && { f.min = v; return std::move(*this); }
    Row&& max(double v) && { f.max = v; return std::move(*this); }
    // The documented limits (docs/limits.md): [lo, hi] and why hi is where it is.
    Row&& range(double lo, double hi, const char* why) && { f.min = lo; f.max = hi; f.limit = why; return std::move(*this); }
    Row&& items(std::int64_t n) && { f.max_items = n; return std::move(*this); }
    Row&& alias(const char* a) && { f.aliases.emplace_back(a); return std::move(*this); }
    Row&& computed(const char* text) && { f.default_text = text; return std::move(*this); }
    Row&& positional() && { f.positional = true; return std::move(*this); }
    Row&& required() && { f.required = true; return std::move(*this); }
    Row&& cli_only() && { f.cli_only = true; return std::move(*this); }
    Row&& values(std::vector<std::string> v) && { f.values = std::move(v); return std::move(*this); }
};

// Binds a row to a Request member through an accessor `T& (Request&)`.
template <class Acc>
Row row(const char* name, FieldType type, const char* group, std::uint32_t cmds, Acc acc, const char* help) {
    using T = std::remove_reference_t<decltype(acc(std::declval<Request&>()))>;
    Row r;
    r.f.name = name;
    r.f.type = type;
    r.f.group = group;
    r.f.commands = cmds;
    r.f.help = help;
    r.f.set = [acc](Request& q, const json& v) { from_json_value(acc(q), v); };
    r.f.get = [acc](const Request& q) { return to_json_value(acc(const_cast<Request&>(q))); };
    using E = typename enum_of<T>::type;
    if constexpr (std::is_same_v<E, DType>) {
        for (const auto& [n, d] : kKvDtypes) r.f.values.emplace_back(n);
    } else if constexpr (std::is_enum_v<E>) {
        r.f.values = enum_values<E>();
    }
    return r;
}
#define AT(member) [](Request& q) -> auto& { return q.member; }

using FT = FieldType;

std::vector<Field> build_table() {
    const std::vector<std::string> formats = {"text", "json", "csv", "markdown"};
    Row t[] = {
        // ---- model
        row("model", FT::String, "model", kModelCmds, AT(job.model), "preset name, Hugging Face id (local cache), config.json, model folder, layer-list JSON or gpumem model graph file").positional(),
        row("config", FT::Object, "model", bit(Command::Estimate) | bit(Command::Timeline), AT(other.config), "a Hugging Face config.json sent inline (JSON requests; the service reads no files)"),
        row("params", FT::Count, "model", kModelCmds, AT(job.params_count), "a parameter count only (model states, no activations), e.g. 7B").unit("parameters").range(1, kMaxParamCount, "10^15 parameters: the largest models have ~2 x 10^12"),
        // ---- job
        row("mode", FT::Enum, "job", kJob, AT(job.mode), "what runs: full training, LoRA, QLoRA, or inference"),
        row("batch", FT::Int, "job", kJob, AT(job.batch), "micro-batch size per GPU").unit("sequences").range(1, kMaxBatch, "2^20 sequences per GPU: real micro-batches are at most a few thousand"),
        row("seq", FT::Int, "job", kJob, AT(job.seq), "sequence length (the prompt for inference)").unit("tokens").computed("min(2048, the model's maximum positions)").range(1, kMaxSeqTokens, "2^24 tokens: the longest contexts in use are ~10^7 tokens"),
        row("grad-accum", FT::Int, "job", kJob, AT(job.grad_accum), "gradient accumulation steps (micro-batches per optimizer step)").modes(kTrainModes).unit("micro-batches").range(1, kMaxGradAccum, "2^20 micro-batches per step: real runs use at most a few thousand"),
        row("gen-len", FT::Int, "job", kJob, AT(job.gen_len), "generated tokens after the prompt").unit("tokens").modes(kInfer).range(0, kMaxSeqTokens, "2^24 tokens: the longest contexts in use are ~10^7 tokens"),
        row("lora-rank", FT::Int, "job", kJob, AT(job.lora_rank), "LoRA rank").modes(kLoraModes).range(1, 65536, "2^16: a rank above the hidden size adds nothing, and hidden sizes are below 2^15"),
        row("lora-targets", FT::StringList, "job", kJob, AT(job.lora_targets), "module names that get adapters, or all-linear").computed("PEFT's per-model defaults (q_proj,v_proj for Llama)").modes(kLoraModes).items(1024),
        row("lora-dropout", FT::Number, "job", kJob, AT(job.lora_dropout), "dropout on each adapter's input (PEFT lora_dropout): p > 0 keeps a dropped copy and a mask per adapter").min(0).max(1).computed("0 (PEFT's default)").modes(kLoraModes),
        row("decoder-seq", FT::Int, "job", kJob, AT(job.decoder_seq), "decoder tokens per sample of an encoder-decoder model (T5); --seq is the encoder's").unit("tokens").computed("--seq").modes(kTrainModes).range(1, kMaxSeqTokens, "2^24 tokens: the longest contexts in use are ~10^7 tokens"),
        // ---- precision
        row("precision", FT::Enum, "precision", kJob | kServe, AT(job.precision), "numeric precision: pure fp32/fp16/bf16 or torch.autocast mixed precision").computed("amp-bf16 for training, bf16 for inference"),
        row("optimizer", FT::Enum, "precision", kJob, AT(job.optimizer), "optimizer (its states per parameter)").modes(kTrainModes),
        row("optimizer-impl", FT::Enum, "precision", kJob, AT(job.optimizer_impl), "torch.optim implementation (its step temporaries)").computed("fused under --distributed-optimizer or --zero (Megatron, DeepSpeed), else foreach (torch.optim's default)").modes(kTrainModes),
        row("zero-grad", FT::Enum, "precision", kJob, AT(job.zero_grad), "optimizer.zero_grad: set-to-none frees gradients (PyTorch >= 2.0), zero keeps them (1.x)").modes(kTrainModes),
        row("optimizer-in-backward", FT::Bool, "precision", kJob, AT(job.optimizer_in_backward), "step each parameter and free its gradient in its post-accumulate-grad hook (torchtune optimizer_in_bwd); not with --grad-accum > 1").modes(kTrainModes),
        row("load-dtype", FT::Enum, "precision", kJob, AT(job.load_dtype), "dtype from_pretrained loads the checkpoint in on the GPU: weights (torch_dtype given) or fp32 (torch_dtype not given, then cast)"),
        row("quant", FT::Enum, "precision", kJob & ~bit(Command::Fit), AT(job.quant), "weight quantization of the linear layers").computed("nf4 for qlora, else none"),
        row("double-quant", FT::Bool, "precision", kJob, AT(job.double_quant), "bitsandbytes nf4/fp4: quantize the absmax constants again (bnb_4bit_use_double_quant; HF's default is off, the QLoRA recipe's on)"),
        row("quantize-head", FT::Bool, "precision", kJob, AT(job.quantize_head), "quantize lm_head too (LitGPT's bitsandbytes plugin converts every nn.Linear; HF skips it)"),
        row("bnb-4bit-saves-input", FT::Bool, "precision", kJob, AT(job.bnb_4bit_saves_input), "bitsandbytes < 0.43.2: the 4-bit matmul keeps its input for backward").modes(kLoraModes),
        row("kbit-upcast", FT::Bool, "precision", kJob, AT(job.kbit_upcast), "PEFT prepare_model_for_kbit_training: non-quantized parameters (embeddings, norms, output layer) in fp32, hence an fp32 residual stream and fp32 checkpoints").computed("the framework's (axolotl: on for --quant nf4/fp4/int8 without FSDP or ZeRO-3)").modes(kLoraModes),
        row("kv-dtype", FT::Enum, "precision", kJob | kServe, AT(job.kv_dtype), "KV-cache dtype").computed("the activation dtype").modes(kInfer),
        // ---- memory savers
        row("recompute", FT::Enum, "savers", kJob, AT(job.recompute), "activation recomputation (checkpointing)").modes(kTrainModes),
        row("attention", FT::Enum, "savers", kJob, AT(job.attention), "attention kernel: eager keeps the s x s scores, flash (SDPA) does not"),
        row("recompute-every", FT::Int, "savers", kJob, AT(job.recompute_every), "checkpoint every N-th layer only (torchtitan selective_ac_option N; HF: every layer)").computed("1 (every layer)").modes(kTrainModes).unit("layers").range(1, kMaxLayers, "100,000 layers: the deepest models in use have ~200"),
        row("recompute-method", FT::Enum, "savers", kJob, AT(job.recompute_method), "Megatron --recompute-method with --recompute full: uniform checkpoints the layers in chunks of --recompute-num-layers (a chunk rebuilt at once), block only the first --recompute-num-layers layers of each model chunk").computed("uniform").modes(kTrainModes),
        row("recompute-num-layers", FT::Int, "savers", kJob, AT(job.recompute_num_layers), "Megatron --recompute-num-layers: layers per checkpointed chunk (uniform) or checkpointed layers per model chunk (block)").computed("1").modes(kTrainModes).unit("layers").range(1, kMaxLayers, "100,000 layers: the deepest models in use have ~200"),
        row("activation-offload", FT::Bool, "savers", kJob, AT(job.activation_offload), "saved activations offloaded to CPU memory (torchtune enable_activation_offloading, Unsloth)").modes(kTrainModes),
        // ---- framework (memory/framework.hpp)
        row("framework", FT::Enum, "framework", kJob, AT(job.framework), "training framework whose loop, modeling code and precision policy the step follows (docs/frameworks.md)").computed("hf (Trainer / accelerate / TRL)"),
        row("loss", FT::Enum, "job", kJob, AT(job.loss), "loss appended to an ONNX model whose graph output is not a loss: out.sum(), out.mean(), cross-entropy over the last dim with int64 labels, or none (docs/onnx.md)").values({"sum", "mean", "cross-entropy", "none"}).computed("sum").modes(kTrainModes),
        row("cross-entropy", FT::Enum, "framework", kJob, AT(job.cross_entropy), "loss kernel: full fp32 cross-entropy, chunked, fused (no fp32 copy) or fused-linear (no logits)").computed("the framework's").modes(kTrainModes),
        row("logits", FT::Enum, "framework", kJob, AT(job.logits), "whether the loop still holds the logits during backward").computed("the framework's").modes(kTrainModes),
        row("kernels", FT::Enum, "framework", kJob, AT(job.kernels), "modeling code: Hugging Face eager modules, fused kernels (RMSNorm, SwiGLU, RoPE) or Transformer Engine layers").computed("the framework's"),
        row("compile", FT::Bool, "framework", kJob, AT(job.compile), "torch.compile (Inductor fuses pointwise ops and the loss: saves like fused kernels)").modes(kTrainModes),
        row("compile-loss", FT::Bool, "framework", kJob, AT(job.compile_loss), "with --compile: the loss is compiled too (one kernel that keeps the logits and a logsumexp, no fp32 log_softmax); torchtitan before 2025-04 compiled the blocks only").computed("the framework's (all but LitGPT)").modes(kTrainModes),
        row("fp8-recipe", FT::Enum, "framework", kJob, AT(job.fp8_recipe), "FP8 / FP4 training recipe: Transformer Engine delayed, current, mxfp8, nvfp4 (quantized saved inputs, cached weight copies) or torchao tensorwise, rowwise (16-bit saves); memory and time, implies --fp8").modes(kTrainModes),
        row("cuda-graphs", FT::Enum, "framework", kJob, AT(job.cuda_graphs), "CUDA graphs in training: compile = torch.compile(mode=\"reduce-overhead\") (implies --compile), megatron = Megatron-Core per-layer graphs (--cuda-graph-impl local); the graph pool's memory serves no eager allocation").modes(kTrainModes),
        // ---- serving engines (memory/serving.hpp)
        row("engine", FT::Enum, "serving", kServe | bit(Command::Fit), AT(serving.engine), "the serving engine whose start-up is predicted; fit: the longest context, the concurrency and (llama.cpp) the offloaded layers that fit that engine").computed("vllm"),
        row("gpu-memory-utilization", FT::Number, "serving", kServe | bit(Command::Fit), AT(serving.gpu_memory_utilization), "vLLM --gpu-memory-utilization: the fraction of the GPU's memory the engine budgets").min(0).max(1).computed("0.9 (vLLM's default)"),
        row("max-model-len", FT::Int, "serving", kServe | bit(Command::Fit), AT(serving.max_model_len), "tokens per request (vLLM --max-model-len, SGLang --context-length; llama.cpp: -c / -np)").unit("tokens").computed("the model's maximum positions").range(1, kMaxSeqTokens, "2^24 tokens: the longest contexts in use are ~10^7 tokens"),
        row("max-num-seqs", FT::Int, "serving", kServe | bit(Command::Fit), AT(serving.max_num_seqs), "requests per step (vLLM --max-num-seqs; llama.cpp -np: slots)").computed("vLLM's: 1024 on GPUs of 70 GiB or more other than the A100, else 256").unit("sequences").range(1, kMaxBatch, "2^20 sequences: real batches are at most a few thousand"),
        row("max-num-batched-tokens", FT::Int, "serving", kServe | bit(Command::Fit), AT(serving.max_num_batched_tokens), "tokens per step, the profile run's size (vLLM --max-num-batched-tokens; llama.cpp -b)").unit("tokens").computed("vLLM's: 8192 on GPUs of 70 GiB or more other than the A100, else 2048").range(1, 1 << 30, "2^30 tokens per step: 64 sequences of the longest context"),
        row("block-size", FT::Int, "serving", kServe | bit(Command::Fit), AT(serving.block_size), "tokens per KV-cache block (vLLM --block-size)").computed("16").unit("tokens").range(1, 65536, "2^16 tokens per block: engines use 16 to 256"),
        row("kv-cache-memory", FT::Size, "serving", kServe | bit(Command::Fit), AT(serving.kv_cache_memory), "vLLM --kv-cache-memory: the KV budget itself (gpu-memory-utilization is then ignored)").unit("bytes").range(1, kMaxInputBytes, "1 PiB: GPUs have less than 300 GB"),
        row("enforce-eager", FT::Bool, "serving", kServe | bit(Command::Fit), AT(serving.enforce_eager), "vLLM --enforce-eager: no CUDA graphs"),
        row("cpu-offload-gb", FT::Number, "serving", kServe | bit(Command::Fit), AT(serving.cpu_offload_gb), "vLLM --cpu-offload-gb: GiB of each GPU's weights kept in pinned host memory and read over the bus each step").computed("0 (vLLM's default)").unit("GiB").range(0, 1 << 20, "2^20 GiB (1 PiB): hosts have at most a few TiB"),
        row("data-parallel-size", FT::Int, "serving", kServe | bit(Command::Fit), AT(serving.data_parallel_size), "vLLM --data-parallel-size: engine replicas, each with its own KV cache (per-GPU memory changes only with --enable-expert-parallel)").computed("1").unit("replicas").range(1, kMaxGpus, "2^20 GPUs: the largest clusters have ~10^5"),
        row("enable-expert-parallel", FT::Bool, "serving", kServe | bit(Command::Fit), AT(serving.enable_expert_parallel), "vLLM --enable-expert-parallel: the routed experts spread whole over the tp x dp ranks instead of split by tp"),
        row("enable-prefix-caching", FT::Bool, "serving", kServe | bit(Command::Fit), AT(serving.enable_prefix_caching), "vLLM --enable-prefix-caching: with linear-attention layers (Qwen3-Next) two state pages per request instead of one (prefix caching is off by default for such models)"),
        row("mem-fraction-static", FT::Number, "serving", kServe | bit(Command::Fit), AT(serving.mem_fraction_static), "SGLang --mem-fraction-static: the fraction of the free memory before loading kept for weights and the KV pool").min(0).max(1).computed("SGLang's rule by GPU memory and tp x pp"),
        row("cuda-memory-fraction", FT::Number, "serving", kServe | bit(Command::Fit), AT(serving.cuda_memory_fraction), "TGI --cuda-memory-fraction: the share of the GPU the shard may use").min(0).max(1).computed("1.0 (TGI's default)"),
        row("free-gpu-memory-fraction", FT::Number, "serving", kServe | bit(Command::Fit), AT(serving.free_gpu_memory_fraction), "TensorRT-LLM kv_cache_free_gpu_memory_fraction: the share of the memory free after profiling given to the KV cache").min(0).max(1).computed("0.9 (TensorRT-LLM's default)"),
        row("max-total-tokens", FT::Int, "serving", kServe | bit(Command::Fit), AT(serving.max_total_tokens), "SGLang --max-total-tokens and TensorRT-LLM max_tokens: cap the KV pool; TGI --max-total-tokens: tokens per request").unit("tokens").range(1, std::int64_t(1) << 40, "2^40 tokens: no GPU memory holds a KV pool that large"),
        row("engine-version", FT::String, "serving", kServe | bit(Command::Fit), AT(serving.engine_version), "the engine version whose defaults and rules apply (vLLM 0.19 (V1) or the V0 engine of 0.6.4-0.10; SGLang 0.5.6 or 0.4.6; llama.cpp 2026-04 or 2025-06; TGI 3.3, 3.1, 3.0 or 2.2; TensorRT-LLM 1.2)").computed("vLLM 0.19, SGLang 0.5.6, llama.cpp 2026-04, TGI 3.3, TensorRT-LLM 1.2"),
        row("request-len", FT::Int, "serving", kServe | bit(Command::Fit), AT(serving.request_len), "tokens per request (prompt and output) the concurrency and throughput are given for").unit("tokens").computed("max-model-len").range(1, kMaxSeqTokens, "2^24 tokens: the longest contexts in use are ~10^7 tokens"),
        row("output-len", FT::Int, "serving", kServe | bit(Command::Fit), AT(serving.output_len), "generated tokens per request, for the throughput").unit("tokens").computed("min(256, request-len / 2)").range(0, kMaxSeqTokens, "2^24 tokens: the longest contexts in use are ~10^7 tokens"),
        row("quant", FT::String, "serving", kServe | bit(Command::Fit), AT(serving.quant), "llama.cpp: the GGUF file type of the weights when no .gguf file is at hand (every type llama-quantize makes: F16, BF16, Q8_0, Q6_K, Q5_K_M, Q4_K_M, Q4_0, Q3_K_M, Q2_K, IQ4_XS, IQ3_M, IQ2_XXS, IQ1_S, TQ1_0, MXFP4_MOE, ...); vLLM, SGLang: fp8 (online FP8, --quantization fp8; quantized checkpoints are read from their config.json); fit without --engine: the training job's weight quantization (none, int8, int4, nf4, fp4)").computed("the .gguf file's own tensor types; fit: nf4 for qlora, else none"),
        row("n-gpu-layers", FT::Int, "serving", kServe | bit(Command::Fit), AT(serving.n_gpu_layers), "llama.cpp -ngl: layers offloaded to the GPUs (the output layer counts as one)").computed("all").unit("layers").range(0, kMaxLayers, "100,000 layers: the deepest models in use have ~200"),
        row("ctx-size", FT::Int, "serving", kServe | bit(Command::Fit), AT(serving.ctx_size), "llama.cpp -c: KV-cache cells over all slots (0: the model's training context)").unit("tokens").computed("0 (llama.cpp's default: the training context)").range(0, 1 << 30, "2^30 cells: 64 slots of the longest context"),
        row("ubatch-size", FT::Int, "serving", kServe | bit(Command::Fit), AT(serving.ubatch_size), "llama.cpp -ub: the physical batch the compute buffers are sized for").unit("tokens").computed("512").range(1, kMaxSeqTokens, "2^24 tokens: the longest contexts in use are ~10^7 tokens"),
        row("flash-attn", FT::String, "serving", kServe | bit(Command::Fit), AT(serving.flash_attn), "llama.cpp -fa on|off|auto").computed("auto (on: CUDA and the CPU have the kernel)"),
        row("cache-type-k", FT::String, "serving", kServe | bit(Command::Fit), AT(serving.cache_type_k), "llama.cpp -ctk: K-cache type (f16, bf16, f32, q8_0, q5_1, q5_0, q4_1, q4_0, iq4_nl)").computed("f16"),
        row("cache-type-v", FT::String, "serving", kServe | bit(Command::Fit), AT(serving.cache_type_v), "llama.cpp -ctv: V-cache type (quantized types need flash attention)").computed("f16"),
        row("tensor-split", FT::String, "serving", kServe | bit(Command::Fit), AT(serving.tensor_split), "llama.cpp -ts: GPUs and their shares of the layers, e.g. 3,1").computed("one GPU"),
        row("split-mode", FT::String, "serving", kServe | bit(Command::Fit), AT(serving.split_mode), "llama.cpp -sm none|layer").computed("layer"),
        row("no-mmap", FT::Bool, "serving", kServe | bit(Command::Fit), AT(serving.no_mmap), "llama.cpp --no-mmap: weights left on the CPU are read into RAM, not mapped"),
        row("no-kv-offload", FT::Bool, "serving", kServe | bit(Command::Fit), AT(serving.no_kv_offload), "llama.cpp -nkvo: the KV cache stays in host RAM"),
        row("swa-full", FT::Bool, "serving", kServe | bit(Command::Fit), AT(serving.swa_full), "llama.cpp --swa-full: sliding-window layers cache the whole context"),
        row("kv-unified", FT::Bool, "serving", kServe | bit(Command::Fit), AT(serving.kv_unified), "llama.cpp -kvu: one KV stream shared by all slots").computed("llama-server: on when -np is not given"),
        row("command", FT::StringList, "serving", kServe | bit(Command::Fit), AT(serving.command), "the engine's own command line, after -- on the CLI (e.g. -- vllm serve MODEL --max-model-len 32768; llama-server, text-generation-launcher, trtllm-serve, python -m sglang.launch_server, or docker run with the engine's image)").items(4096),
        // ---- layout
        row("gpus", FT::Int, "layout", kJob, AT(job.parallel.gpus), "GPUs in the job (data parallel = gpus / (tp x pp x cp))").unit("GPUs").range(1, kMaxGpus, "2^20 GPUs: the largest clusters have ~10^5"),
        row("nodes", FT::Int, "layout", kJob | bit(Command::CompatDeepSpeed), AT(job.parallel.nodes), "nodes").computed("gpus / GPUs per node").unit("nodes").range(1, kMaxGpus, "2^20 GPUs: the largest clusters have ~10^5"),
        row("gpus-per-node", FT::Int, "layout", kJob | bit(Command::CompatDeepSpeed), AT(job.parallel.gpus_per_node), "GPUs per node").computed("the GPU's board: 8 for HGX/DGX, 72 for GB200 NVL72").unit("GPUs").range(1, 65536, "2^16: the largest NVLink domains have 576 GPUs"),
        row("tp", FT::Int, "layout", kJob | kServe, AT(job.parallel.tp), "tensor-parallel size").unit("GPUs").range(1, kMaxGpus, "2^20: no more than the GPUs"),
        row("pp", FT::Int, "layout", kJob | kServe, AT(job.parallel.pp), "pipeline-parallel size").unit("stages").range(1, kMaxGpus, "2^20: no more than the GPUs"),
        row("cp", FT::Int, "layout", kJob, AT(job.parallel.cp), "context-parallel size").unit("GPUs").range(1, kMaxGpus, "2^20: no more than the GPUs"),
        row("ep", FT::Int, "layout", kJob, AT(job.parallel.ep), "expert-parallel size (MoE)").unit("GPUs").range(1, kMaxGpus, "2^20: no more than the GPUs"),
        row("sp", FT::Bool, "layout", kJob, AT(job.parallel.sp), "sequence parallelism (with --tp)"),
        row("pp-schedule", FT::Enum, "layout", kJob, AT(job.parallel.schedule), "pipeline schedule"),
        row("vpp", FT::Int, "layout", kJob, AT(job.parallel.vpp), "virtual pipeline stages per rank (interleaved schedule)").unit("stages").range(1, kMaxLayers, "100,000: at most one virtual stage per layer"),
        row("pp-layers", FT::IntList, "layout", kJob, AT(job.parallel.pp_layers), "transformer layers of every virtual pipeline stage in model order, e.g. 7,8,8,7").unit("layers").range(0, kMaxLayers, "100,000 layers: the deepest models in use have ~200").items(kMaxGpus),
        row("pp-first-layers", FT::Int, "layout", kJob, AT(job.parallel.pp_first_layers), "layers of the first pipeline rank, the rest split evenly (Megatron --decoder-first-pipeline-num-layers)").unit("layers").range(0, kMaxLayers, "100,000 layers: the deepest models in use have ~200"),
        row("pp-last-layers", FT::Int, "layout", kJob, AT(job.parallel.pp_last_layers), "layers of the last pipeline rank (Megatron --decoder-last-pipeline-num-layers)").unit("layers").range(0, kMaxLayers, "100,000 layers: the deepest models in use have ~200"),
        row("pp-embedding-layer", FT::Bool, "layout", kJob, AT(job.parallel.pp_embedding_layer), "count the embedding as one layer of the split (Megatron --account-for-embedding-in-pipeline-split)"),
        row("pp-loss-layer", FT::Bool, "layout", kJob, AT(job.parallel.pp_loss_layer), "count the output layer and loss as one layer of the split (Megatron --account-for-loss-in-pipeline-split)"),
        row("zero", FT::Int, "layout", kJob, AT(job.parallel.zero), "DeepSpeed ZeRO stage").min(0).max(3).modes(kTrainModes),
        row("fsdp", FT::Enum, "layout", kJob, AT(job.parallel.fsdp), "PyTorch FSDP sharding").modes(kTrainModes),
        row("fsdp-version", FT::Int, "layout", kJob, AT(job.parallel.fsdp_version), "FSDP API: 1 (FullyShardedDataParallel, flat parameters: LoRA gets gradients for its layers' frozen weights too) or 2 (fully_shard)").min(1).max(2).modes(kTrainModes),
        row("no-sync", FT::Bool, "layout", kJob, AT(job.parallel.no_sync), "FSDP gradient accumulation without reduce-scatter between micro-batches (no_sync / set_requires_gradient_sync(False)): full gradients kept").modes(kTrainModes),
        row("distributed-optimizer", FT::Bool, "layout", kJob, AT(job.parallel.distributed_optimizer), "Megatron's distributed optimizer").modes(kTrainModes),
        row("offload-optimizer", FT::Enum, "layout", kJob, AT(job.parallel.offload_optimizer), "optimizer states offloaded (DeepSpeed ZeRO-Offload / Infinity)").modes(kTrainModes),
        row("offload-params", FT::Enum, "layout", kJob, AT(job.parallel.offload_params), "parameters offloaded (ZeRO-3 Infinity)").modes(kTrainModes),
        row("capacity-factor", FT::Number, "layout", kJob, AT(job.parallel.capacity_factor), "MoE token capacity factor").range(0, 65536, "2^16: real factors are 1 to 2; a factor of the expert count already routes every token to every expert"),
        // ---- GPU and allocator
        row("gpu", FT::String, "gpu", kJob | kServe, AT(job.gpu), "GPU from the catalog (gpumem gpus)"),
        row("gpu-memory", FT::Size, "gpu", kJob | kServe, AT(job.gpu_memory), "the GPU's capacity, overriding the catalog, e.g. 24GiB").unit("bytes").range(1, kMaxInputBytes, "1 PiB: GPUs have less than 300 GB"),
        row("cuda-context", FT::Size, "gpu", kJob | kServe, AT(job.cuda_context), "the CUDA context (nvidia-smi minus reserved), e.g. 1343MiB").unit("bytes").computed("by GPU and module loading (docs/assumptions.md)").range(1, kMaxInputBytes, "1 PiB: GPUs have less than 300 GB"),
        row("cuda-lazy-loading", FT::Bool, "gpu", kJob, AT(job.cuda_lazy_loading), "CUDA lazy module loading (default since CUDA 11.7 + PyTorch 1.13)"),
        row("allocator", FT::Enum, "gpu", kJob, AT(job.allocator), "pytorch: the caching allocator; none: live tensor bytes only, as the CPU profiler sees them"),
        row("alloc-conf", FT::String, "gpu", kJob | bit(Command::Snapshot), AT(job.alloc_conf), "PYTORCH_CUDA_ALLOC_CONF, e.g. expandable_segments:True (snapshot: replay with these settings)"),
        row("cublas-workspace", FT::Size, "gpu", kJob, AT(job.cublas_workspace), "one cuBLAS workspace").unit("bytes").computed("8.125 MiB, 32 MiB on Hopper and newer").range(0, kMaxInputBytes, "1 PiB: GPUs have less than 300 GB"),
        row("analytic", FT::Bool, "gpu", kJob, AT(job.analytic), "skip the step simulation (analytic peaks only; faster)"),
        // ---- calibration (memory/calibration.hpp, docs/calibration.md)
        row("calibration", FT::Path, "calibration", kCalibrated, AT(other.calibration), "a calibration written by gpumem calibrate (JSON requests: the document itself): its fitted terms are added and the range comes from its residual"),
        row("measured-allocated", FT::Size, "calibration", bit(Command::Calibrate), AT(other.measured_allocated), "calibrate: the job's torch.cuda.max_memory_allocated()").unit("bytes").range(1, kMaxInputBytes, "1 PiB: GPUs have less than 300 GB"),
        row("measured-reserved", FT::Size, "calibration", bit(Command::Calibrate), AT(other.measured_reserved), "calibrate: the job's torch.cuda.max_memory_reserved()").unit("bytes").range(1, kMaxInputBytes, "1 PiB: GPUs have less than 300 GB"),
        row("measured-total", FT::Size, "calibration", bit(Command::Calibrate), AT(other.measured_total), "calibrate: the job's GPU memory in nvidia-smi (memory.used of its process)").unit("bytes").range(1, kMaxInputBytes, "1 PiB: GPUs have less than 300 GB"),
        row("snapshot", FT::Path, "calibration", bit(Command::Calibrate), AT(other.file), "calibrate: a torch.cuda.memory._dump_snapshot() file of the job; its replay gives the peak allocated and reserved"),
        // ---- time
        row("mfu", FT::Number, "time", kTime, AT(compute.mfu), "end-to-end model FLOPs utilisation: step = 6ND / (GPUs x peak x MFU)").min(0).max(1).computed("predicted (docs/compute.md)"),
        row("achieved-tflops", FT::Number, "time", kTime, AT(compute.achieved_tflops), "end-to-end model TFLOP/s per GPU").unit("TFLOP/s").computed("predicted").range(0, 1e6, "10^6 TFLOP/s per GPU: the fastest GPUs reach ~10^4"),
        row("gemm-efficiency", FT::Number, "time", kTime, AT(compute.gemm_efficiency), "compute-only GEMM efficiency, fraction of the peak").min(0).max(1).computed("calibrated per GPU (docs/compute.md)"),
        row("attention-efficiency", FT::Number, "time", kTime, AT(compute.attention_efficiency), "fused-attention kernel efficiency, fraction of the peak").min(0).max(1).computed("calibrated per GPU"),
        row("fp8-efficiency", FT::Number, "time", kTime, AT(compute.fp8_efficiency), "FP8 GEMM efficiency, fraction of the FP8 peak").min(0).max(1).computed("calibrated per GPU"),
        row("fp8", FT::Bool, "time", kTime, AT(compute.fp8), "linear layers run FP8 GEMMs (TransformerEngine, torchao float8): time only"),
        row("tp-comm-overlap", FT::Bool, "time", kTime, AT(compute.tp_comm_overlap), "tensor-parallel collectives overlapped with GEMMs (Megatron --tp-comm-overlap)"),
        row("dp-comm-overlap", FT::Bool, "time", kTime, AT(compute.dp_comm_overlap), "data-parallel reduction overlapped with the backward (DDP/FSDP default)"),
        row("tf32", FT::Bool, "time", kTime, AT(compute.tf32), "fp32 matmuls on TF32 tensor cores"),
        row("tokens", FT::Number, "time", kTime, AT(compute.tokens), "training token budget: total time and GPU-hours").unit("tokens").range(0, 1e18, "10^18 tokens: the largest training runs use ~10^14"),
        row("price-per-gpu-hour", FT::Number, "time", kTime, AT(compute.price_per_gpu_hour), "price of one GPU-hour (cost of --tokens)").unit("per GPU-hour").range(0, 1e6, "10^6 per GPU-hour: far above any price"),
        row("nvlink-gbs", FT::Number, "time", kTime, AT(compute.nvlink_gbs), "intra-node bandwidth per GPU").unit("GB/s").computed("by GPU").range(0, 1e6, "10^6 GB/s: links today carry less than 2,000 GB/s"),
        row("ib-gbs", FT::Number, "time", kTime, AT(compute.ib_gbs), "inter-node bandwidth per GPU").unit("GB/s").computed("by GPU").range(0, 1e6, "10^6 GB/s: links today carry less than 2,000 GB/s"),
        // ---- plan
        row("global-batch", FT::Int, "plan", bit(Command::Plan), AT(plan.global_batch), "sequences per optimizer step").unit("sequences").computed("4 per GPU").range(0, 1 << 30, "2^30 sequences per step: real runs use at most ~10^5"),
        row("headroom", FT::Percent, "plan", bit(Command::Plan), AT(plan.headroom), "GPU memory kept free, e.g. 5%").min(0).max(0.99),
        row("top", FT::Int, "plan", bit(Command::Plan), AT(plan.top), "layouts to list").unit("layouts").range(1, 10000, "10,000 layouts: a search finds at most a few thousand"),
        row("only-tp", FT::IntList, "plan", bit(Command::Plan), AT(plan.tp), "search only these tensor-parallel sizes (may exceed a node), e.g. 1,2,4").unit("GPUs").range(1, kMaxGpus, "2^20: no more than the GPUs").items(64),
        row("only-pp", FT::IntList, "plan", bit(Command::Plan), AT(plan.pp), "search only these pipeline sizes").unit("stages").range(1, kMaxGpus, "2^20: no more than the GPUs").items(64),
        row("only-cp", FT::IntList, "plan", bit(Command::Plan), AT(plan.cp), "search only these context-parallel sizes").unit("GPUs").range(1, kMaxGpus, "2^20: no more than the GPUs").items(64),
        row("only-ep", FT::IntList, "plan", bit(Command::Plan), AT(plan.ep), "search only these expert-parallel sizes (MoE)").unit("GPUs").range(1, kMaxGpus, "2^20: no more than the GPUs").items(64),
        row("only-zero", FT::IntList, "plan", bit(Command::Plan), AT(plan.zero), "search only these ZeRO stages, e.g. 1,3").range(0, 3, "3: the ZeRO stages are 0 to 3").items(4),
        row("only-recompute", FT::EnumList, "plan", bit(Command::Plan), AT(plan.recompute), "search only these recompute settings").items(64),
        row("only-precision", FT::EnumList, "plan", bit(Command::Plan), AT(plan.precision), "search these precisions (default: the job's only)").items(64),
        row("only-optimizer", FT::EnumList, "plan", bit(Command::Plan), AT(plan.optimizer), "search these optimizers (default: the job's only)").items(64),
        row("search-precision", FT::Bool, "plan", bit(Command::Plan), AT(plan.search_precision), "also try amp-bf16 and pure bf16 beside the job's precision"),
        row("search-optimizer", FT::Bool, "plan", bit(Command::Plan), AT(plan.search_optimizer), "also try 8-bit AdamW and Adafactor beside the job's optimizer"),
        row("offload", FT::Bool, "plan", bit(Command::Plan), AT(plan.allow_offload), "consider optimizer offload when nothing else fits"),
        row("threads", FT::Int, "plan", bit(Command::Plan), AT(plan.threads), "threads for the confirming simulations (0: all cores)").unit("threads").range(0, kMaxThreads, "1024 threads: machines have at most a few hundred cores"),
        // ---- sweep
        row("batches", FT::IntList, "sweep", bit(Command::Sweep), AT(sweep.batches), "micro-batch sizes to sweep, e.g. 1,2,4,8").alias("batch-list").computed("the job's --batch").unit("sequences").range(1, kMaxBatch, "2^20 sequences per GPU: real micro-batches are at most a few thousand").items(1024),
        row("seqs", FT::IntList, "sweep", bit(Command::Sweep), AT(sweep.seqs), "sequence lengths to sweep, e.g. 512,1024,2048").alias("seq-list").computed("the job's --seq").unit("tokens").range(1, kMaxSeqTokens, "2^24 tokens: the longest contexts in use are ~10^7 tokens").items(1024),
        // ---- doctor, snapshot, compat
        row("message", FT::String, "input", bit(Command::Doctor), AT(other.message), "the 'CUDA out of memory ...' text (- reads standard input)").positional().required(),
        row("file", FT::Path, "input", bit(Command::Snapshot) | bit(Command::CompatMegatron), AT(other.file), "snapshot: torch.cuda.memory._dump_snapshot() pickle or JSON; compat megatron: JSON of Megatron arguments").positional().alias("path"),
        row("data", FT::String, "input", bit(Command::Snapshot) | bit(Command::Calibrate), AT(other.data), "the snapshot file's bytes (uploads; instead of a file)"),
        row("device", FT::Int, "input", bit(Command::Snapshot) | bit(Command::Calibrate), AT(other.device), "device index").computed("the first with a trace").range(0, 1 << 20, "2^20 device indices: far above any machine"),
        row("replay", FT::Bool, "input", bit(Command::Snapshot), AT(other.replay), "replay the trace through the allocator model (--no-replay: summary only)"),
        row("stage", FT::Int, "input", bit(Command::CompatDeepSpeed), AT(other.stage), "ZeRO stage of DeepSpeed's estimator").min(2).max(3),
        row("largest-layer-params", FT::Count, "input", bit(Command::CompatDeepSpeed), AT(other.largest_layer_params), "parameters of the largest layer (stage 3 with --params)").unit("parameters").range(1, kMaxParamCount, "10^15 parameters: the largest models have ~2 x 10^12"),
        row("buffer-factor", FT::Number, "input", bit(Command::CompatDeepSpeed), AT(other.buffer_factor), "DeepSpeed's additional_buffer_factor").range(0, 1024, "1024: DeepSpeed's default is 1.5"),
        // ---- output (command line)
        row("format", FT::Enum, "output", kEveryCommand, AT(other.format), "output format").values(formats).cli_only(),
        row("timeline", FT::Path, "output", bit(Command::Estimate), AT(other.timeline), "write the simulated memory timeline to FILE (.csv, .json or .svg)").cli_only(),
        row("plot", FT::Path, "output", bit(Command::Sweep), AT(other.plot), "write an SVG plot of the sweep to FILE").cli_only(),
        row("out", FT::Path, "output", bit(Command::Calibrate), AT(other.out), "write the calibration document to FILE (what --calibration reads; the same as --format json)").cli_only(),
    };
    std::vector<Field> out;
    out.reserve(std::size(t));
    const Request def;
    for (auto& r : t) {
        r.f.key = r.f.name;
        std::replace(r.f.key.begin(), r.f.key.end(), '-', '_');
        r.f.default_value = r.f.get(def);
        if (r.f.default_value.is_array() && r.f.default_value.empty()) r.f.default_value = json();
        out.push_back(std::move(r.f));
    }
    return out;
}
#undef AT

std::string dashed(std::string_view s) {
    std::string k;
    for (char c : s) k.push_back(c == '_' ? '-' : static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
    return k;
}

std::string trim(std::string s) {
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
    std::size_t i = 0;
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
    return s.substr(i);
}

std::vector<std::string> split_list(const std::string& s) {
    std::vector<std::string> out;
    std::string cur;
    for (char c : s + ",") {
        if (c == ',') {
            cur = trim(cur);
            if (!cur.empty()) out.push_back(cur);
            cur.clear();
        } else {
            cur.push_back(c);
        }
    }
    return out;
}

[[noreturn]] void bad(const Field& f, const std::string& why) { fail(ErrorCode::InvalidArgument, f.name, f.flag() + ": " + why); }

std::string shown(const json& raw) { return raw.is_string() ? "\"" + raw.get<std::string>() + "\"" : raw.dump(); }

// A value as the user wrote it, unquoted (the same for "0" and 0).
std::string plain(const json& raw) { return raw.is_string() ? raw.get<std::string>() : raw.dump(); }

// A bound as the user writes it: 1048576, 1024TiB, 0.99.
std::string bound_text(const Field& f, double v) {
    if (f.type == FT::Size) {
        const auto b = static_cast<std::int64_t>(v);
        for (const auto& [u, n] : {std::pair<const char*, std::int64_t>{"TiB", std::int64_t(1) << 40},
                                   {"GiB", std::int64_t(1) << 30}, {"MiB", std::int64_t(1) << 20}, {"KiB", std::int64_t(1) << 10}})
            if (b >= n && b % n == 0) return std::to_string(b / n) + u;
        return std::to_string(b) + "B";
    }
    if (std::floor(v) == v && std::fabs(v) < 1e18) return std::to_string(static_cast<std::int64_t>(v));
    char buf[64];
    std::snprintf(buf, sizeof buf, "%g", v);
    return buf;
}

// "from 1 to 1048576 (limit: why)": the allowed range, as the fix.
std::string range_text(const Field& f) {
    std::string t;
    if (f.min && f.max) t = "from " + bound_text(f, *f.min) + " to " + bound_text(f, *f.max);
    else if (f.min) t = "of at least " + bound_text(f, *f.min);
    else if (f.max) t = "of at most " + bound_text(f, *f.max);
    if (!f.limit.empty()) t += " (limit " + std::string(f.limit) + ")";
    return t;
}

// The range is checked on the value as a real number, before any cast.
void check_range(const Field& f, double v, const json& raw) {
    const char* kind = f.type == FT::Size ? "a size " : f.type == FT::Int || f.type == FT::IntList || f.type == FT::Count ? "a whole number " : "a value ";
    if (f.min && v < *f.min) bad(f, "must be at least " + bound_text(f, *f.min) + " (got " + plain(raw) + "); give " + kind + range_text(f));
    if (f.max && v > *f.max) bad(f, "must be at most " + bound_text(f, *f.max) + " (got " + plain(raw) + "); give " + kind + range_text(f));
}

// A whole number from JSON or text. The range is checked on the value as
// read (a JSON number or the text's number, as a double) before it becomes
// an integer, so that 1e30 or 2^32 + 3 is refused rather than cast.
std::int64_t int_value(const Field& f, const json& raw, bool ranged = true) {
    const auto not_whole = [&]() {
        bad(f, "must be a whole number (got " + plain(raw) + ")" + (f.min || f.max ? "; give a whole number " + range_text(f) : std::string()));
    };
    double d = 0;
    if (raw.is_number_unsigned()) {
        const auto u = raw.get<std::uint64_t>();
        if (ranged) check_range(f, static_cast<double>(u), raw);
        if (u > static_cast<std::uint64_t>(INT64_MAX)) bad(f, "too large (got " + raw.dump() + ")");
        return static_cast<std::int64_t>(u);
    }
    if (raw.is_number_integer()) {
        const auto v = raw.get<std::int64_t>();
        if (ranged) check_range(f, static_cast<double>(v), raw);
        return v;
    }
    if (raw.is_number_float()) {
        d = raw.get<double>();
    } else if (raw.is_string()) {
        const std::string s = trim(raw.get<std::string>());
        if (s.empty()) bad(f, "needs a whole number" + (f.min || f.max ? " " + range_text(f) : std::string()));
        std::int64_t v = 0;
        const char* b = s.data() + (s[0] == '+' ? 1 : 0);
        const auto [p, ec] = std::from_chars(b, s.data() + s.size(), v);
        if (ec == std::errc() && p == s.data() + s.size()) {
            if (ranged) check_range(f, static_cast<double>(v), raw);
            return v;
        }
        // Not a plain integer: 1e9, 2.5, 99999999999999999999 or junk.
        char* end = nullptr;
        d = std::strtod(s.c_str(), &end);
        if (end != s.c_str() + s.size()) bad(f, shown(raw) + " is not a whole number" + (f.min || f.max ? "; give a whole number " + range_text(f) : std::string()));
    } else {
        bad(f, "must be a whole number (got " + raw.dump() + ")");
    }
    if (!std::isfinite(d)) bad(f, "must be a finite whole number (got " + plain(raw) + ")");
    if (ranged) check_range(f, d, raw);
    if (std::floor(d) != d) not_whole();
    if (std::fabs(d) >= 9.2e18) bad(f, "too large (got " + plain(raw) + ")");
    return static_cast<std::int64_t>(d);
}

double number_value(const Field& f, const json& raw, bool ranged = true) {
    double v = 0;
    if (raw.is_number()) {
        v = raw.get<double>();
    } else if (raw.is_string()) {
        const std::string s = trim(raw.get<std::string>());
        char* end = nullptr;
        v = std::strtod(s.c_str(), &end);
        if (s.empty() || end != s.c_str() + s.size()) bad(f, shown(raw) + " is not a number");
    } else {
        bad(f, "must be a number (got " + raw.dump() + ")");
    }
    if (!std::isfinite(v)) bad(f, "must be a finite number (got " + shown(raw) + ")");
    if (ranged) check_range(f, v, raw);
    return v;
}

void check_items(const Field& f, std::size_t n) {
    if (f.max_items && static_cast<std::int64_t>(n) > *f.max_items)
        bad(f, "has " + std::to_string(n) + " entries; give at most " + std::to_string(*f.max_items));
}

std::string enum_value(const Field& f, const std::string& s) {
    const std::string low = dashed(trim(s));
    for (const auto& v : f.values)
        if (low == v || dashed(v) == low) return v;
    std::string list;
    for (const auto& v : f.values) list += (list.empty() ? "" : "|") + v;
    bad(f, "unknown value \"" + s + "\"" + did_you_mean(s, f.values) + " (use one of " + list + ")");
}

std::vector<std::string> string_list(const Field& f, const json& raw) {
    if (raw.is_string()) {
        auto out = split_list(raw.get<std::string>());
        check_items(f, out.size());
        return out;
    }
    if (!raw.is_array()) bad(f, "must be a list or a comma-separated string (got " + raw.dump() + ")");
    check_items(f, raw.size());
    std::vector<std::string> out;
    for (const auto& x : raw) {
        if (!x.is_string()) bad(f, "must hold strings (got " + x.dump() + ")");
        const std::string s = trim(x.get<std::string>());
        if (!s.empty()) out.push_back(s);
    }
    return out;
}

}  // namespace

const char* to_string(Command c) {
    const auto i = static_cast<std::size_t>(c);
    return i < kCommandNames.size() ? kCommandNames[i] : "?";
}

const std::vector<Command>& all_commands() {
    static const std::vector<Command> v = [] {
        std::vector<Command> c;
        for (std::size_t i = 0; i < kCommandNames.size(); ++i) c.push_back(static_cast<Command>(i));
        return c;
    }();
    return v;
}

Result<Command> parse_command(std::string_view name) {
    const std::string n = dashed(name);
    std::vector<std::string> names;
    for (std::size_t i = 0; i < kCommandNames.size(); ++i) {
        if (n == kCommandNames[i]) return static_cast<Command>(i);
        names.emplace_back(kCommandNames[i]);
    }
    return Error{ErrorCode::NotFound, "unknown command \"" + std::string(name) + "\"" + did_you_mean(name, names), "command"};
}

const char* to_string(FieldType t) {
    switch (t) {
        case FT::String: return "string";
        case FT::Path: return "path";
        case FT::Int: return "int";
        case FT::Number: return "number";
        case FT::Bool: return "bool";
        case FT::Size: return "size";
        case FT::Percent: return "percent";
        case FT::Count: return "count";
        case FT::Enum: return "enum";
        case FT::IntList: return "int-list";
        case FT::StringList: return "string-list";
        case FT::EnumList: return "enum-list";
        case FT::Object: return "object";
    }
    return "?";
}


const std::vector<Field>& fields() {
    // Never destroyed: the process ends without tearing the table down.
    static const std::vector<Field>& table = *new std::vector<Field>(build_table());
    return table;
}

const Field* positional_of(Command c) {
    const Field* p = nullptr;
    for (const Field* f : fields_of(c))
        if (f->positional) p = f;  // the command's own (message, file) over the model
    return p;
}

const std::vector<const Field*>& fields_of(Command c) {
    static const auto& per_command = *new std::vector<std::vector<const Field*>>([] {  // never destroyed
        std::vector<std::vector<const Field*>> v(static_cast<std::size_t>(Command::Count));
        for (std::size_t i = 0; i < v.size(); ++i)
            for (const auto& f : fields())
                if (f.in(static_cast<Command>(i))) v[i].push_back(&f);
        return v;
    }());
    static const std::vector<const Field*> none;
    const auto i = static_cast<std::size_t>(c);
    return i < per_command.size() ? per_command[i] : none;
}

const Field* find_field(std::string_view name) {
    const std::string n = dashed(name);
    for (const auto& f : fields()) {
        if (f.name == n) return &f;
        for (const auto& a : f.aliases)
            if (a == n) return &f;
    }
    return nullptr;
}

const Field* find_field(std::string_view name, Command c) {
    const std::string n = dashed(name);
    for (const auto& f : fields()) {
        if (!f.in(c)) continue;
        if (f.name == n) return &f;
        for (const auto& a : f.aliases)
            if (a == n) return &f;
    }
    return find_field(name);
}

const std::vector<std::pair<std::string, std::string>>& field_groups() {
    static const std::vector<std::pair<std::string, std::string>> g = {
        {"model", "Model"},       {"job", "Job"},     {"precision", "Precision and optimizer"}, {"savers", "Memory savers"},
        {"framework", "Training framework"}, {"layout", "Parallel layout"}, {"gpu", "GPU and allocator"}, {"time", "Time and cost"}, {"plan", "Planner"},
        {"sweep", "Sweep"},       {"serving", "Serving engine"}, {"calibration", "Calibration"}, {"input", "Input"}, {"output", "Output"}};
    return g;
}

Result<json> canonical_value(const Field& f, const json& raw) {
    return capture([&]() -> json {
        switch (f.type) {
            case FT::String:
            case FT::Path:
                // --calibration in a JSON request may be the document itself.
                if (f.name == "calibration" && raw.is_object()) return raw;
                if (!raw.is_string()) bad(f, "must be a string (got " + raw.dump() + ")");
                return raw;
            case FT::Int: return int_value(f, raw);
            case FT::Number: return number_value(f, raw);
            case FT::Bool: {
                if (raw.is_boolean()) return raw;
                if (raw.is_number_integer() && (raw.get<std::int64_t>() == 0 || raw.get<std::int64_t>() == 1)) return raw.get<std::int64_t>() == 1;
                if (raw.is_string()) {
                    const std::string s = dashed(trim(raw.get<std::string>()));
                    if (s == "true" || s == "1" || s == "yes" || s == "on") return true;
                    if (s == "false" || s == "0" || s == "no" || s == "off") return false;
                }
                bad(f, "must be true or false (got " + shown(raw) + ")");
            }
            case FT::Size: {
                if (raw.is_number()) {
                    const std::int64_t v = int_value(f, raw);
                    return v;
                }
                if (!raw.is_string()) bad(f, "must be a size such as 24GiB (got " + raw.dump() + ")");
                const std::string s = trim(raw.get<std::string>());
                if (!s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)) || c == '.'; })) {
                    if (std::strtod(s.c_str(), nullptr) > 0)
                        bad(f, "\"" + s + "\" has no unit; write " + s + "GiB, " + s + "GB or " + s + "MiB (a bare number would be bytes: write " + s + "B)");
                    bad(f, "must be at least " + bound_text(f, f.min.value_or(1)) + " (got " + s + "); give a size " + range_text(f) + ", e.g. 24GiB");
                }
                // A size's number is range-checked before it becomes bytes: -9e18 or
                // 1e30GiB never reaches the conversion.
                if (const char c = s.empty() ? '\0' : s[0]; c == '-') bad(f, "must be at least " + bound_text(f, f.min.value_or(1)) + " (got " + s + "); give a size " + range_text(f) + ", e.g. 24GiB");
                const Bytes b = take(parse_size(s, f.name));
                check_range(f, static_cast<double>(b.count()), raw);
                return b.count();
            }
            case FT::Percent: {
                // "5%" or a fraction; the range applies to the fraction
                const std::string text = raw.is_string() ? trim(raw.get<std::string>()) : std::string();
                double v = 0;
                if (!text.empty() && text.back() == '%') {
                    v = number_value(f, json(text.substr(0, text.size() - 1)), false) / 100.0;
                } else {
                    v = number_value(f, raw, false);
                    if (v >= 1) bad(f, plain(raw) + " is not a fraction; write " + plain(raw) + "% or a fraction below 1");
                }
                check_range(f, v, raw);
                return v;
            }
            case FT::Count: {
                if (raw.is_number()) return int_value(f, raw);
                if (!raw.is_string()) bad(f, "must be a count such as 7B (got " + raw.dump() + ")");
                auto n = parse_param_count(raw.get<std::string>());
                if (!n) {
                    std::string m = n.error().message;
                    if (const auto at = m.find("(--params)"); at != std::string::npos) m.replace(at, 10, "(" + f.flag() + ")");
                    fail(ErrorCode::InvalidArgument, f.name, m);
                }
                check_range(f, static_cast<double>(n.value()), raw);
                return n.value();
            }
            case FT::Enum:
                if (!raw.is_string()) bad(f, "must be one of the names (got " + raw.dump() + ")");
                return enum_value(f, raw.get<std::string>());
            case FT::IntList: {
                json a = json::array();
                if (raw.is_string()) {
                    const auto parts = split_list(raw.get<std::string>());
                    check_items(f, parts.size());
                    for (const auto& s : parts) a.push_back(int_value(f, json(s)));
                    if (a.empty()) bad(f, "needs a comma-separated list of whole numbers, e.g. 1,2,4");
                } else if (raw.is_array()) {
                    check_items(f, raw.size());
                    for (const auto& x : raw) a.push_back(int_value(f, x));
                } else {
                    bad(f, "must be a list of whole numbers or a comma-separated string (got " + raw.dump() + ")");
                }
                return a;
            }
            case FT::StringList: return string_list(f, raw);
            case FT::EnumList: {
                json a = json::array();
                for (const auto& s : string_list(f, raw)) a.push_back(enum_value(f, s));
                return a;
            }
            case FT::Object:
                if (!raw.is_object()) bad(f, "must be a JSON object (got " + std::string(raw.type_name()) + ")");
                return raw;
        }
        bad(f, "unsupported field type");
    });
}

Result<Request> parse_request(Command c, const json& body) {
    return capture([&]() -> Request {
        if (!body.is_object()) fail(ErrorCode::InvalidArgument, "", "the request must be a JSON object of field names and values");
        Request r;
        for (const auto& [key, raw] : body.items()) {
            const Field* f = find_field(key, c);
            if (!f || !f->in(c)) {
                std::vector<std::string> names;
                for (const Field* g : fields_of(c)) {
                    names.push_back(g->name);
                    names.push_back(g->json_key());
                }
                std::string msg = "unknown field \"" + key + "\" for " + to_string(c);
                if (f) {
                    std::string where;
                    for (Command o : all_commands())
                        if (f->in(o)) where += (where.empty() ? "" : ", ") + std::string(to_string(o));
                    msg = "\"" + key + "\" does not apply to " + std::string(to_string(c)) + " (it is a field of " + where + ")";
                } else {
                    msg += did_you_mean(key, names);
                }
                fail(ErrorCode::InvalidArgument, key, msg);
            }
            if (raw.is_null()) continue;  // absent
            f->set(r, take(canonical_value(*f, raw)));
        }
        if (const auto points = static_cast<std::int64_t>(std::max<std::size_t>(r.sweep.batches.size(), 1) * std::max<std::size_t>(r.sweep.seqs.size(), 1));
            points > kMaxSweepPoints)
            fail(ErrorCode::InvalidArgument, "batches",
                 "--batches x --seqs: " + std::to_string(points) + " sweep points; give at most " + std::to_string(kMaxSweepPoints) +
                     " (limit: each point is one estimate; real sweeps have tens)");
        for (const Field* f : fields_of(c))
            if (f->required && f->get(r) == f->default_value && !(c == Command::Snapshot && !r.other.data.empty()))
                fail(ErrorCode::InvalidArgument, f->name, f->flag() + " is required: " + std::string(f->help));
        return r;
    });
}

json request_json(const Request& r, Command c) {
    json j = json::object();
    for (const Field* f : fields_of(c)) {
        if (f->cli_only || f->name == "data") continue;
        json v = f->get(r);
        if (v.is_null() || (v.is_array() && v.empty() && f->default_value.is_null())) continue;
        j[f->json_key()] = std::move(v);
    }
    return j;
}

namespace {
std::string shell_word(const std::string& s) {
    bool plain = !s.empty();
    for (char c : s)
        if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' || c == '/' || c == ',' || c == ':' || c == '=' || c == '%'))
            plain = false;
    if (plain) return s;
    std::string q = "'";
    for (char c : s) {
        if (c == '\'') q += "'\\''";
        else q.push_back(c);
    }
    return q + "'";
}

std::string size_text(std::int64_t b) {
    const std::pair<const char*, std::int64_t> units[] = {{"TiB", std::int64_t(1) << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}};
    for (const auto& [u, n] : units)
        if (b >= n && b % n == 0) return std::to_string(b / n) + u;
    return std::to_string(b) + "B";
}

std::string value_text(const Field& f, const json& v) {
    if (f.type == FT::Size) return size_text(v.get<std::int64_t>());
    if (f.type == FT::Percent) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%g%%", v.get<double>() * 100);
        return buf;
    }
    if (v.is_array()) {
        std::string t;
        for (const auto& x : v) t += (t.empty() ? "" : ",") + (x.is_string() ? x.get<std::string>() : x.dump());
        return t;
    }
    if (v.is_string()) return v.get<std::string>();
    if (v.is_number_float()) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%g", v.get<double>());
        return buf;
    }
    return v.dump();
}
}  // namespace

std::string request_command(const Request& r, Command c) {
    std::string out = "gpumem ";
    if (c == Command::CompatDeepSpeed) out += "compat deepspeed";
    else if (c == Command::CompatMegatron) out += "compat megatron";
    else out += to_string(c == Command::Timeline ? Command::Estimate : c);
    std::string flags;
    for (const Field* f : fields_of(c)) {
        if (f->name == "data") continue;
        const json v = f->get(r);
        if (v.is_null() || v == f->default_value || (v.is_array() && v.empty())) continue;
        if (f == positional_of(c)) {
            out += " " + shell_word(value_text(*f, v));
        } else if (f->type == FT::Bool) {
            flags += (v.get<bool>() ? " " + f->flag() : " --no-" + f->name);
        } else {
            flags += " " + f->flag() + " " + shell_word(value_text(*f, v));
        }
    }
    return out + flags;
}

json fields_json() {
    json out = json::object();
    json fs = json::array();
    for (const auto& f : fields()) {
        json j = {{"name", f.name}, {"key", f.json_key()}, {"type", to_string(f.type)}, {"group", f.group}, {"help", f.help},
                  {"unit", f.unit}, {"default", f.default_value}, {"default_text", f.default_text}, {"values", f.values},
                  {"aliases", f.aliases}, {"positional", f.positional}, {"required", f.required}, {"cli_only", f.cli_only}};
        json cmds = json::array();
        for (Command c : all_commands())
            if (f.in(c)) cmds.push_back(to_string(c));
        j["commands"] = cmds;
        json modes = json::array();
        for (int m = 0; m < 4; ++m)
            if (f.modes & (1u << m)) modes.push_back(to_string(static_cast<Mode>(m)));
        j["modes"] = modes;
        j["min"] = f.min ? json(*f.min) : json();
        j["max"] = f.max ? json(*f.max) : json();
        j["limit"] = f.limit;
        j["max_items"] = f.max_items ? json(*f.max_items) : json();
        fs.push_back(std::move(j));
    }
    out["fields"] = std::move(fs);
    json groups = json::array();
    for (const auto& [k, title] : field_groups()) groups.push_back({{"name", k}, {"title", title}});
    out["groups"] = std::move(groups);
    json cmds = json::array();
    for (Command c : all_commands()) cmds.push_back(to_string(c));
    out["commands"] = std::move(cmds);
    return out;
}

}  // namespace gpumem
