// Compute, time and cost of a job (docs/compute.md has the formulas, the
// calibrated efficiencies with their fit and residuals, and the link speeds).
//
// FLOPs come from the graph's per-op forward FLOPs (b*(c0 + c1*s + c2*s^2)):
//   forward  F  = sum over blocks (repeat x sum over ops)
//   backward 2F (input and weight gradients; Kaplan et al. 2020 / Narayanan
//               et al. 2021's 6ND); a frozen linear (LoRA/QLoRA base, frozen
//               parameters) computes input gradients only: 1x its forward
//   recompute full: + F of the checkpointed (transformer layer) blocks
//             selective: + F of the attention-core ops (flag kAttnCore)
//   LoRA adapters: forward r*(in+out)/(in*out) of the target linear, backward 2x
// Routed-expert ops carry top-k rows (per_token(K*h) inputs), so MoE FLOPs are
// those of the active parameters. Attention counts the full s x s scores
// (PaLM / Megatron accounting); causal fused kernels execute half of them,
// which the time model uses.
// --params jobs have no graph: 6ND, 8ND with full recompute.
#include "gpumem/plan/compute.hpp"
#include "gpumem/sim/simulate.hpp"
#include "gpumem/model/load.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "gpumem/memory/activations.hpp"

namespace gpumem {

namespace {

std::string num(double v, int prec = 3) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*g", prec, v);
    return buf;
}

double ext(const Extent& e, double b, double s) {
    return b * (static_cast<double>(e.c0) + static_cast<double>(e.c1) * s + static_cast<double>(e.c2) * s * s);
}

// An op's FLOPs on the sequences its tensors live on (SeqAxis): an
// encoder-decoder model's decoder side runs s_dec tokens; an op touching
// cross-attention scores (the scores matmul, softmax, the weighted sum) works
// on s_dec queries x s keys (memory/activations.cpp query_len / key_len).
double op_ext(const Block& blk, const Op& op, double b, double s, double s_dec) {
    if (s_dec == s || op.outputs.empty()) return ext(op.flops, b, s);
    SeqAxis a = blk.tensors[static_cast<std::size_t>(op.outputs.front())].axis;
    for (auto t : op.inputs)
        if (blk.tensors[static_cast<std::size_t>(t)].axis == SeqAxis::Cross) a = SeqAxis::Cross;
    if (a == SeqAxis::Main) return ext(op.flops, b, s);
    const Extent& e = op.flops;
    const double k = a == SeqAxis::Cross ? s : s_dec;
    return b * (static_cast<double>(e.c0) + static_cast<double>(e.c1) * s_dec + static_cast<double>(e.c2) * s_dec * k);
}

DType compute_dtype(Precision p) {
    switch (p) {
        case Precision::FP32: return DType::F32;
        case Precision::FP16:
        case Precision::AmpFP16: return DType::F16;
        case Precision::BF16:
        case Precision::AmpBF16: return DType::BF16;
    }
    return DType::BF16;
}

bool is(const GpuSpec& g, const char* name) { return g.name.rfind(name, 0) == 0; }

// Parameters doing work per token: routed experts (weights with count = E) count K/E.
double active_params(const ModelGraph& g) {
    if (g.params_only > 0) return static_cast<double>(g.params_only);
    const std::int64_t E = g.transformer ? g.transformer->experts : 0;
    const std::int64_t K = g.transformer ? g.transformer->experts_per_token : 0;
    double n = 0;
    for (const auto& blk : g.blocks)
        for (const auto& p : blk.params) {
            double v = static_cast<double>(p.numel()) * static_cast<double>(blk.repeat);
            if (E > 1 && K > 0 && p.component == Component::Experts && p.count == E) v *= static_cast<double>(K) / static_cast<double>(E);
            n += v;
        }
    return n;
}

// Routed-expert weight bytes (as stored, quantization included).
double expert_weight_bytes(const ModelGraph& g, const Job& job) {
    const std::int64_t E = g.transformer ? g.transformer->experts : 0;
    if (E <= 1) return 0;
    double bytes = 0;
    for (const auto& blk : g.blocks)
        for (const auto& p : blk.params)
            if (p.component == Component::Experts && p.count == E)
                bytes += static_cast<double>(quantized_bytes(job, p).count()) * static_cast<double>(blk.repeat);
    return bytes;
}

double bytes_per_element(DType t) { return static_cast<double>(dtype_bytes(t, 1 << 20).count()) / static_cast<double>(1 << 20); }

Error bad(const std::string& field, const std::string& msg) { return Error{ErrorCode::InvalidArgument, msg, field}; }

// Per micro-batch work of one virtual pipeline stage on one GPU, by the rate
// it runs at.
struct ChunkWork {
    double gemm = 0;       // FLOPs at the 16-bit (or fp32/tf32) GEMM rate: forward, backward, recompute
    double gemm_fp8 = 0;   // linears' FLOPs at the FP8 rate (--fp8)
    double attn = 0;       // fused attention kernels: FLOPs executed (causal half skipped)
    double flops = 0;      // everything as counted (full scores), for the job total
    std::int64_t layers = 0, moe_layers = 0;
    bool first = false, last = false;  // holds the embedding / the output layer
};

// The work of every virtual stage (pp x vpp entries) for a micro-batch of
// b sequences of s tokens, split over tp (and cp, which divides the tokens).
std::vector<ChunkWork> chunk_work(const ModelGraph& g, const Job& job, const std::vector<std::vector<std::int32_t>>& stage_of, double b,
                                  double s, bool fp8, bool include_backward) {
    const Layout& lay = job.layout;
    const std::int64_t vstages = std::max<std::int64_t>(1, lay.virtual_stages());
    const double split = static_cast<double>(std::max<std::int64_t>(1, lay.cfg.tp) * std::max<std::int64_t>(1, lay.cfg.cp));
    const bool flash = job.req.attention == Attention::Flash;
    // The decoder's tokens per sample of an encoder-decoder model (training: --decoder-seq).
    const double s_dec = job.actx.decoder_seq > 0 && job.seq > 0
                             ? s * static_cast<double>(job.req.decoder_seq.value_or(job.seq)) / static_cast<double>(job.seq)
                             : s;
    std::vector<ChunkWork> out(static_cast<std::size_t>(vstages));
    for (std::size_t bi = 0; bi < g.blocks.size(); ++bi) {
        const Block& blk = g.blocks[bi];
        // Fraction of the block's attention that is causal (decoder self-attention).
        double causal = 0;
        for (const auto& a : blk.attention) causal += a.causal ? 1.0 : 0.0;
        if (!blk.attention.empty()) causal /= static_cast<double>(blk.attention.size());
        const double executed = 1.0 - 0.5 * causal;
        bool moe = false;
        ChunkWork one;  // one instance
        double fwd_gemm = 0, fwd_fp8 = 0, fwd_attn = 0;
        for (const auto& op : blk.ops) {
            moe = moe || op.kind == OpKind::Experts || op.kind == OpKind::Router;
            const double fw = op_ext(blk, op, b, s, s_dec) / split;
            if (fw == 0) continue;
            bool frozen = false;
            if (op.kind == OpKind::Linear || op.kind == OpKind::Conv2d || op.kind == OpKind::Embedding) {
                frozen = job.lora;
                if (!frozen && !op.params.empty()) {
                    frozen = true;
                    for (auto pi : op.params)
                        if (blk.params[static_cast<std::size_t>(pi)].trainable) frozen = false;
                }
            }
            const double bwd = include_backward ? (frozen ? fw : 2 * fw) : 0.0;
            one.flops += fw + bwd;
            const bool core = (op.flags & kAttnCore) != 0;
            if (core && flash) {
                one.attn += (fw + bwd) * executed;
                fwd_attn += fw * executed;
            } else if (fp8 && (op.kind == OpKind::Linear || op.kind == OpKind::Experts)) {
                one.gemm_fp8 += fw + bwd;
                fwd_fp8 += fw;
            } else {
                one.gemm += fw + bwd;
                fwd_gemm += fw;
            }
            // Selective recompute rebuilds the eager attention core (fused kernels
            // keep no scores: their backward's own recompute is in the kernel).
            if (core && !flash && include_backward && job.req.recompute == Recompute::Selective) {
                one.flops += fw;
                one.gemm += fw;
            }
            if (job.lora && op.kind == OpKind::Linear && op.in_features > 0 && op.out_features > 0 && lora_applies(op, job.req.lora_targets)) {
                const double in = static_cast<double>(op.in_features), outf = static_cast<double>(op.out_features);
                const double a = fw * static_cast<double>(job.req.lora_rank) * (in + outf) / (in * outf);
                one.flops += include_backward ? 3 * a : a;
                one.gemm += include_backward ? 3 * a : a;
                fwd_gemm += a;
            }
        }
        // Full recompute: one more forward of each checkpointed layer (every
        // N-th with --recompute-every); op-level selective: the matmuls whose
        // outputs were not kept (every other one), attention kept.
        if (include_backward && blk.checkpointable && (job.req.recompute == Recompute::Full || job.req.recompute == Recompute::Ops)) {
            // (Megatron uniform chunks: every layer is rebuilt; block: the first N)
            const std::int64_t rebuilt = recompute_group(job.actx) > 1 ? blk.repeat : checkpointed_count(blk.repeat, job.actx);
            const double share = static_cast<double>(rebuilt) / static_cast<double>(std::max<std::int64_t>(1, blk.repeat));
            const bool ops = job.req.recompute == Recompute::Ops;
            const double gm = (ops ? 0.5 : 1.0) * share;
            one.gemm += gm * fwd_gemm;
            one.gemm_fp8 += gm * fwd_fp8;
            if (!ops) one.attn += share * fwd_attn;
            one.flops += gm * (fwd_gemm + fwd_fp8) + (ops || executed <= 0 ? 0.0 : share * fwd_attn / executed);
        }
        for (std::size_t k = 0; k < static_cast<std::size_t>(blk.repeat); ++k) {
            const std::int32_t v = bi < stage_of.size() && k < stage_of[bi].size() ? stage_of[bi][k] : 0;
            ChunkWork& c = out[static_cast<std::size_t>(std::clamp<std::int64_t>(v, 0, vstages - 1))];
            c.gemm += one.gemm;
            c.gemm_fp8 += one.gemm_fp8;
            c.attn += one.attn;
            c.flops += one.flops;
            if (blk.checkpointable) {
                ++c.layers;
                if (moe) ++c.moe_layers;
            } else if (bi == 0) {
                c.first = true;
            } else {
                c.last = true;
            }
        }
    }
    return out;
}

// Overlapped communication: what the compute it hides behind does not cover,
// never less than a tenth (the last bucket / chunk cannot overlap).
double exposed(double comm, double window) { return comm > 0 ? std::max(0.1 * comm, comm - window) : 0.0; }

}  // namespace

