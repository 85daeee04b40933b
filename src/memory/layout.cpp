// Distributed layouts: validation against the model, GPUs per node, and the
// split of the transformer layers into pipeline stages.
//
// Pipeline splits follow Megatron-LM (NVIDIA/Megatron-LM commit d98e8a64ddf3,
// megatron/core/transformer/transformer_block.py get_num_layers_to_build and
// megatron/core/transformer/transformer_layer.py get_transformer_layer_offset):
//   - even: layers / (pp x vpp) per virtual stage;
//   - --decoder-first/last-pipeline-num-layers (gpumem --pp-first-layers /
//     --pp-last-layers): the first / last rank gets that many, the other ranks
//     split the rest evenly, and each rank's layers are split evenly over its
//     vpp model chunks;
//   - --account-for-embedding/loss-in-pipeline-split (gpumem
//     --pp-embedding-layer / --pp-loss-layer): the embedding / the loss counts
//     as one layer, so the first / last virtual stage builds one transformer
//     layer less (Llama 3 405B: 126 layers + 2 = 16 x 8);
//   - --pp-layers: the count of every virtual stage given outright (Megatron's
//     --pipeline-model-parallel-layout, transformer layers only).
// Virtual stage v runs on pipeline rank v % pp as its model chunk v / pp.
#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>

#include "enum_names.hpp"
#include "gpumem/memory/parallel.hpp"
#include "gpumem/model/graph.hpp"

