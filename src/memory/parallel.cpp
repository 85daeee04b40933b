#include "gpumem/memory/parallel.hpp"

#include <algorithm>
#include <array>

#include "enum_names.hpp"
#include <cctype>
#include <cmath>
#include <numeric>

#include "gpumem/memory/activations.hpp"
#include "gpumem/memory/job.hpp"
#include "gpumem/model/graph.hpp"

namespace gpumem {

namespace {
using detail::enum_name;
using detail::parse_enum;
constexpr std::array<std::pair<const char*, PipelineSchedule>, 2> kSchedules{{{"1f1b", PipelineSchedule::OneFOneB}, {"interleaved", PipelineSchedule::Interleaved}}};
constexpr std::array<std::pair<const char*, Fsdp>, 4> kFsdp{{{"none", Fsdp::None}, {"full", Fsdp::Full}, {"grad-op", Fsdp::GradOp}, {"hybrid", Fsdp::Hybrid}}};
constexpr std::array<std::pair<const char*, Offload>, 3> kOffload{{{"none", Offload::None}, {"cpu", Offload::Cpu}, {"nvme", Offload::Nvme}}};

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

bool tp_sharded(Component c) {
    return c == Component::Attention || c == Component::Mlp || c == Component::Experts || c == Component::Embeddings ||
           c == Component::Head;
}
}  // namespace

const char* to_string(PipelineSchedule v) { return enum_name(v, kSchedules); }
const char* to_string(Fsdp v) { return enum_name(v, kFsdp); }
const char* to_string(Offload v) { return enum_name(v, kOffload); }
Result<PipelineSchedule> parse_pp_schedule(std::string_view s) { return parse_enum(s, kSchedules, "pp-schedule"); }
Result<Fsdp> parse_fsdp(std::string_view s) { return parse_enum(s, kFsdp, "fsdp"); }
Result<Offload> parse_offload(std::string_view s, std::string_view flag) { return parse_enum(s, kOffload, flag); }

Result<Layout> resolve_layout(const ParallelConfig& c, const ModelGraph& g, std::int64_t seq, std::int64_t micro_batches) {
    return capture([&]() -> Layout {
        for (auto [v, name] : {std::pair{c.gpus, "gpus"}, {c.nodes, "nodes"}, {c.tp, "tp"}, {c.pp, "pp"}, {c.cp, "cp"}, {c.ep, "ep"}, {c.vpp, "vpp"}})
            if (v < 1) bad(name, std::string("--") + name + " must be a positive integer (got " + std::to_string(v) + ")");
        if (c.zero < 0 || c.zero > 3) bad("zero", "--zero must be 0, 1, 2 or 3 (got " + std::to_string(c.zero) + ")");
        if (c.gpus % c.nodes != 0)
            bad("nodes", "--gpus " + std::to_string(c.gpus) + " is not divisible by --nodes " + std::to_string(c.nodes) +
                             ": every node runs the same number of GPUs; use --nodes " + nearest(c.nodes, divisors(c.gpus)));
        const std::int64_t model_parallel = checked_mul(checked_mul(c.tp, c.pp), c.cp);
        if (c.gpus % model_parallel != 0) {
            std::vector<std::int64_t> mult;
            for (std::int64_t k = 1; k <= 64; ++k) mult.push_back(k * model_parallel);
            bad("gpus", "--gpus " + std::to_string(c.gpus) + " is not divisible by tp x pp x cp = " + std::to_string(model_parallel) +
                            "; use --gpus " + nearest(c.gpus, mult) + " or a tp/pp/cp whose product divides " + std::to_string(c.gpus));
        }
        Layout l;
        l.cfg = c;
        l.dp = c.gpus / model_parallel;
        l.gpus_per_node = c.gpus / c.nodes;
        l.micro_batches = micro_batches;
        if (g.transformer) {
            const TransformerDims& d = *g.transformer;
            if (d.heads % c.tp != 0)
                bad("tp", "--tp " + std::to_string(c.tp) + " does not divide the " + std::to_string(d.heads) +
                              " attention heads; use --tp " + nearest(c.tp, divisors(d.heads)));
            if (d.kv_heads > 0 && d.kv_heads % c.tp != 0 && c.tp % d.kv_heads != 0)
                bad("tp", "--tp " + std::to_string(c.tp) + " does not divide the " + std::to_string(d.kv_heads) +
                              " key/value heads (and is not a multiple of them); use --tp " + nearest(c.tp, divisors(d.kv_heads)));
            const std::int64_t chunks = checked_mul(c.pp, c.vpp);
            if (d.layers % chunks != 0) {
                std::vector<std::int64_t> ok;
                for (auto v : divisors(d.layers))
                    if (v % c.vpp == 0 || c.vpp == 1) ok.push_back(c.vpp == 1 ? v : v / c.vpp);
                bad(c.vpp > 1 ? "vpp" : "pp", "the " + std::to_string(d.layers) + " layers do not split evenly into pp x vpp = " +
                                                  std::to_string(chunks) + " pipeline chunks; use --pp " + nearest(c.pp, divisors(d.layers / std::max<std::int64_t>(1, std::gcd(d.layers, c.vpp)))) +
                                                  (c.vpp > 1 ? " (with --vpp " + std::to_string(c.vpp) + ")" : ""));
            }
            if (c.ep > 1) {
                if (d.experts == 0) bad("ep", "--ep " + std::to_string(c.ep) + " needs a mixture-of-experts model; this one is dense: use --ep 1");
                if (d.experts % c.ep != 0)
                    bad("ep", "--ep " + std::to_string(c.ep) + " does not divide the " + std::to_string(d.experts) + " experts; use --ep " +
                                  nearest(c.ep, divisors(d.experts)));
            }
            if (c.cp > 1 && seq % (2 * c.cp) != 0)
                bad("cp", "--seq " + std::to_string(seq) + " must be divisible by 2 x cp = " + std::to_string(2 * c.cp) +
                              " (context parallelism splits the sequence into 2 x cp load-balanced chunks)");
        } else if (c.tp > 1 || c.pp > 1 || c.cp > 1 || c.ep > 1) {
            bad("tp", "tensor, pipeline, context and expert parallelism need a transformer model (a preset or config.json); this model supports data parallelism only");
        }
        if (c.ep > 1 && l.dp % c.ep != 0)
            bad("ep", "--ep " + std::to_string(c.ep) + " must divide the data-parallel size " + std::to_string(l.dp) +
                          " (experts are spread over data-parallel ranks); use --ep " + nearest(c.ep, divisors(l.dp)));
        if (c.sp && c.tp == 1) bad("sp", "--sp (sequence parallelism) splits the norm/dropout activations over the tensor-parallel group: it needs --tp > 1");
        if (c.vpp > 1 && (c.pp == 1 || c.schedule != PipelineSchedule::Interleaved))
            bad("vpp", "--vpp > 1 needs --pp > 1 and --pp-schedule interleaved");
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
        if (!(c.capacity_factor > 0)) bad("capacity-factor", "--capacity-factor must be positive");
        l.shard = l.dp;
        if (c.fsdp == Fsdp::Hybrid) l.shard = std::max<std::int64_t>(1, std::min(l.dp, l.gpus_per_node / std::max<std::int64_t>(1, std::min(l.gpus_per_node, model_parallel))));
        l.expert_shard = std::max<std::int64_t>(1, l.shard / c.ep);
        return l;
    });
}

ParallelResult parallel_memory(const ModelGraph& g, const Job& job, const Layout& lay, Bytes single_gpu_transient) {
    const ParallelConfig& c = lay.cfg;
    ParallelResult res;
    res.layout = lay;
    const std::int64_t p = c.pp, t = c.tp;
    const std::int64_t total_params = std::max<std::int64_t>(1, g.total_params());

    // Layer instances in execution order, and which stage each block instance lands on.
    std::int64_t total_layers = 0;
    for (const auto& b : g.blocks)
        if (b.checkpointable) total_layers += b.repeat;
    const std::int64_t per_stage = std::max<std::int64_t>(1, total_layers / p);

    // Activations of one micro-batch per block instance, split into the parts
    // linear and quadratic in the sequence (two evaluations: (b, s) and (2b, s/2)
    // have the same linear part and half the quadratic one).
    ActivationContext ctx = job.actx;
    const std::int64_t s_local = std::max<std::int64_t>(1, job.seq / c.cp);
    ctx.seq = s_local;
    std::vector<Bytes> lin(g.blocks.size()), quad(g.blocks.size());
    if (job.train && g.params_only == 0) {
        const ActivationResult a1 = saved_activations(g, ctx);
        ActivationResult a2 = a1;
        if (s_local >= 2 && s_local % 2 == 0) {
            ActivationContext c2 = ctx;
            c2.batch = ctx.batch * 2;
            c2.seq = s_local / 2;
            a2 = saved_activations(g, c2);
        }
        for (std::size_t i = 0; i < g.blocks.size(); ++i) {
            const Bytes A1 = a1.blocks[i].per_instance, A2 = a2.blocks[i].per_instance;
            const Bytes q = A1 > A2 ? (A1 - A2) * 2 : Bytes(0);
            quad[i] = q * c.cp;  // local queries attend to all cp chunks of keys
            lin[i] = A1 - std::min(q, A1);
            // Routed experts process up to capacity_factor x their average share of
            // tokens (GShard/Switch capacity): their buffers scale with it.
            if (c.capacity_factor != 1.0 && a1.blocks[i].routed_per_instance > Bytes(0))
                lin[i] += Bytes(static_cast<std::int64_t>(static_cast<double>(a1.blocks[i].routed_per_instance.count()) * (c.capacity_factor - 1.0)));
        }
    }
    auto scaled = [&](std::size_t bi) {
        const Block& b = g.blocks[bi];
        if (b.checkpointable && job.actx.recompute == Recompute::Full) return c.sp ? lin[bi].ceil_div(t) : lin[bi];
        // Korthikanti et al. 2022, Table 2: 10 of the 34 sbh per layer (norm inputs,
        // dropout masks, residuals) stay replicated without sequence parallelism.
        const Bytes split = Bytes(lin[bi].count() / 34 * 24);
        const Bytes l = c.sp ? lin[bi].ceil_div(t) : (lin[bi] - split) + split.ceil_div(t);
        return l + quad[bi].ceil_div(t);
    };

    struct StageAcc {
        std::int64_t layers = 0, dense = 0, experts = 0;
        Bytes act;
        bool embeddings = false, head = false;
        std::int64_t first_layer = -1;
    };
    std::vector<StageAcc> st(static_cast<std::size_t>(p));
    res.instance_stage.resize(g.blocks.size());
    res.activation_scale.assign(g.blocks.size(), 1.0);
    for (std::size_t bi = 0; bi < g.blocks.size(); ++bi) {
        const Bytes whole = lin[bi] + std::min(quad[bi], quad[bi].ceil_div(std::max<std::int64_t>(1, c.cp)));
        if (whole > Bytes(0)) res.activation_scale[bi] = static_cast<double>(scaled(bi).count()) / static_cast<double>(whole.count());
    }
    std::int64_t layer = 0;
    bool seen_layers = false;
    for (std::size_t bi = 0; bi < g.blocks.size(); ++bi) {
        const Block& b = g.blocks[bi];
        std::int64_t dense = 0, experts = 0;
        for (const auto& prm : b.params) {
            const std::int64_t n = prm.numel();
            const std::int64_t div = tp_sharded(prm.component) ? t : 1;
            if (prm.component == Component::Experts) experts = checked_add(experts, (n + div * c.ep - 1) / (div * c.ep));
            else dense = checked_add(dense, (n + div - 1) / div);
        }
        for (std::int64_t r = 0; r < b.repeat; ++r) {
            std::int64_t s;
            if (b.checkpointable) {
                s = std::min(p - 1, layer / per_stage);
                ++layer;
                seen_layers = true;
            } else {
                s = seen_layers && layer >= total_layers ? p - 1 : std::min(p - 1, layer / per_stage);
            }
            res.instance_stage[bi].push_back(static_cast<std::int32_t>(s));
            StageAcc& a = st[static_cast<std::size_t>(s)];
            a.dense = checked_add(a.dense, dense);
            a.experts = checked_add(a.experts, experts);
            a.act += scaled(bi);
            if (b.checkpointable) {
                if (a.first_layer < 0) a.first_layer = layer - 1;
                ++a.layers;
            } else if (!seen_layers) {
                a.embeddings = true;
            } else if (layer >= total_layers) {
                a.head = true;
            }
        }
    }

    if (g.params_only > 0) st[0].dense = g.params_only;  // --params: one stage, all dense

    const bool zero3 = c.zero == 3 || c.fsdp == Fsdp::Full || c.fsdp == Fsdp::Hybrid;
    const bool shard_grads = c.zero >= 2 || c.fsdp != Fsdp::None;
    const bool shard_opt = c.zero >= 1 || c.fsdp != Fsdp::None || c.distributed_optimizer;
    const double tot = static_cast<double>(total_params);
    const Bytes w_unit = dtype_bytes(job.wdt, 1);
    const Bytes half_unit = dtype_bytes(job.half, 1);
    auto frac = [&](Bytes whole, std::int64_t n) {
        return Bytes(static_cast<std::int64_t>(std::llround(static_cast<double>(whole.count()) * static_cast<double>(n) / tot)));
    };
    // Sharded state: dense part over `shard` ranks, experts over `expert_shard`,
    // each padded to a multiple of its group (flat buffers are padded so that
    // every rank gets an equal slice).
    auto shard_bytes = [&](Bytes whole, std::int64_t dense, std::int64_t experts, bool sharded) {
        if (!sharded) return frac(whole, dense + experts);
        const std::int64_t d_pad = (dense + lay.shard - 1) / lay.shard;
        const std::int64_t e_pad = (experts + lay.expert_shard - 1) / lay.expert_shard;
        return frac(whole, d_pad + e_pad);
    };

    const Bytes hidden_tok = g.transformer ? dtype_bytes(job.lowered, checked_mul(checked_mul(job.req.batch, s_local), g.transformer->hidden))
                                           : Bytes(0);
    std::int64_t largest_layer_params = 0;
    for (const auto& b : g.blocks) {
        std::int64_t n = 0;
        for (const auto& prm : b.params) n = checked_add(n, prm.numel() / (tp_sharded(prm.component) ? t : 1));
        largest_layer_params = std::max(largest_layer_params, n);
    }

    for (std::int64_t s = 0; s < p; ++s) {
        const StageAcc& a = st[static_cast<std::size_t>(s)];
        StageMemory m;
        m.stage = s;
        m.layers = a.layers;
        m.params = a.dense + a.experts;
        m.contents = std::string(a.embeddings ? "embeddings + " : "") +
                     (a.layers > 0 ? "layers " + std::to_string(a.first_layer) + "-" + std::to_string(a.first_layer + a.layers - 1) : "no layers") +
                     (a.head ? " + output layer" : "");
        if (job.train) {
            m.weights = shard_bytes(job.weights, a.dense, a.experts, zero3);
            m.gradients = shard_bytes(job.grads, a.dense, a.experts, shard_grads);
            m.optimizer_states = shard_bytes(job.opt_states + job.master, a.dense, a.experts, shard_opt);
            if (c.offload_optimizer != Offload::None) m.optimizer_states = Bytes(0);
            if (c.offload_params != Offload::None) m.weights = Bytes(0);
            // Pipeline: micro-batches whose activations a stage keeps (1F1B: pp - stage;
            // interleaved: the first stage x (1 + (pp-1)/(pp*vpp)), Korthikanti et al. 2022 §4.2.3).
            m.in_flight = p == 1 ? 1 : std::min<std::int64_t>(p - s, lay.micro_batches);
            Bytes act = a.act * m.in_flight;
            if (c.schedule == PipelineSchedule::Interleaved && p > 1 && s == 0)
                act = Bytes(static_cast<std::int64_t>(static_cast<double>(act.count()) *
                                                      (1.0 + static_cast<double>(p - 1) / static_cast<double>(p * c.vpp))));
            m.activations = act;
            // Gathered parameters (16-bit): ZeRO-3 keeps the layer in use plus the
            // prefetch bucket, capped by max live parameters; FSDP the current and
            // the prefetched unit (BACKWARD_PRE); SHARD_GRAD_OP keeps them all
            // between forward and backward.
            if (c.zero == 3) {
                const std::int64_t live = std::min(c.zero3_max_live_elements, checked_add(largest_layer_params, c.zero3_prefetch_elements));
                m.gathered_params = half_unit * live;
            } else if (c.fsdp == Fsdp::Full || c.fsdp == Fsdp::Hybrid) {
                m.gathered_params = half_unit * checked_mul(2, largest_layer_params);
            } else if (c.fsdp == Fsdp::GradOp) {
                m.gathered_params = half_unit * m.params;
            }
            // Communication buffers.
            if (lay.dp > 1) {
                if (c.zero == 0 && c.fsdp == Fsdp::None && !c.distributed_optimizer)
                    // torch DDP copies gradients into flat buckets (gradient_as_bucket_view=False).
                    m.comm_buffers += frac(job.grads, m.params);
                else if (c.zero == 1 || c.zero == 2)
                    // DeepSpeed contiguous_gradients: one reduce bucket of reduce_bucket_size elements.
                    m.comm_buffers += half_unit * std::min(c.zero_bucket_elements, m.params);
                else if (c.zero == 3)
                    m.comm_buffers += half_unit * std::min(c.zero_bucket_elements, m.params);
                else if (c.fsdp != Fsdp::None)
                    // reduce-scatter input: one unit's unsharded gradients.
                    m.comm_buffers += dtype_bytes(job.tdt, largest_layer_params);
            }
            if (p > 1) m.comm_buffers += hidden_tok * 2;  // pipeline send + receive of [b, s, h]
            m.transient = (a.head || p == 1) ? single_gpu_transient.ceil_div(t) : hidden_tok * 4;
        } else {
            m.weights = frac(job.weights, m.params);
            m.transient = single_gpu_transient.ceil_div(t);
        }
        m.allocated = m.weights + m.gradients + m.optimizer_states + m.activations + m.gathered_params + m.comm_buffers + m.transient;
        res.stages.push_back(m);
    }
    for (std::size_t i = 1; i < res.stages.size(); ++i)
        if (res.stages[i].allocated > res.stages[static_cast<std::size_t>(res.most_loaded)].allocated) res.most_loaded = static_cast<std::int64_t>(i);

    // NCCL keeps its buffers outside the caching allocator, per communicator.
    std::int64_t comms = 0;
    for (auto n : {lay.dp, t, p, c.cp, c.ep})
        if (n > 1) ++comms;
    res.nccl_outside = c.nccl_per_communicator * comms;

    // Offload: CPU (or NVMe) per node.
    const std::int64_t ranks = lay.gpus_per_node;
    const StageMemory& ml = res.stages[static_cast<std::size_t>(res.most_loaded)];
    if (job.train && c.offload_optimizer != Offload::None) {
        // fp32 states + master weights, plus fp32 gradients DeepSpeed keeps on the CPU for the update.
        const Bytes states = shard_bytes(job.opt_states + job.master, ml.params, 0, true) +
                             shard_bytes(dtype_bytes(DType::F32, job.trainable_params), ml.params, 0, true);
        if (c.offload_optimizer == Offload::Cpu) res.cpu_per_node += states * ranks;
        else {
            res.nvme_per_node += states * ranks;
            res.cpu_per_node += half_unit * checked_mul(4, c.zero_bucket_elements) * ranks;  // pinned swap buffers
        }
    }
    if (c.offload_params != Offload::None) {
        const Bytes params = shard_bytes(job.weights, ml.params, 0, true);
        if (c.offload_params == Offload::Cpu) res.cpu_per_node += params * ranks;
        else res.nvme_per_node += params * ranks;
    }

    // Communication volume per optimizer step and GPU (ring all-reduce moves
    // 2 (n-1)/n of the buffer; seed 002: TP 8bsh, DP 16h^2 per layer, PP 2bsh).
    auto ring = [](Bytes b, std::int64_t n) { return n > 1 ? Bytes(b.count() / n * (n - 1) * 2) : Bytes(0); };
    const std::int64_t m_b = lay.micro_batches;
    if (g.transformer && job.train) {
        const Bytes act_tok = dtype_bytes(job.lowered, checked_mul(checked_mul(job.req.batch, s_local), g.transformer->hidden));
        res.comm.tp_per_step = ring(act_tok, t) * checked_mul(4, ml.layers) * m_b;  // 2 all-reduces forward, 2 backward
        res.comm.pp_per_step = p > 1 ? act_tok * 2 * m_b : Bytes(0);
        res.comm.cp_per_step = c.cp > 1 ? ring(act_tok, c.cp) * ml.layers * m_b : Bytes(0);
        res.comm.ep_per_step = c.ep > 1 ? act_tok * checked_mul(4, std::max<std::int64_t>(1, g.transformer->experts_per_token)) * ml.layers * m_b
                                        : Bytes(0);
    }
    if (job.train) res.comm.dp_per_step = ring(frac(job.grads, ml.params), lay.dp) + (zero3 ? frac(job.weights, ml.params) : Bytes(0));

    res.notes.push_back("layout: dp " + std::to_string(lay.dp) + " x tp " + std::to_string(t) + " x pp " + std::to_string(p) + " x cp " +
                        std::to_string(c.cp) + (c.ep > 1 ? " (ep " + std::to_string(c.ep) + ")" : "") + " on " + std::to_string(c.gpus) +
                        " GPUs, " + std::to_string(lay.gpus_per_node) + " per node");
    if (c.capacity_factor != 1.0)
        res.notes.push_back("routed-expert activations scaled by the capacity factor " + std::to_string(c.capacity_factor));
    (void)w_unit;
    return res;
}

}  // namespace gpumem