double default_intra_node_gbs(const GpuSpec& g) {
    // Per GPU and direction (the bidirectional datasheet figure / 2).
    if (is(g, "V100")) return 150;                       // NVLink 2: 6 links x 25 GB/s (300 bidirectional)
    if (is(g, "A100")) return 300;                       // NVLink 3: 12 x 25 GB/s (600 bidirectional)
    if (is(g, "H100") || is(g, "H200")) return 450;      // NVLink 4: 18 x 25 GB/s (900 bidirectional)
    if (is(g, "B200") || is(g, "GB200")) return 900;     // NVLink 5: 1.8 TB/s bidirectional
    if (is(g, "MI300X")) return 448;                     // Infinity Fabric: 7 x 64 GB/s
    if (is(g, "T4")) return 16;                          // PCIe Gen3 x16
    return 32;                                           // PCIe Gen4 x16 (L4, L40S, A10G, RTX 3090/4090)
}

double default_inter_node_gbs(const GpuSpec& g) {
    // One NIC per GPU in the reference systems, per direction.
    if (is(g, "V100")) return 6.25;   // DGX-2: 8 x 100 Gb/s EDR InfiniBand for 16 GPUs
    if (is(g, "A100")) return 25;     // DGX A100: 8 x 200 Gb/s HDR InfiniBand (ConnectX-6) for 8 GPUs
    if (is(g, "T4") || is(g, "L4") || is(g, "A10G") || is(g, "RTX")) return 12.5;  // 100 Gb/s Ethernet (cloud instances)
    return 50;                        // 400 Gb/s NDR InfiniBand / RoCE (ConnectX-7) per GPU: DGX/HGX H100, H200, B200, MI300X
}