namespace gpumem {

namespace {
using detail::enum_name;
using detail::parse_enum;
constexpr std::array<std::pair<const char*, PipelineSchedule>, 2> kSchedules{{{"1f1b", PipelineSchedule::OneFOneB}, {"interleaved", PipelineSchedule::Interleaved}}};
constexpr std::array<std::pair<const char*, Fsdp>, 4> kFsdp{{{"none", Fsdp::None}, {"full", Fsdp::Full}, {"grad-op", Fsdp::GradOp}, {"hybrid", Fsdp::Hybrid}}};
constexpr std::array<std::pair<const char*, Offload>, 3> kOffload{{{"none", Offload::None}, {"cpu", Offload::Cpu}, {"nvme", Offload::Nvme}}};

// "2 or 4": the valid values nearest to `v` among `candidates`.
std::string nearest(std::int64_t v, const std::vector<std::int64_t>& candidates) {
    std::int64_t lo = -1, hi = -1;
    for (auto c : candidates) {
        if (c <= v) lo = c;
        if (c >= v && hi < 0) hi = c;
    }
    if (lo > 0 && hi > 0 && lo != hi) return std::to_string(lo) + " or " + std::to_string(hi);
    return std::to_string(lo > 0 ? lo : hi);
}

[[noreturn]] void bad(const char* field, const std::string& msg) { fail(ErrorCode::InvalidArgument, field, msg); }

std::string join(const std::vector<std::int64_t>& v) {
    std::string s;
    for (auto x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
    return s;
}

// Layers of every virtual stage (model order), validated.
std::vector<std::int64_t> split_layers(const ParallelConfig& c, std::int64_t layers, std::int64_t vpp) {
    const std::int64_t pp = c.pp, chunks = checked_mul(pp, vpp);
    if (!c.pp_layers.empty()) {
        if (c.pp_first_layers || c.pp_last_layers || c.pp_embedding_layer || c.pp_loss_layer)
            bad("pp-layers", "--pp-layers gives every stage's layers outright: do not combine it with --pp-first-layers, --pp-last-layers, "
                             "--pp-embedding-layer or --pp-loss-layer");
        if (static_cast<std::int64_t>(c.pp_layers.size()) != chunks)
            bad("pp-layers", "--pp-layers lists " + std::to_string(c.pp_layers.size()) + " stages but pp x vpp = " + std::to_string(chunks) +
                                 ": give one layer count per virtual pipeline stage, in model order");
        std::int64_t sum = 0;
        for (auto v : c.pp_layers) {
            if (v < 0) bad("pp-layers", "--pp-layers: layer counts must be zero or positive (got " + join(c.pp_layers) + ")");
            sum = checked_add(sum, v);
        }
        if (sum != layers)
            bad("pp-layers", "--pp-layers " + join(c.pp_layers) + " sums to " + std::to_string(sum) + " layers but the model has " +
                                 std::to_string(layers));
        return c.pp_layers;
    }
    if (c.pp_first_layers || c.pp_last_layers) {
        if (c.pp_embedding_layer || c.pp_loss_layer)
            bad("pp-first-layers", "--pp-first-layers/--pp-last-layers and --pp-embedding-layer/--pp-loss-layer are two ways to "
                                   "unbalance the split (Megatron refuses both at once): pick one");
        if (pp < 2) bad("pp-first-layers", "--pp-first-layers/--pp-last-layers need --pp >= 2");
        std::int64_t rest = layers, left = pp;
        for (auto [v, name] : {std::pair{c.pp_first_layers, "pp-first-layers"}, std::pair{c.pp_last_layers, "pp-last-layers"}}) {
            if (!v) continue;
            if (*v < 1) bad(name, std::string("--") + name + " must be a positive number of layers (got " + std::to_string(*v) + ")");
            rest -= *v;
            --left;
        }
        if (rest < 0 || (left == 0 && rest != 0) || (left > 0 && (rest < left || rest % left != 0))) {
            std::string hint;
            if (left > 0) {
                const std::int64_t per = std::max<std::int64_t>(1, rest / std::max<std::int64_t>(1, left));
                hint = "; the other " + std::to_string(left) + " ranks need an equal share of the remaining " + std::to_string(std::max<std::int64_t>(0, rest)) +
                       " layers (e.g. " + std::to_string(per) + " each leaves " + std::to_string(layers - per * left) + " for the given stage(s))";
            }
            bad(c.pp_first_layers ? "pp-first-layers" : "pp-last-layers",
                "--pp-first-layers/--pp-last-layers do not leave an even split of the " + std::to_string(layers) + " layers over --pp " +
                    std::to_string(pp) + hint);
        }
        std::vector<std::int64_t> rank(static_cast<std::size_t>(pp), left > 0 ? rest / left : 0);
        if (c.pp_first_layers) rank.front() = *c.pp_first_layers;
        if (c.pp_last_layers) rank.back() = *c.pp_last_layers;
        std::vector<std::int64_t> out(static_cast<std::size_t>(chunks));
        for (std::int64_t r = 0; r < pp; ++r) {
            if (rank[static_cast<std::size_t>(r)] % vpp != 0)
                bad("vpp", "pipeline rank " + std::to_string(r) + " has " + std::to_string(rank[static_cast<std::size_t>(r)]) +
                               " layers, not divisible into --vpp " + std::to_string(vpp) + " model chunks");
            for (std::int64_t k = 0; k < vpp; ++k) out[static_cast<std::size_t>(k * pp + r)] = rank[static_cast<std::size_t>(r)] / vpp;
        }
        return out;
    }
    const std::int64_t counted = layers + (c.pp_embedding_layer ? 1 : 0) + (c.pp_loss_layer ? 1 : 0);
    if (counted % chunks != 0) {
        std::vector<std::int64_t> ok;
        for (auto v : divisors(counted))
            if (v % vpp == 0) ok.push_back(v / vpp);
        std::string alt;
        if (!c.pp_embedding_layer && !c.pp_loss_layer) {
            if ((layers + 2) % chunks == 0) alt = "; or count the embedding and the loss as layers (--pp-embedding-layer --pp-loss-layer: " +
                                                  std::to_string(layers + 2) + " = " + std::to_string(chunks) + " x " + std::to_string((layers + 2) / chunks) + ")";
            else if ((layers + 1) % chunks == 0) alt = "; or count the embedding as a layer (--pp-embedding-layer: " + std::to_string(layers + 1) +
                                                       " = " + std::to_string(chunks) + " x " + std::to_string((layers + 1) / chunks) + ")";
        }
        if (alt.empty() && pp >= 3 && vpp == 1) {
            // Megatron's first/last stage counts: the middle ranks take ceil(L / pp).
            const std::int64_t mid = (layers + pp - 1) / pp;
            const std::int64_t ends = layers - mid * (pp - 2);
            if (ends >= 2) alt = "; or give the first and last ranks fewer layers (--pp-first-layers " + std::to_string(ends / 2) +
                                 " --pp-last-layers " + std::to_string(ends - ends / 2) + ")";
        }
        bad(vpp > 1 ? "vpp" : "pp", "the " + std::to_string(layers) + " layers" +
                                        (counted != layers ? " (+" + std::to_string(counted - layers) + " for the embedding/loss)" : "") +
                                        " do not split evenly into pp x vpp = " + std::to_string(chunks) + " pipeline chunks; use --pp " +
                                        nearest(pp, ok) + (vpp > 1 ? " (with --vpp " + std::to_string(vpp) + ")" : "") + alt +
                                        ", or list every stage's layers with --pp-layers");
    }
    std::vector<std::int64_t> out(static_cast<std::size_t>(chunks), counted / chunks);
    if (c.pp_embedding_layer) out.front() -= 1;
    if (c.pp_loss_layer) out.back() -= 1;
    if (out.front() < 0 || out.back() < 0) bad("pp", "--pp x --vpp leaves no room for the embedding/loss stage");
    return out;
}
}  // namespace

const char* to_string(PipelineSchedule v) { return enum_name(v, kSchedules); }
const char* to_string(Fsdp v) { return enum_name(v, kFsdp); }
const char* to_string(Offload v) { return enum_name(v, kOffload); }
Result<PipelineSchedule> parse_pp_schedule(std::string_view s) { return parse_enum(s, kSchedules, "pp-schedule"); }
Result<Fsdp> parse_fsdp(std::string_view s) { return parse_enum(s, kFsdp, "fsdp"); }
Result<Offload> parse_offload(std::string_view s, std::string_view flag) { return parse_enum(s, kOffload, flag); }

Result<Layout> resolve_layout(const ParallelConfig& c, const ModelGraph& g, std::int64_t seq, std::int64_t micro_batches,
                              std::int64_t default_gpus_per_node) {
    return capture([&]() -> Layout {
        for (auto [v, name] : {std::pair{c.gpus, "gpus"}, {c.tp, "tp"}, {c.pp, "pp"}, {c.cp, "cp"}, {c.ep, "ep"}, {c.vpp, "vpp"}})
            if (v < 1) bad(name, std::string("--") + name + " must be a positive integer (got " + std::to_string(v) + ")");
        if (c.nodes < 0) bad("nodes", "--nodes must be a positive integer (got " + std::to_string(c.nodes) + ")");
        if (c.gpus_per_node < 0) bad("gpus-per-node", "--gpus-per-node must be a positive integer (got " + std::to_string(c.gpus_per_node) + ")");
        if (c.zero < 0 || c.zero > 3) bad("zero", "--zero must be 0, 1, 2 or 3 (got " + std::to_string(c.zero) + ")");
        Layout l;
        l.cfg = c;
        const std::int64_t model_parallel = checked_mul(checked_mul(c.tp, c.pp), c.cp);
        if (c.gpus % model_parallel != 0) {
            std::vector<std::int64_t> mult;
            for (std::int64_t k = 1; k <= 64; ++k) mult.push_back(k * model_parallel);
            bad("gpus", "--gpus " + std::to_string(c.gpus) + " is not divisible by tp x pp x cp = " + std::to_string(model_parallel) +
                            "; use --gpus " + nearest(c.gpus, mult) + " or a tp/pp/cp whose product divides " + std::to_string(c.gpus));
        }
        // GPUs per node: --nodes, else --gpus-per-node, else the GPU's board.
        if (c.nodes > 0) {
            if (c.gpus % c.nodes != 0)
                bad("nodes", "--gpus " + std::to_string(c.gpus) + " is not divisible by --nodes " + std::to_string(c.nodes) +
                                 ": every node runs the same number of GPUs; use --nodes " + nearest(c.nodes, divisors(c.gpus)));
            if (c.gpus_per_node > 0 && c.gpus_per_node * c.nodes != c.gpus)
                bad("gpus-per-node", "--nodes " + std::to_string(c.nodes) + " x --gpus-per-node " + std::to_string(c.gpus_per_node) +
                                         " is not --gpus " + std::to_string(c.gpus) + ": give one of --nodes and --gpus-per-node");
            l.nodes = c.nodes;
            l.gpus_per_node = c.gpus / c.nodes;
        } else {
            std::int64_t per = c.gpus_per_node > 0 ? c.gpus_per_node : std::max<std::int64_t>(1, default_gpus_per_node);
            if (c.gpus <= per) {
                l.nodes = 1;
                l.gpus_per_node = c.gpus;
            } else {
                if (c.gpus % per != 0) {
                    if (c.gpus_per_node > 0)
                        bad("gpus-per-node", "--gpus " + std::to_string(c.gpus) + " does not fill whole nodes of --gpus-per-node " +
                                                 std::to_string(per) + "; use --gpus " + std::to_string((c.gpus / per) * per) + " or " +
                                                 std::to_string((c.gpus / per + 1) * per));
                    // Not whole boards of this GPU: equal nodes of the largest size that divides both.
                    per = std::gcd(c.gpus, per);
                    l.nodes_assumed = true;
                }
                l.nodes = c.gpus / per;
                l.gpus_per_node = per;
            }
        }
        l.dp = c.gpus / model_parallel;
        l.micro_batches = micro_batches;
        if (c.vpp > 1 && (c.pp == 1 || c.schedule != PipelineSchedule::Interleaved))
            bad("vpp", "--vpp > 1 needs --pp > 1 and --pp-schedule interleaved");
        l.vpp = c.schedule == PipelineSchedule::Interleaved && c.pp > 1 ? c.vpp : 1;
        const bool split_flags = !c.pp_layers.empty() || c.pp_first_layers || c.pp_last_layers || c.pp_embedding_layer || c.pp_loss_layer;
        if (g.transformer) {
            const TransformerDims& d = *g.transformer;
            if (d.heads % c.tp != 0)
                bad("tp", "--tp " + std::to_string(c.tp) + " does not divide the " + std::to_string(d.heads) +
                              " attention heads; use --tp " + nearest(c.tp, divisors(d.heads)));
            if (d.kv_heads > 0 && d.kv_heads % c.tp != 0 && c.tp % d.kv_heads != 0)
                bad("tp", "--tp " + std::to_string(c.tp) + " does not divide the " + std::to_string(d.kv_heads) +
                              " key/value heads (and is not a multiple of them); use --tp " + nearest(c.tp, divisors(d.kv_heads)));
            l.stage_layers = split_layers(c, d.layers, l.vpp);
            if (c.ep > 1) {
                if (d.experts == 0) bad("ep", "--ep " + std::to_string(c.ep) + " needs a mixture-of-experts model; this one is dense: use --ep 1");
                if (d.experts % c.ep != 0)
                    bad("ep", "--ep " + std::to_string(c.ep) + " does not divide the " + std::to_string(d.experts) + " experts; use --ep " +
                                  nearest(c.ep, divisors(d.experts)));
            }
            if (c.cp > 1 && seq % (2 * c.cp) != 0)
                bad("cp", "--seq " + std::to_string(seq) + " must be divisible by 2 x cp = " + std::to_string(2 * c.cp) +
                              " (context parallelism splits the sequence into 2 x cp load-balanced chunks)");
        } else if (c.tp > 1 || c.pp > 1 || c.cp > 1 || c.ep > 1 || split_flags) {
            bad("tp", "tensor, pipeline, context and expert parallelism need a transformer model (a preset or config.json); this model supports data parallelism only");
        } else {
            l.stage_layers = {0};
        }
        if (split_flags && c.pp == 1) bad("pp-layers", "pipeline split options (--pp-layers, --pp-first-layers, ...) need --pp >= 2");
        if (c.ep > 1 && l.dp % c.ep != 0)
            bad("ep", "--ep " + std::to_string(c.ep) + " must divide the data-parallel size " + std::to_string(l.dp) +
                          " (experts are spread over data-parallel ranks); use --ep " + nearest(c.ep, divisors(l.dp)));
        if (c.sp && c.tp == 1) bad("sp", "--sp (sequence parallelism) splits the norm/dropout activations over the tensor-parallel group: it needs --tp > 1");
        if (c.schedule == PipelineSchedule::Interleaved && c.pp > 1 && micro_batches % c.pp != 0)
            bad("grad-accum", "the interleaved schedule needs the number of micro-batches (--grad-accum " + std::to_string(micro_batches) +
                                  ") to be a multiple of --pp " + std::to_string(c.pp));
        if (c.zero > 0 && c.fsdp != Fsdp::None) bad("fsdp", "--zero and --fsdp are two implementations of sharding: pick one");
        if (c.zero >= 2 && c.pp > 1)
            bad("zero", "DeepSpeed's pipeline engine supports ZeRO stage 0 or 1 only (stage " + std::to_string(c.zero) +
                            " with --pp " + std::to_string(c.pp) + "); use --zero 1 or --pp 1");
        if (c.distributed_optimizer && (c.zero > 0 || c.fsdp != Fsdp::None))
            bad("distributed-optimizer", "--distributed-optimizer is Megatron's ZeRO-1; do not combine it with --zero or --fsdp");
        if (c.offload_params != Offload::None && c.zero != 3 && c.fsdp == Fsdp::None)
            bad("offload-params", "--offload-params needs sharded parameters: use --zero 3 or --fsdp full");
        if (c.offload_params == Offload::Nvme && c.fsdp != Fsdp::None)
            bad("offload-params", "FSDP offloads parameters to CPU only; NVMe needs DeepSpeed --zero 3");
        if (c.offload_optimizer != Offload::None && c.zero == 0 && c.fsdp == Fsdp::None)
            bad("offload-optimizer", "--offload-optimizer needs ZeRO (--zero 1, 2 or 3) or --fsdp");
        if (c.offload_optimizer == Offload::Nvme && c.zero != 3)
            bad("offload-optimizer", "optimizer offload to NVMe is ZeRO-Infinity: it needs --zero 3");
        if (!(c.capacity_factor > 0) || !std::isfinite(c.capacity_factor)) bad("capacity-factor", "--capacity-factor must be a positive number");
        l.shard = l.dp;
        if (c.fsdp == Fsdp::Hybrid)
            // HSDP: shard within a node, replicate across nodes.
            l.shard = std::max<std::int64_t>(1, std::min(l.dp, l.gpus_per_node / std::max<std::int64_t>(1, std::min(l.gpus_per_node, model_parallel))));
        if (c.fsdp_over_cp && c.fsdp == Fsdp::Full) l.shard = checked_mul(l.shard, c.cp);
        l.expert_shard = std::max<std::int64_t>(1, l.shard / c.ep);
        return l;
    });
}

std::vector<std::vector<std::int32_t>> assign_virtual_stages(const ModelGraph& g, const Layout& lay) {
    std::vector<std::int64_t> cum;  // cumulative layers through each virtual stage
    cum.reserve(lay.stage_layers.size());
    std::int64_t acc = 0;
    for (auto v : lay.stage_layers) cum.push_back(acc += v);
    const auto last = static_cast<std::int32_t>(std::max<std::size_t>(1, lay.stage_layers.size()) - 1);
    std::int64_t total_layers = 0;
    for (const auto& b : g.blocks)
        if (b.checkpointable) total_layers += b.repeat;
    std::vector<std::vector<std::int32_t>> out(g.blocks.size());
    std::int64_t layer = 0;
    std::int32_t current = 0;
    // The first virtual stage whose cumulative count exceeds `layer`: as
    // layers only grow, it only moves forward (searched afresh from stage 0,
    // it was a twelfth of a 405B plan's analytic search).
    std::int32_t v = 0;
    for (std::size_t bi = 0; bi < g.blocks.size(); ++bi) {
        const Block& b = g.blocks[bi];
        out[bi].reserve(static_cast<std::size_t>(std::max<std::int64_t>(b.repeat, 0)));  // (grown by doubling: 8 allocations for 80 layers)
        for (std::int64_t r = 0; r < b.repeat; ++r) {
            if (b.checkpointable) {
                while (static_cast<std::size_t>(v) < cum.size() && cum[static_cast<std::size_t>(v)] <= layer) ++v;
                current = std::min(v, last);
                ++layer;
            } else if (layer >= total_layers && total_layers > 0) {
                current = last;  // final norm, output layer, loss
            }
            out[bi].push_back(current);
        }
    }
    return out;
}

std::vector<std::int64_t> divisors(std::int64_t n) {
    std::vector<std::int64_t> d;
    for (std::int64_t i = 1; i * i <= n; ++i)
        if (n % i == 0) {
            d.push_back(i);
            if (i != n / i) d.push_back(n / i);
        }
    std::sort(d.begin(), d.end());
    return d;
}

}  // namespace gpumem