ComputeEfficiency default_efficiency(const GpuSpec& g, DType compute) {
    // Fitted by tools/calibrate_time.cpp on the published runs (docs/compute.md):
    // median |error| 6.7%, p90 20.7% over 151 runs. Attention efficiencies
    // are on the FLOPs the fused kernel executes (half the scores when causal)
    // with a backward counted as 2x the forward.
    if (compute == DType::F32) return {0.60, 0, 0.60, "assumption: fp32 CUDA-core GEMMs run close to peak"};
    if (g.arch == "hopper") return {0.585, 0.625, 0.165, "fit to 67 published H100/H200 runs (docs/compute.md)"};
    if (g.arch == "ampere" && g.compute_capability == 80) return {0.67, 0, 0.35, "fit to 80 published A100 runs (docs/compute.md)"};
    if (g.arch == "volta") return {0.735, 0, 0.30, "fit to 4 published V100 runs (docs/compute.md); attention: assumption"};
    if (g.arch == "blackwell") return {0.585, 0.625, 0.165, "assumption: the H100 fit (no published runs with full settings in the fixture)"};
    if (g.arch == "cdna3") return {0.40, 0.40, 0.15, "assumption: measured MI300X BF16 GEMMs reach about half of the datasheet peak"};
    if (is(g, "L4") || is(g, "T4")) return {0.35, 0.35, 0.20, "assumption: 70-72 W cards lower their clocks under sustained tensor-core load"};
    return {0.45, 0.45, 0.30, "assumption: GDDR cards, the A100 fit lowered"};
}

Result<ComputeResult> compute_time(const ModelGraph& g_in, const Job& job, const EstimateResult& memory, const ComputeOptions& opt) {
    const ModelGraph& g = job_graph(g_in, job);
    // ---- validation -------------------------------------------------------------------
    if (opt.mfu && !(*opt.mfu > 0 && *opt.mfu <= 1))
        return bad("mfu", "--mfu must be in (0, 1] (got " + num(*opt.mfu) + ")");
    if (opt.achieved_tflops && !(*opt.achieved_tflops > 0 && std::isfinite(*opt.achieved_tflops)))
        return bad("achieved-tflops", "--achieved-tflops must be a positive number of TFLOP/s per GPU (got " + num(*opt.achieved_tflops) + ")");
    if (opt.mfu && opt.achieved_tflops)
        return bad("mfu", "--mfu and --achieved-tflops both set the throughput: give one");
    for (const auto& [v, name] : {std::pair{opt.gemm_efficiency, "gemm-efficiency"}, std::pair{opt.attention_efficiency, "attention-efficiency"},
                                  std::pair{opt.fp8_efficiency, "fp8-efficiency"}})
        if (v && !(*v > 0 && *v <= 1)) return bad(name, std::string("--") + name + " must be in (0, 1] (got " + num(*v) + ")");
    if (opt.tokens && !(*opt.tokens > 0 && std::isfinite(*opt.tokens)))
        return bad("tokens", "--tokens must be a positive number of tokens (got " + num(*opt.tokens) + ")");
    if (opt.price_per_gpu_hour && !(*opt.price_per_gpu_hour >= 0 && std::isfinite(*opt.price_per_gpu_hour)))
        return bad("price-per-gpu-hour", "--price-per-gpu-hour must be >= 0 (got " + num(*opt.price_per_gpu_hour) + ")");
    if (opt.nvlink_gbs && !(*opt.nvlink_gbs > 0 && std::isfinite(*opt.nvlink_gbs)))
        return bad("nvlink-gbs", "--nvlink-gbs must be a positive bandwidth in GB/s per GPU (got " + num(*opt.nvlink_gbs) + ")");
    if (opt.ib_gbs && !(*opt.ib_gbs > 0 && std::isfinite(*opt.ib_gbs)))
        return bad("ib-gbs", "--ib-gbs must be a positive bandwidth in GB/s per GPU (got " + num(*opt.ib_gbs) + ")");
    if (opt.seq && *opt.seq < 1) return bad("seq", "--seq must be a positive integer (got " + std::to_string(*opt.seq) + ")");

    ComputeResult r;
    const GpuSpec& gpu = job.gpu;
    const Layout& lay = job.layout;
    const ParallelConfig& pc = lay.cfg;
    const double gpus = static_cast<double>(std::max<std::int64_t>(1, pc.gpus));
    const double dp = static_cast<double>(std::max<std::int64_t>(1, lay.dp));
    const double m = static_cast<double>(std::max<std::int64_t>(1, lay.micro_batches));
    const double b = static_cast<double>(job.req.batch);
    const bool params_only = g.params_only > 0;
    const double s = params_only ? static_cast<double>(opt.seq.value_or(2048)) : static_cast<double>(job.seq);
    if (params_only)
        r.assumptions.push_back("--params: no graph, FLOPs from the parameter count (" + std::string(job.train ? "6ND, 8ND with full recompute" : "2N per token") +
                                ") at " + num(s, 10) + " tokens per sample" + (opt.seq ? "" : " (default 2048)"));

    // ---- peak and efficiencies --------------------------------------------------------
    DType cdt = compute_dtype(job.prec);
    std::string prec_name;
    double peak = 0;
    if (cdt == DType::BF16 && gpu.tflops_bf16 <= 0) {
        r.assumptions.push_back(gpu.name + " has no bf16 tensor cores: bf16 matmuls run at the fp32 rate");
        cdt = DType::F32;
    }
    bool tensor = true;
    if (cdt == DType::F16) { peak = gpu.tflops_fp16; prec_name = "fp16"; }
    else if (cdt == DType::BF16) { peak = gpu.tflops_bf16; prec_name = "bf16"; }
    else if (opt.tf32 && gpu.tflops_tf32 > 0) { peak = gpu.tflops_tf32; prec_name = "tf32"; }
    else {
        peak = gpu.tflops_fp32;
        prec_name = "fp32";
        tensor = false;
        if (job.prec == Precision::FP32 && gpu.tflops_tf32 > gpu.tflops_fp32)
            r.assumptions.push_back("fp32 matmuls on CUDA cores (PyTorch's default allow_tf32=False since 1.12); pass --tf32 if the run enables TF32");
    }
    r.peak_tflops = peak;
    const ComputeEfficiency eff = default_efficiency(gpu, tensor ? DType::BF16 : DType::F32);
    const double eta_gemm = opt.gemm_efficiency.value_or(eff.gemm);
    const double eta_attn = opt.attention_efficiency.value_or(eff.attention);
    const bool want_fp8 = opt.fp8 || job.req.fp8_recipe != Fp8Recipe::None;
    const bool fp8 = want_fp8 && tensor && gpu.tflops_fp8 > 0 && !params_only;
    if (want_fp8 && !fp8)
        r.assumptions.push_back("--fp8 ignored: " + (params_only ? std::string("--params jobs have no linears to run in FP8") : gpu.name + " has no FP8 tensor cores"));
    const double eta_fp8 = opt.fp8_efficiency.value_or(eff.gemm_fp8 > 0 ? eff.gemm_fp8 : eff.gemm);
    r.gemm_efficiency = eta_gemm;
    r.attention_efficiency = eta_attn;
    r.efficiency_source = opt.gemm_efficiency || opt.attention_efficiency || opt.fp8_efficiency ? "given" : eff.source;
    const double rate_gemm = peak * 1e12 * eta_gemm, rate_attn = peak * 1e12 * eta_attn;
    const double rate_fp8 = gpu.tflops_fp8 * 1e12 * eta_fp8;
    const double hbm = gpu.bandwidth_gbs * 1e9 * 0.8;  // memory-bound kernels: ~80% of the datasheet bandwidth
    // GEMMs of one micro-batch on one GPU are M = b*s/cp tokens by about
    // N = h/tp features: small dimensions leave tensor-core tiles (128 wide)
    // partly empty and the launch overhead uncovered, D/(D + 128) per dimension
    // (assumption; the calibration is done with it). Attention kernels see
    // the same token count.
    const double tile = 128.0;
    const double m_tok = std::max(1.0, static_cast<double>(job.req.batch) * (params_only ? static_cast<double>(opt.seq.value_or(2048)) : static_cast<double>(job.seq)) /
                                           static_cast<double>(std::max<std::int64_t>(1, pc.cp)));
    const double n_feat = g.transformer ? std::max(1.0, static_cast<double>(g.transformer->hidden) / static_cast<double>(std::max<std::int64_t>(1, pc.tp))) : 4096.0;
    const double shape_m = m_tok / (m_tok + tile), shape = shape_m * n_feat / (n_feat + tile);
    const double gemm_rate = rate_gemm * shape, fp8_rate = rate_fp8 * shape, attn_rate = rate_attn * shape_m;
    auto seconds = [&](const ChunkWork& c) {
        return c.gemm / gemm_rate + (c.gemm_fp8 > 0 ? c.gemm_fp8 / fp8_rate : 0.0) + c.attn / attn_rate;
    };
    // Links: NCCL reaches about 80% of the nominal bandwidth (nccl-tests bus bandwidth).
    const double link_eff = 0.8;
    const double intra = opt.nvlink_gbs.value_or(default_intra_node_gbs(gpu)) * 1e9 * link_eff;
    const double inter = opt.ib_gbs.value_or(default_inter_node_gbs(gpu)) * 1e9 * link_eff;
    const double domain = static_cast<double>(std::max<std::int64_t>(1, lay.gpus_per_node));
    // A collective over n ranks placed `stride` GPUs apart (Megatron's rank
    // order: tp innermost, then cp, ep within dp, pp outermost): inside one
    // NVLink domain it runs at the intra-node rate; across nodes NCCL's rings
    // cross each node once per channel, so a node's k ranks of the group share
    // k NICs' worth of inter-node bandwidth (capped by NVLink).
    auto coll_bw = [&](double n, double stride) {
        if (n <= 1 || n * stride <= domain) return intra;
        const double per_node = stride < domain ? std::floor(domain / stride) : 1.0;
        return std::min(intra, std::max(1.0, per_node) * inter);
    };
    // Latency of one step of a ring (or one message): NCCL's small-message
    // latency plus the launch, about 3 us inside a node and 10 us across
    // nodes (assumption; nccl-tests small-message timings are of this order).
    auto hop = [&](double n, double stride) { return n * stride <= domain ? 3e-6 : 10e-6; };
    auto log2n = [](double n) { return n > 1 ? std::ceil(std::log2(n)) : 0.0; };

    // ---- FLOPs ------------------------------------------------------------------------
    r.active_params = active_params(g);
    const double N = r.active_params;
    const std::vector<std::vector<std::int32_t>> stage_of = params_only ? std::vector<std::vector<std::int32_t>>{} : assign_virtual_stages(g, lay);
    const double tp = static_cast<double>(std::max<std::int64_t>(1, pc.tp)), cp = static_cast<double>(std::max<std::int64_t>(1, pc.cp));
    const double ep = static_cast<double>(std::max<std::int64_t>(1, pc.ep));
    const std::int64_t pp = std::max<std::int64_t>(1, pc.pp), vpp = std::max<std::int64_t>(1, lay.vpp);

    if (job.train) {
        // Per micro-batch work of every virtual stage on one GPU.
        std::vector<ChunkWork> work;
        if (params_only) {
            const double tok = b * s / (tp * cp);
            const double full = job.req.recompute == Recompute::Full ? 2 : 0;
            ChunkWork c;
            c.flops = c.gemm = (6 + full) * N * tok / static_cast<double>(pp);
            work.assign(static_cast<std::size_t>(pp * vpp), ChunkWork{});
            for (std::size_t i = 0; i < static_cast<std::size_t>(pp); ++i) work[i] = c;
            if (job.req.recompute == Recompute::Selective)
                r.assumptions.push_back("--params: selective recompute's attention-core FLOPs are not known without a graph (counted as 6ND)");
        } else {
            work = chunk_work(g, job, stage_of, b, s, fp8, true);
            if (job.lora) r.assumptions.push_back("LoRA: frozen base linears compute input gradients only (backward 1x forward), adapters 2x");
            if (g.transformer && g.transformer->experts > 0)
                r.assumptions.push_back("MoE: routed experts counted at top-" + std::to_string(g.transformer->experts_per_token) + " of " +
                                        std::to_string(g.transformer->experts) + ", tokens spread evenly (capacity-factor padding not counted)");
        }
        double per_mb_all = 0;
        for (const auto& c : work) per_mb_all += c.flops;
        r.flops_per_step = per_mb_all * tp * cp * m * dp;
        r.tokens_per_step = b * (g.has_sequence || params_only ? s : 1) * m * dp;
        r.flops_per_token = r.tokens_per_step > 0 ? r.flops_per_step / r.tokens_per_step : 0;
        r.model_flops_per_step = (job.lora ? 4 : 6) * N * r.tokens_per_step;
        if (job.lora) r.assumptions.push_back("LoRA model FLOPs: 4ND (no weight gradients of the frozen base)");
        if (!g.has_sequence && !params_only) r.assumptions.push_back("fixed-shape model: \"tokens\" are samples");

        // ---- one micro-batch on each rank: compute + exposed in-stage communication ---
        const double lowered = bytes_per_element(job.lowered);
        const double hidden = g.transformer ? static_cast<double>(g.transformer->hidden) : 0.0;
        const double act = b * (s / cp) * hidden * lowered;  // [b, s/cp, h] of one rank's tokens
        const bool full_rc = job.req.recompute == Recompute::Full;
        double t_tp_layer = 0, t_cp_layer = 0, t_ep_layer = 0, t_p2p = 0;
        if (g.transformer && tp > 1)  // 2 all-reduces (or all-gather + reduce-scatter pairs) forward, 2 backward, 2 more recomputed
            t_tp_layer = (4.0 + (full_rc ? 2.0 : 0.0)) * (2.0 * (tp - 1) / tp * act / coll_bw(tp, 1) + 2.0 * log2n(tp) * hop(tp, 1));
        if (g.transformer && cp > 1) {
            // Ring attention: each rank's K and V go round the cp ring forward; K, V and their gradients backward.
            const TransformerDims& d = *g.transformer;
            const double kv_heads = std::max(1.0, std::ceil(static_cast<double>(std::max<std::int64_t>(1, d.kv_heads)) / tp));
            const double kv = 2.0 * b * (s / cp) * kv_heads * static_cast<double>(d.head_dim) * lowered;
            t_cp_layer = 3.0 * (cp - 1) * (kv / coll_bw(cp, tp) + hop(cp, tp));  // cp-1 ring steps, each a message
        }
        if (g.transformer && ep > 1) {  // all-to-all dispatch and combine, forward and backward
            const double k = static_cast<double>(std::max<std::int64_t>(1, g.transformer->experts_per_token));
            t_ep_layer = 4.0 * (act * k / (pc.sp ? tp : 1.0) * (ep - 1) / ep / coll_bw(ep, tp * cp) + hop(ep, tp * cp));
        }
        if (pp > 1)  // activation forward, its gradient backward, per chunk boundary
            t_p2p = 2.0 * (act / (pc.sp ? tp : 1.0) / (tp * cp * dp < domain ? intra : inter) + hop(2, tp * cp * dp));  // the next stage is tp*cp*dp GPUs away
        std::vector<double> rank_time(static_cast<std::size_t>(pp), 0.0), rank_compute(static_cast<std::size_t>(pp), 0.0);
        std::vector<TimeBreakdown> rank_parts(static_cast<std::size_t>(pp));
        double tp_total = 0, cp_total = 0, ep_total = 0, pp_total = 0;
        for (std::size_t v = 0; v < work.size(); ++v) {
            const ChunkWork& c = work[v];
            const std::size_t rr = v % static_cast<std::size_t>(pp);
            const double comp = seconds(c);
            const double gemm_time = c.gemm / gemm_rate + (c.gemm_fp8 > 0 ? c.gemm_fp8 / fp8_rate : 0.0);
            const double l = static_cast<double>(c.layers);
            const double t_tp = t_tp_layer * l, t_cp = t_cp_layer * l, t_ep = t_ep_layer * static_cast<double>(c.moe_layers);
            const double t_pp = (c.layers > 0 || c.first || c.last) && pp > 1 ? t_p2p : 0.0;
            TimeBreakdown& tb = rank_parts[rr];
            tb.compute += comp;
            tb.tp += opt.tp_comm_overlap ? exposed(t_tp, gemm_time) : t_tp;
            tb.cp += exposed(t_cp, c.attn / attn_rate);  // the ring exchange hides behind the attention blocks
            tb.ep += t_ep;
            tb.pp += t_pp;
            if (rr == 0) {
                tp_total += t_tp * static_cast<double>(pp);
                cp_total += t_cp * static_cast<double>(pp);
                ep_total += t_ep * static_cast<double>(pp);
                pp_total += t_pp * static_cast<double>(pp);
            }
        }
        std::size_t slow = 0;
        double sum = 0;
        for (std::size_t rr = 0; rr < rank_parts.size(); ++rr) {
            const TimeBreakdown& tb = rank_parts[rr];
            rank_compute[rr] = tb.compute;
            rank_time[rr] = tb.compute + tb.tp + tb.cp + tb.ep + tb.pp;
            sum += rank_time[rr];
            if (rank_time[rr] > rank_time[slow]) slow = rr;
        }
        TimeBreakdown& br = r.breakdown;
        const TimeBreakdown& ts = rank_parts[slow];
        br.compute = m * ts.compute;
        br.tp = m * ts.tp;
        br.cp = m * ts.cp;
        br.ep = m * ts.ep;
        br.pp = m * ts.pp;
        // 1F1B: m micro-batches on the slowest rank plus the others' time once
        // (fill and drain); interleaving divides the fill by vpp (Narayanan et
        // al. 2021 section 2.2: bubble (p-1)/(v m) of the ideal time).
        br.bubble = pp > 1 ? (sum - rank_time[slow]) / static_cast<double>(vpp) : 0.0;

        // ---- data parallelism ----------------------------------------------------------
        const bool sharded_params = pc.zero == 3 || pc.fsdp == Fsdp::Full || pc.fsdp == Fsdp::Hybrid || pc.fsdp == Fsdp::GradOp;
        double grad_bytes = 0, weight16 = 0, expert_grad = 0, expert_w16 = 0, state_bytes = 0;
        if (!params_only) {
            const auto tensors = rank_tensors(g, job, stage_of, static_cast<std::int64_t>(slow));
            for (const auto& t : tensors) {
                if (!t.trainable) continue;
                const bool is_expert = t.block >= 0 && t.param >= 0 &&
                                       g.blocks[static_cast<std::size_t>(t.block)].params[static_cast<std::size_t>(t.param)].component == Component::Experts;
                const double gbytes = static_cast<double>(dtype_bytes(job.tdt, t.elems).count()) * static_cast<double>(t.copies);
                const double wbytes = static_cast<double>(dtype_bytes(job.half, t.elems).count()) * static_cast<double>(t.copies);
                (is_expert ? expert_grad : grad_bytes) += gbytes;
                (is_expert ? expert_w16 : weight16) += wbytes;
            }
        } else if (job.train && !job.lora) {
            grad_bytes = static_cast<double>(dtype_bytes(job.tdt, g.params_only).count()) / (tp * static_cast<double>(pp));
            weight16 = static_cast<double>(dtype_bytes(job.half, g.params_only).count()) / (tp * static_cast<double>(pp));
        }
        if (memory.parallel && slow < memory.parallel->stages.size()) {
            const StageMemory& st = memory.parallel->stages[slow];
            state_bytes = static_cast<double>((st.weights + st.gradients + st.optimizer_states + st.paged_optimizer_states).count());
        } else {
            // Paged optimizer states (managed memory) are read and written too.
            state_bytes = static_cast<double>(
                (memory.per_gpu.weights + memory.per_gpu.gradients + memory.per_gpu.optimizer_states + memory.per_gpu.paged_optimizer_states).count());
        }
        const double dp_e = std::max(1.0, dp / ep);
        // Windows the reduction hides behind: the last micro-batch's backward
        // (DDP buckets, Megatron --overlap-grad-reduce, ZeRO overlap_comm), and
        // for the parameter all-gather the first micro-batch's forward.
        const double mb_compute = ts.compute;
        const double bwd_window = mb_compute * 2.0 / 3.0, fwd_window = mb_compute / 3.0;
        double dp_total = 0;
        if (dp > 1 && !job.lora) {
            auto ring_rs = [](double bytes, double n) { return n > 1 ? bytes * (n - 1) / n : 0.0; };
            if (sharded_params) {
                // ZeRO-3 / FSDP: each micro-batch gathers the 16-bit parameters
                // for the forward and again for the backward (not SHARD_GRAD_OP)
                // and reduce-scatters its gradients, overlapped with that
                // micro-batch's compute by prefetching.
                const double gathers = pc.fsdp == Fsdp::GradOp ? 1.0 : 2.0;
                const double shard_n = pc.fsdp == Fsdp::Hybrid ? std::min(dp, std::max(1.0, domain / (tp * cp))) : dp;
                const double vol = gathers * (ring_rs(weight16, shard_n) + ring_rs(expert_w16, std::max(1.0, shard_n / ep))) +
                                   ring_rs(grad_bytes, shard_n) + ring_rs(expert_grad, std::max(1.0, shard_n / ep));
                // Collectives per micro-batch: FSDP one flat parameter per
                // wrapped layer; DeepSpeed ZeRO-3 one all-gather per parameter
                // tensor (and a reduce-scatter bucket per layer), each a ring of
                // shard_n - 1 steps whose latency the prefetch does not hide
                // (Narayanan et al. 2021 Table 2: ZeRO-3 throughput per GPU
                // falls with the micro-batch at 384-2240 GPUs).
                double units = 0, tensors = 0;
                for (std::size_t bi = 0; bi < g.blocks.size() && !params_only; ++bi)
                    for (auto v : stage_of[bi])
                        if (v % pp == static_cast<std::int32_t>(slow)) {
                            units += 1;
                            tensors += static_cast<double>(g.blocks[bi].params.size());
                        }
                const double ring = (shard_n - 1) * hop(shard_n, tp * cp);
                const double t_mb = vol / coll_bw(shard_n, tp * cp) + (pc.zero == 3 ? 0.0 : (gathers + 1) * units * ring);
                const double t_lat = pc.zero == 3 ? (gathers * tensors + units) * ring : 0.0;
                double t_hsdp = 0;
                if (pc.fsdp == Fsdp::Hybrid && dp > shard_n)  // the shard's gradients all-reduced across the replicas once per step
                    t_hsdp = 2.0 * ring_rs((grad_bytes + expert_grad) / shard_n, dp / shard_n) / coll_bw(dp / shard_n, tp * cp * shard_n);
                dp_total = m * (t_mb + t_lat) + t_hsdp;
                br.dp = m * (exposed(t_mb, mb_compute) + t_lat) + exposed(t_hsdp, bwd_window);
            } else {
                const bool rs = pc.zero >= 1 || pc.distributed_optimizer;
                // Gradients: all-reduce (DDP), or reduce-scatter + all-gather of the
                // updated 16-bit parameters (distributed optimizer, ZeRO-1/2).
                const double dbw = coll_bw(dp, tp * cp);
                // Buckets: Megatron's max(40M, 1M x dp) elements, DDP's 25 MB,
                // DeepSpeed's 5e8 elements; each a collective with its latency
                // (reduce-scatter / all-gather rings, all-reduce trees).
                const double elem = bytes_per_element(job.tdt);
                const double bucket = pc.distributed_optimizer ? std::max(40e6, 1e6 * dp) * elem
                                      : pc.zero >= 1            ? static_cast<double>(pc.zero_bucket_elements) * elem
                                                                : static_cast<double>(pc.ddp_bucket.count());
                const double buckets = std::ceil((grad_bytes + expert_grad) / std::max(1.0, bucket));
                const double lat = rs ? (dp - 1) * hop(dp, tp * cp) : 2.0 * log2n(dp) * hop(dp, tp * cp);
                const double t_grad = ((rs ? 1.0 : 2.0) * ring_rs(grad_bytes, dp) + (rs ? 1.0 : 2.0) * ring_rs(expert_grad, dp_e)) / dbw + buckets * lat;
                const double t_param = rs ? (ring_rs(weight16, dp) + ring_rs(expert_w16, dp_e)) / dbw + buckets * lat : 0.0;
                dp_total = t_grad + t_param;
                br.dp = opt.dp_comm_overlap ? exposed(t_grad, bwd_window) + exposed(t_param, fwd_window) : t_grad + t_param;
            }
        }
        // ---- optimizer step: memory-bound over the rank's shard (read and write) ---------
        if (!(pc.offload_optimizer != Offload::None)) br.optimizer = 2.0 * state_bytes / hbm;
        else {
            // Gradients to the host and parameters back over PCIe (~25 GB/s per
            // GPU, Gen4 x16), the CPU optimizer over the shard at host memory
            // speed (assumption: ~10 GB/s of state per GPU).
            double shard = (grad_bytes + weight16) / std::max(1.0, dp);
            br.offload = 2.0 * shard / 25e9 + 4.0 * shard / 10e9;
        }

        r.compute_seconds = br.compute;
        r.bubble_seconds = br.bubble;
        r.comm_seconds = br.tp + br.cp + br.ep + br.pp + br.dp;
        r.comm_total_seconds = m * (tp_total + cp_total + ep_total + pp_total) / static_cast<double>(pp) + dp_total;
        const double predicted = br.compute + br.tp + br.cp + br.ep + br.pp + br.bubble + br.dp + br.optimizer + br.offload;
        const double peak_all = gpus * peak * 1e12;
        if (opt.achieved_tflops || opt.mfu) {
            // End-to-end throughput given: the step is what it says; bubble and
            // communication are inside it, not added (the model's parts are
            // summarised in comm_total_seconds only).
            if (opt.achieved_tflops) {
                // FLOPs executed per second (recompute included: seed 004's "effective 68 TFLOP/s" with 8ND).
                r.step_seconds = r.flops_per_step / (gpus * *opt.achieved_tflops * 1e12);
                r.mfu = r.step_seconds > 0 ? r.model_flops_per_step / (r.step_seconds * peak_all) : 0;
                r.mfu_source = "--achieved-tflops";
                r.assumptions.push_back("--achieved-tflops is end-to-end throughput on the FLOPs executed (recompute included): communication and pipeline bubble are inside it, not added");
                if (*opt.achieved_tflops > peak)
                    r.assumptions.push_back("--achieved-tflops " + num(*opt.achieved_tflops) + " exceeds " + gpu.name + "'s dense " + prec_name + " peak of " + num(peak) + " TFLOP/s");
            } else {
                r.step_seconds = r.model_flops_per_step / (peak_all * *opt.mfu);
                r.mfu = *opt.mfu;
                r.mfu_source = "--mfu";
                r.assumptions.push_back("--mfu is end-to-end model FLOPs utilisation: the step time is 6ND / (GPUs x peak x " + num(*opt.mfu) +
                                        "); communication and pipeline bubble are inside it, not added");
            }
            r.breakdown = TimeBreakdown{};
            r.breakdown.compute = r.step_seconds;
            r.compute_seconds = r.step_seconds;
            r.bubble_seconds = 0;
            r.comm_seconds = 0;
        } else {
            r.step_seconds = predicted;
            r.mfu = predicted > 0 ? r.model_flops_per_step / (predicted * peak_all) : 0;
            r.mfu_source = "predicted";
            r.assumptions.push_back("compute at " + num(100 * eta_gemm) + "% of the " + prec_name + " peak for GEMMs" +
                                    (fp8 ? ", " + num(100 * eta_fp8) + "% of the FP8 peak for linears" : std::string()) +
                                    (job.req.attention == Attention::Flash ? ", " + num(100 * eta_attn) + "% for fused attention (causal: half the scores)" : std::string()) +
                                    " (" + r.efficiency_source + ")");
            if (lay.cfg.gpus > 1)
                r.assumptions.push_back("links: intra-node " + num(intra / link_eff / 1e9) + " GB/s, inter-node " + num(inter / link_eff / 1e9) +
                                    " GB/s per GPU at 80% (NCCL bus bandwidth); " + std::to_string(lay.gpus_per_node) + " GPUs per NVLink domain; " +
                                    (opt.tp_comm_overlap ? "TP collectives overlapped with the GEMMs" : "TP/EP/PP transfers block (Megatron's defaults)") +
                                    "; CP ring hidden behind attention, " +
                                    (opt.dp_comm_overlap ? "DP reduction behind the last backward except 10%" : "DP reduction after the backward (--no-dp-comm-overlap)"));
        }
        r.tokens_per_second = r.step_seconds > 0 ? r.tokens_per_step / r.step_seconds : 0;
    } else {
        // ---- inference ---------------------------------------------------------------
        const double mp = gpus / dp;  // GPUs one model replica spans
        const double gen = static_cast<double>(job.req.gen_len);
        const double ctx = s + gen / 2.0;  // mean context over the generated tokens
        double prefill = 0, decode_flops_tok = 0;
        if (params_only) {
            prefill = 2 * N * b * s;
            decode_flops_tok = 2 * N;
            r.prefill_seconds = prefill / (mp * rate_gemm);
        } else {
            // The prompt through every pipeline stage in turn (one batch: no
            // overlap between stages), each at the compute-only efficiencies,
            // plus the tensor-parallel all-reduces (2 per layer) that block.
            const std::vector<ChunkWork> work = chunk_work(g, job, stage_of, b, s, fp8, false);
            std::int64_t layers = 0;
            for (const auto& c : work) {
                prefill += c.flops * tp * cp;
                r.prefill_seconds += seconds(c);
                layers += c.layers;
            }
            if (g.transformer && tp > 1)
                r.prefill_seconds += static_cast<double>(layers) * 2.0 * 2.0 * (tp - 1) / tp * b * s / cp * static_cast<double>(g.transformer->hidden) *
                                     bytes_per_element(job.lowered) / coll_bw(tp, 1);
            for (const auto& blk : g.blocks)
                for (const auto& op : blk.ops)
                    decode_flops_tok += static_cast<double>(blk.repeat) *
                                        (static_cast<double>(op.flops.c1) + static_cast<double>(op.flops.c2) * ctx);
        }
        r.flops_per_token = s > 0 ? prefill / (b * s) : 0;
        r.model_flops_per_step = 2 * N * b * s * dp;
        r.mfu = r.prefill_seconds > 0 ? 2 * N * b * s / (r.prefill_seconds * mp * peak * 1e12) : 0;
        r.mfu_source = "predicted (prefill)";

        // Decode: bytes read per step = weights (+ quantization metadata) + KV cache.
        double weights = static_cast<double>(job.weights.count());
        const double experts = expert_weight_bytes(g, job);
        if (experts > 0 && g.transformer) {
            const double K = static_cast<double>(g.transformer->experts_per_token), E = static_cast<double>(g.transformer->experts);
            const double touched = 1 - std::pow(1 - K / E, b);
            weights = weights - experts + experts * touched;
            r.assumptions.push_back("MoE decode: " + num(100 * touched) + "% of expert weights read per step (1-(1-K/E)^batch)");
        }
        double kv = 0;
        if (g.transformer) {
            const DType kvdt = job.req.kv_dtype.value_or(job.lowered);
            kv = static_cast<double>(g.transformer->kv_elements_per_token) * ctx * b * bytes_per_element(kvdt);
        }
        const double bytes = (weights + kv) / tp;  // pipeline stages read theirs one after another
        const double bw_eff = 0.8;
        const double t_mem = bytes / (gpu.bandwidth_gbs * 1e9 * bw_eff);
        const double t_cmp = decode_flops_tok * b / (mp * rate_gemm);
        r.decode_memory_bound = t_mem >= t_cmp;
        r.decode_seconds_per_token = std::max(t_mem, t_cmp);
        r.decode_tokens_per_second = r.decode_seconds_per_token > 0 ? 1.0 / r.decode_seconds_per_token : 0;
        r.decode_tokens_per_second_total = r.decode_tokens_per_second * b * dp;
        r.generation_seconds = r.prefill_seconds + gen * r.decode_seconds_per_token;
        r.flops_per_step = (prefill + decode_flops_tok * b * gen) * dp;
        r.compute_seconds = r.generation_seconds;
        r.step_seconds = r.generation_seconds;
        r.tokens_per_step = gen > 0 ? b * gen * dp : b * s * dp;
        r.tokens_per_second = r.step_seconds > 0 ? r.tokens_per_step / r.step_seconds : 0;
        r.assumptions.push_back("decode: weights + KV cache (mean context " + num(ctx, 10) + ") read per generated token at 80% of " +
                                num(gpu.bandwidth_gbs) + " GB/s; " + (r.decode_memory_bound ? "bandwidth-bound" : "compute-bound"));
        r.assumptions.push_back(gen > 0 ? "inference step = prefill + --gen-len decode steps; tokens = generated tokens"
                                        : "inference step = prefill only (--gen-len 0); tokens = prompt tokens");
        if (pc.tp > 1 || pc.pp > 1) r.assumptions.push_back("inference communication (tensor-parallel all-reduces) not modelled");
    }

    if (opt.tokens && r.tokens_per_second > 0) {
        r.total_seconds = *opt.tokens / r.tokens_per_second;
        r.gpu_hours = *r.total_seconds * gpus / 3600.0;
        if (opt.price_per_gpu_hour) r.cost = *r.gpu_hours * *opt.price_per_gpu_hour;
    }
    return r;
}

Result<FullEstimate> estimate_with_time(const EstimateRequest& req, const ComputeOptions& opt, const SimulateOptions& sopt) {
    if (!req.params_count && req.model.empty())
        return Error{ErrorCode::InvalidArgument,
                     "no model given: name a preset (gpumem models), a config.json, a model folder, a layer-list JSON, or use --params", "model"};
    // A built-in preset's graph is shared, not rebuilt per call (load_model_shared).
    auto shared = req.params_count ? Result<std::shared_ptr<const ModelGraph>>(std::make_shared<const ModelGraph>(params_only_graph(*req.params_count)))
                                   : load_model_shared(req.model, model_options(req));
    if (!shared) return shared.error();
    const ModelGraph& graph = *shared.value();
    auto mem = simulate_estimate(graph, req, sopt);
    if (!mem) return mem.error();
    // The estimate's job is resolve_job(g, req): not resolved again.
    const auto resolved = estimate_job(graph, &mem.value(), req);
    if (!resolved) return resolved.error();
    const Job& job = *resolved.value();
    ComputeOptions o = opt;
    if (req.params_count && !o.seq && req.seq) o.seq = req.seq;
    auto t = compute_time(graph, job, mem.value(), o);
    if (!t) return t.error();
    return FullEstimate{std::move(mem).value(), std::move(t).value()};
}

}  // namespace gpumem
