#include "gpumem/memory/job.hpp"

#include <algorithm>
#include <cstdio>
#include <map>

#include "gpumem/memory/features.hpp"

namespace gpumem {

namespace {

DType half_of(Precision p) {
    return (p == Precision::FP16 || p == Precision::AmpFP16) ? DType::F16 : DType::BF16;
}




std::string fmt_prob(double p) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", p);
    return buf;
}

// The message is built only when the check fails (an estimate runs these on
// every call; building them was 8 heap allocations per estimate).
template <class Msg>
void check(bool ok, const char* field, Msg&& msg) {
    if (!ok) fail(ErrorCode::InvalidArgument, field, msg());
}

std::vector<std::string> default_lora_targets(const ModelGraph& g) {
    // PEFT's default target modules per model_type
    // (peft/utils/constants.py TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING).
    const std::string& f = g.family;
    if (f == "gpt2") return {"c_attn"};
    if (f == "bert" || f == "roberta") return {"query", "value"};
    if (f == "t5") return {"q", "v"};
    if (f == "gpt_neox") return {"query_key_value"};
    if (f == "falcon") return {"query_key_value"};
    if (f == "phi") return {"q_proj", "v_proj"};
    if (f == "phi3") return {"qkv_proj"};
    if (f == "deepseek_v2" || f == "deepseek_v3") return {"q_proj", "kv_a_proj_with_mqa", "q_a_proj", "q_b_proj", "kv_b_proj"};
    return {"q_proj", "v_proj"};
}

}  // namespace

// Optimizer state bytes for one tensor. Layouts:
//  SGD: none; SGD momentum: momentum_buffer; Adam/AdamW: exp_avg + exp_avg_sq
//  (torch/optim/adam.py _init_group); Lion: exp_avg (lucidrains/lion-pytorch);
//  AdamW 8-bit: bitsandbytes Optimizer2State: uint8 state1/state2 + fp32
//  absmax per 256-element block, tensors with < 4096 elements keep fp32
//  states (min_8bit_size); Adafactor (transformers.optimization.Adafactor,
//  beta1=None): fp32 exp_avg_sq_row [.., rows] + exp_avg_sq_col [.., cols] for
//  >= 2-D tensors, a full fp32 exp_avg_sq for 1-D, plus a scalar RMS.
Bytes optimizer_bytes(Optimizer o, const TrainTensor& t, DType state) {
    const std::int64_t n = t.numel();
    switch (o) {
        case Optimizer::SGD: return Bytes(0);
        case Optimizer::SGDMomentum:
        case Optimizer::Lion: return dtype_bytes(state, n);
        case Optimizer::Adam:
        case Optimizer::AdamW: return dtype_bytes(state, n) * 2;
        // bitsandbytes PagedAdamW (optim_bits 32): fp32 state1/state2 whatever the
        // parameter's dtype (bitsandbytes 95f9af30, bitsandbytes/optim/optimizer.py
        // L508-510 Optimizer2State.init_state -> get_state_buffer(p, torch.float32)).
        case Optimizer::PagedAdamW: return dtype_bytes(DType::F32, n) * 2;
        case Optimizer::PagedAdamW8bit:  // the same layout as AdamW8bit (optimizer.py L502-529)
        case Optimizer::AdamW8bit: {
            std::int64_t per = 1;
            for (auto d : t.shape) per = checked_mul(per, d);
            if (per < 4096) return dtype_bytes(DType::F32, n) * 2;
            const std::int64_t blocks = (per + 255) / 256;
            return Bytes(checked_mul(t.count, checked_add(checked_mul(2, per), checked_mul(2 * 4, blocks))));
        }
        case Optimizer::Adafactor: {
            if (t.shape.size() >= 2) {
                std::int64_t lead = 1;
                for (std::size_t i = 0; i + 2 < t.shape.size(); ++i) lead = checked_mul(lead, t.shape[i]);
                const std::int64_t rows = t.shape[t.shape.size() - 2], cols = t.shape.back();
                return Bytes(checked_mul(t.count, checked_add(checked_mul(4 * lead, checked_add(rows, cols)), 4)));
            }
            return Bytes(checked_mul(t.count, checked_add(checked_mul(4, t.shape.empty() ? 1 : t.shape[0]), 4)));
        }
    }
    return Bytes(0);
}

// bitsandbytes paged optimizers (bitsandbytes 95f9af30): get_state_buffer
// (bitsandbytes/optim/optimizer.py L374-390) puts state1/state2 of a parameter
// with at least 1e5 elements in a buffer from F.get_paged (functional.py
// L91-99: lib.cget_managed_ptr = cudaMallocManaged(..., cudaMemAttachHost),
// csrc/pythonInterface.cpp L557-562), outside PyTorch's caching allocator;
// smaller tensors' states and the 8-bit absmax (optimizer.py L528-529,
// torch.zeros) stay in it. prefetch_state (L392-401) moves the pages to the GPU
// before each update; under memory pressure the driver evicts them to the host.
Bytes paged_state_bytes(Optimizer o, const TrainTensor& t) {
    if (o != Optimizer::PagedAdamW && o != Optimizer::PagedAdamW8bit) return Bytes(0);
    std::int64_t per = 1;
    for (auto d : t.shape) per = checked_mul(per, d);
    if (per < 100'000) return Bytes(0);
    // 8-bit: uint8 state1 + state2 (>= 1e5 > min_8bit_size 4096); 32-bit: fp32.
    return Bytes(checked_mul(t.count, checked_mul(per, o == Optimizer::PagedAdamW8bit ? 2 : 8)));
}

// Weight bytes of one parameter under weight quantization (bitsandbytes
// Linear8bitLt / Linear4bit, GPTQ-style int4). Only nn.Linear weights are
// quantized (quantized_weight); lm_head stays in the compute dtype (bnb's
// default skip list) unless quantize_head.
Bytes quantized_bytes(Quant q, const Param& p, DType fallback, bool double_quant, bool quantize_head) {
    return quantized_bytes(q, p, p.count, fallback, double_quant, quantize_head);
}

Bytes quantized_bytes(Quant q, const Param& p, std::int64_t count, DType fallback, bool double_quant, bool quantize_head) {
    if (!quantized_weight(p, q, quantize_head)) {
        std::int64_t n = count;
        for (auto d : p.shape) n = checked_mul(n, d);
        return dtype_bytes(fallback, n);
    }
    const std::int64_t per = checked_mul(p.shape[0], p.shape[1]);
    std::int64_t b = 0;
    switch (q) {
        case Quant::Int8:  // int8 weight + fp32 row scale (SCB) per output row
            b = checked_add(per, 4 * p.shape[0]);
            break;
        case Quant::NF4:
        case Quant::FP4: {
            // bitsandbytes quantize_4bit (95f9af30, bitsandbytes/functional.py
            // L884-960; nf4 and fp4 differ only in the 16-value code): packed
            // 4-bit values and an fp32 absmax per block of 64 (L917-918;
            // backends/cuda/ops.py L391-392), the 16-entry fp32 code (L936).
            // Double quantization (compress_statistics, L938-951) replaces the
            // absmax by uint8 codes of (absmax - mean) in blocks of 256 with an
            // fp32 absmax each, the 256-entry fp32 dynamic map and the fp32 mean.
            const std::int64_t blocks = (per + 63) / 64;
            b = (per + 1) / 2 + 64 + (double_quant ? blocks + 4 * ((blocks + 255) / 256) + 1024 + 4 : 4 * blocks);
            break;
        }
        case Quant::Int4: {  // GPTQ group 128: packed int4 + fp16 scale + packed int4 zero per group
            const std::int64_t groups = (per + 127) / 128;
            b = (per + 1) / 2 + 2 * groups + (groups + 1) / 2;
            break;
        }
        case Quant::None: break;
    }
    return Bytes(checked_mul(b, count));
}

Result<Job> resolve_job(const ModelGraph& g_in, const EstimateRequest& req_in) {
    return capture([&]() -> Job {
        Job job;
        job.assumptions.reserve(12);  // (a job states 4-10; grown by doubling they took 4 allocations)
        // A framework that trains a tied output layer as its own weight
        // (LitGPT, memory/framework.hpp untied_head) runs another graph.
        std::shared_ptr<const ModelGraph> untied;
        if (framework_profile(req_in.framework.value_or(Framework::HF)).untied_head && has_tied_output_head(g_in)) {
            untied = std::make_shared<const ModelGraph>(untie_output_head(g_in));
            job.assumptions.push_back(std::string(framework_profile(*req_in.framework).title) +
                                      " trains the tied output layer as a weight of its own (a second [vocab, hidden] tensor beside the embedding)");
        }
        const ModelGraph& g = untied ? *untied : g_in;
        EstimateRequest req = req_in;
        const bool train = req.mode != Mode::Infer;
        const bool lora = req.mode == Mode::Lora || req.mode == Mode::QLora;

        check(req.batch >= 1, "batch", [&] { return "--batch must be a positive integer (got " + std::to_string(req.batch) + ")"; });
        check(req.grad_accum >= 1, "grad-accum", [&] { return "--grad-accum must be a positive integer (got " + std::to_string(req.grad_accum) + ")"; });
        check(req.gen_len >= 0, "gen-len", [&] { return "--gen-len must be zero or positive (got " + std::to_string(req.gen_len) + ")"; });
        if (req.seq) check(*req.seq >= 1, "seq", [&] { return "--seq must be a positive integer (got " + std::to_string(*req.seq) + ")"; });
        if (lora) check(req.lora_rank >= 1, "lora-rank", [&] { return "--lora-rank must be a positive integer (got " + std::to_string(req.lora_rank) + ")"; });
        if (req.decoder_seq) check(*req.decoder_seq >= 1, "decoder-seq", [&] { return "--decoder-seq must be a positive integer (got " + std::to_string(*req.decoder_seq) + ")"; });
        if (lora && req.lora_dropout)
            check(*req.lora_dropout >= 0.0 && *req.lora_dropout <= 1.0, "lora-dropout",
                  [&] { return "--lora-dropout must be a probability in [0, 1] (got " + std::to_string(*req.lora_dropout) + ")"; });

        // The framework's defaults (precision included) before gpumem's own.
        FrameworkChoice fw = resolve_framework(req, train, g.transformer.has_value());
        if (!req.precision) req.precision = train ? Precision::AmpBF16 : Precision::BF16;
        if (!req.quant) req.quant = req.mode == Mode::QLora ? Quant::NF4 : Quant::None;
        if (req.mode == Mode::QLora && *req.quant == Quant::None)
            fail(ErrorCode::InvalidArgument, "quant", "--mode qlora needs a quantized base: use --quant nf4 (or int4/int8)");
        if (req.mode == Mode::Train && *req.quant != Quant::None)
            fail(ErrorCode::InvalidArgument, "quant",
                 "--quant applies to frozen weights: use --mode qlora or --mode infer, or --quant none for full training");
        if (lora && req.lora_targets.empty()) req.lora_targets = default_lora_targets(g);

        validate_features(req, train, job.warnings);  // memory/features.hpp
        const Precision prec = *req.precision;
        const bool amp = prec == Precision::AmpBF16 || prec == Precision::AmpFP16;
        const DType half = half_of(prec);
        const DType stream = (prec == Precision::FP32 || amp) ? DType::F32 : half;
        const DType lowered = prec == Precision::FP32 ? DType::F32 : half;

        auto gpu = find_gpu(req.gpu);
        if (!gpu) throw InputError(gpu.error());
        job.gpu = gpu.value();
        const Bytes capacity = req.gpu_memory.value_or(job.gpu.memory);
        // FP8 / FP4 recipes and the GPU (memory/fp8.hpp): TE's MXFP8 and NVFP4
        // need Blackwell (docs/features/low_precision_training/mxfp8/mxfp8.rst
        // @d0067d0da6cb L11, nvfp4/nvfp4.rst L222), FP8 Ada or Hopper.
        if (train && req.fp8_recipe != Fp8Recipe::None && job.gpu.vendor == "NVIDIA") {
            const bool block = req.fp8_recipe == Fp8Recipe::MXFP8 || req.fp8_recipe == Fp8Recipe::NVFP4;
            const int need = block ? 100 : 89;
            if (job.gpu.compute_capability < need)
                job.warnings.push_back(std::string("--fp8-recipe ") + to_string(req.fp8_recipe) + " needs " + (block ? "a Blackwell (sm100+)" : "an Ada or Hopper (sm89+)") +
                                       " GPU; " + job.gpu.name + " is sm" + std::to_string(job.gpu.compute_capability) + ": the sizes shown are what it keeps where it runs");
        }
        if (req.gpu_memory) job.gpu.memory = *req.gpu_memory;

        std::int64_t seq = 1;
        try {
            if (req.seq) (void)Extent::per_token2(1).elements(req.batch, checked_add(*req.seq, req.gen_len));
        } catch (const OverflowError&) {
            fail(ErrorCode::Overflow, "batch",
                 "--batch " + std::to_string(req.batch) + " with --seq " + std::to_string(*req.seq) +
                     ": tensor sizes overflow 64 bits; use a smaller batch or sequence");
        }
        if (g.has_sequence) {
            const std::int64_t def = g.max_positions > 0 ? std::min<std::int64_t>(2048, g.max_positions) : 2048;
            seq = req.seq.value_or(def);
            if (!req.seq) job.assumptions.push_back("--seq not given: using " + std::to_string(seq));
            const std::int64_t total = checked_add(seq, req.mode == Mode::Infer ? req.gen_len : 0);
            if (g.max_positions > 0 && total > g.max_positions)
                job.warnings.push_back("sequence length " + std::to_string(total) + " exceeds the model's maximum of " +
                                       std::to_string(g.max_positions) +
                                       " positions (max_position_embeddings); the estimate assumes it runs anyway");
        } else if (req.seq) {
            job.warnings.push_back("--seq is ignored: this model has a fixed input shape (the batch comes from --batch)");
        }
        req.seq = seq;

        job.assumptions.insert(job.assumptions.end(), g.notes.begin(), g.notes.end());

        // Encoder-decoder models (T5): the decoder's own length. Its tokens,
        // self-attention scores and the cross-attention scores (decoder x
        // encoder) follow it (SeqAxis, model/graph.hpp); --seq is the encoder's.
        std::int64_t decoder_seq = 0;
        const bool enc_dec = g.transformer && g.transformer->encoder_decoder;
        if (enc_dec && train) {
            decoder_seq = req.decoder_seq.value_or(seq);
            try {
                (void)Extent::per_token2(1).elements(req.batch, std::max(seq, decoder_seq));
            } catch (const OverflowError&) {
                fail(ErrorCode::Overflow, "decoder-seq",
                     "--batch " + std::to_string(req.batch) + " with --decoder-seq " + std::to_string(decoder_seq) +
                         ": tensor sizes overflow 64 bits; use a smaller batch or sequence");
            }
            job.assumptions.push_back(req.decoder_seq ? "decoder length " + std::to_string(decoder_seq) + " tokens (--decoder-seq), encoder " +
                                                            std::to_string(seq) + " (--seq)"
                                                      : "decoder length = encoder length = --seq (" + std::to_string(seq) +
                                                            " tokens); --decoder-seq sets the decoder's");
        } else if (req.decoder_seq) {
            job.warnings.push_back(enc_dec ? "--decoder-seq is ignored for inference: generation starts the decoder from one token"
                                           : "--decoder-seq is ignored: this model has no separate decoder (encoder-decoder models such as T5 only)");
        }

        // ---- model states ------------------------------------------------------
        // Weight dtype: fp32 for fp32 and autocast (torch.autocast keeps fp32
        // parameters), 16-bit for pure fp16/bf16; LoRA/QLoRA bases are loaded
        // in 16 bits (or quantized) and frozen; inference uses the precision.
        DType wdt = stream;
        // LitGPT's bf16-mixed builds and loads the model in fp32 (memory/framework.hpp
        // amp_lora_base_fp32): the frozen base stays fp32 under autocast.
        const bool lora_fp32_base = lora && amp && framework_profile(fw.framework).amp_lora_base_fp32;
        if (lora && prec != Precision::FP32 && !lora_fp32_base) wdt = half;
        const Quant quant = *req.quant;
        // PEFT prepare_model_for_kbit_training (request.hpp kbit_upcast): the
        // parameters left unquantized are fp32; the quantized layers return
        // their input's dtype, so the residual stream is fp32 too.
        const bool sharded_params = req.parallel.fsdp != Fsdp::None || req.parallel.zero >= 3;
        const bool kbit_upcast = lora && quant != Quant::None && prec != Precision::FP32 &&
                                 req.kbit_upcast.value_or(framework_profile(fw.framework).kbit_upcast && !sharded_params);
        req.kbit_upcast = kbit_upcast;
        if (kbit_upcast) {
            wdt = DType::F32;
            job.assumptions.push_back("--kbit-upcast: PEFT prepare_model_for_kbit_training casts the unquantized parameters (embeddings, norms, output layer) "
                                      "to fp32: fp32 residual stream and checkpoints (huggingface/peft src/peft/utils/other.py@ec267c64 L95-98)");
        }
        if (quant != Quant::None) {
            const bool four = quant == Quant::NF4 || quant == Quant::FP4;
            std::string a = std::string(to_string(quant)) + " linear weights (" +
                            (four ? std::string("bitsandbytes Linear4bit, blocks of 64, double quantization ") + (req.double_quant ? "on" : "off")
                                  : quant == Quant::Int8 ? std::string("bitsandbytes LLM.int8 Linear8bitLt") : std::string("GPTQ, groups of 128")) +
                            "), lm_head " + (req.quantize_head ? "quantized too (--quantize-head, as LitGPT)" : "kept 16-bit (bitsandbytes/HF skip it)");
            if (lora && quant == Quant::Int8) a += "; LLM.int8 layers keep their input for backward when it requires grad (MatMul8bitLt)";
            if (lora && four)
                a += req.bnb_4bit_saves_input ? "; 4-bit layers keep their input for backward (bitsandbytes < 0.43.2, --bnb-4bit-saves-input)"
                                              : "; 4-bit layers keep only the packed weight for backward (bitsandbytes >= 0.43.2)";
            job.assumptions.push_back(a);
        }
        Bytes weights;
        std::vector<TrainTensor> trainable;
        std::int64_t largest_linear = 0;  // elements of the largest quantizable weight
        std::int64_t trainable_params = 0;
        std::int64_t head_linear = 0;     // elements of a quantized output layer (--quantize-head)
        if (g.params_only > 0) {
            if (quant != Quant::None) {
                // No graph: every parameter is taken as the weight of one linear
                // layer, quantized as such (its one-off constants counted once).
                Param all;
                all.shape = {1, g.params_only};
                all.linear_weight = true;
                weights = quantized_bytes(quant, all, wdt, req.double_quant, req.quantize_head);
                job.assumptions.push_back(std::string("--params with --quant ") + to_string(quant) +
                                          ": every parameter counted as a quantized linear weight (embeddings, norms and the output "
                                          "layer, which stay 16-bit in a real model, included; per-row / per-tensor constants counted once)");
            } else {
                weights = dtype_bytes(wdt, g.params_only);
            }
            if (!lora) {
                trainable.push_back({{g.params_only}, 1});
                trainable_params = g.params_only;
            }
            job.assumptions.push_back("--params: model states only; activations, KV cache and transients are not modelled");
        } else {
            if (train && !lora) {
                std::size_t n = 0;
                for (const auto& b : g.blocks) n += b.params.size();
                trainable.reserve(n);
            }
            for (const auto& b : g.blocks)
                for (const auto& p : b.params) {
                    weights += quantized_bytes(quant, p, wdt, req.double_quant, req.quantize_head) * b.repeat;
                    if (quantized_weight(p, quant, false))
                        largest_linear = std::max(largest_linear, checked_mul(p.shape[0], p.shape[1]));
                    else if (quantized_weight(p, quant, req.quantize_head))
                        head_linear = std::max(head_linear, checked_mul(p.shape[0], p.shape[1]));
                    if (train && !lora && p.trainable) {
                        trainable.push_back({p.shape, checked_mul(p.count, b.repeat)});
                        trainable_params = checked_add(trainable_params, checked_mul(p.numel(), b.repeat));
                    }
                }
            if (lora) {
                for (const auto& b : g.blocks)
                    for (const auto& op : b.ops)
                        if (lora_applies(op, req.lora_targets)) {
                            // A linear op standing for E routed experts (weights with
                            // count E) gets one adapter per expert, as PEFT wraps each.
                            const std::int64_t copies = checked_mul(
                                b.repeat, op.params.empty() ? 1 : b.params[static_cast<std::size_t>(op.params.front())].count);
                            trainable.push_back({{req.lora_rank, op.in_features}, copies});
                            trainable.push_back({{op.out_features, req.lora_rank}, copies});
                            trainable_params = checked_add(trainable_params,
                                checked_mul(copies, checked_mul(req.lora_rank, checked_add(op.in_features, op.out_features))));
                        }
                if (trainable_params == 0) {
                    std::string mods;
                    std::map<std::string, int> seen;
                    for (const auto& b : g.blocks)
                        for (const auto& op : b.ops)
                            if (op.kind == OpKind::Linear) {
                                auto d = op.name.rfind('.');
                                std::string leaf = d == std::string::npos ? op.name : op.name.substr(d + 1);
                                if (!seen[leaf]++) mods += (mods.empty() ? "" : ",") + leaf;
                            }
                    fail(ErrorCode::InvalidArgument, "lora-targets",
                         "--lora-targets matches no linear layer of this model; its linear modules are: " + mods);
                }
            }
        }
        // bitsandbytes 4-bit matmuls dequantize the whole weight to the compute
        // dtype for each call (bnb.functional.dequantize_4bit): one layer's worth
        // is in flight at a time. LLM.int8 multiplies in int8 and does not.
        const DType compute_dt = prec == Precision::FP32 ? DType::F32 : half;
        // LLM.int8's backward casts the int8 weight back to the input's dtype for
        // the input gradient: `CB = state.CB.to(ctx.dtype_A, copy=True).mul_(...)`
        // (bitsandbytes 95f9af30, bitsandbytes/autograd/_functions.py L236-238).
        const bool int8_bwd = quant == Quant::Int8 && train;
        // Lightning's bitsandbytes plugin (LitGPT) quantizes from fp16
        // (Lightning-AI/pytorch-lightning src/lightning/fabric/plugins/precision/bitsandbytes.py@438f29f07a80 L334):
        // dequantize_4bit returns fp16, which MatMul4Bit casts to the bf16
        // compute dtype, both alive at once (bitsandbytes 0.42.0 autograd/_functions.py L516, L546).
        const std::int64_t deq_copies = fw.framework == Framework::LitGPT && (quant == Quant::NF4 || quant == Quant::FP4) && compute_dt == DType::BF16 ? 2 : 1;
        const Bytes dequant = dequantizes(quant) || int8_bwd ? dtype_bytes(compute_dt, checked_mul(largest_linear, deq_copies)) : Bytes(0);
        const Bytes head_dequant = dequantizes(quant) || int8_bwd ? dtype_bytes(compute_dt, checked_mul(head_linear, deq_copies)) : Bytes(0);
        // Adapters are kept in fp32 under autocast (PEFT autocast_adapter_dtype).
        // Megatron mixed precision (--distributed-optimizer with --precision
        // bf16/fp16): 16-bit parameters, fp32 main gradients, fp32 master weights
        // and Adam moments: 2 + 4 + 12 bytes per parameter (6 + 12/dp sharded).
        const bool megatron = (req.parallel.distributed_optimizer || fw.framework == Framework::Megatron) && !lora &&
                              (prec == Precision::BF16 || prec == Precision::FP16);
        // DeepSpeed's bf16 optimizer keeps fp32 master weights and optimizer
        // states beside the bf16 parameters, as its fp16 one does.
        const bool ds_bf16 = fw.framework == Framework::DeepSpeed && !lora && prec == Precision::BF16;
        const DType tdt = lora ? (amp || prec == Precision::FP32 ? DType::F32 : half) : (megatron ? DType::F32 : wdt);
        Bytes adapter_weights;
        if (lora) {
            adapter_weights = dtype_bytes(tdt, trainable_params);
            weights += adapter_weights;
        }
        Bytes grads, master, opt_states;
        DType state_dt = DType::F32;
        if (train) {
            grads = dtype_bytes(tdt, trainable_params);
            if ((prec == Precision::FP16 && !lora) || megatron || ds_bf16) {
                // fp16 weights and grads with an fp32 master copy (ZeRO paper's
                // mixed precision, apex O2 / DeepSpeed fp16): 2 + 2 + 4 + optimizer.
                master = dtype_bytes(DType::F32, trainable_params);
                state_dt = DType::F32;
            } else {
                state_dt = (prec == Precision::BF16 && !lora) ? DType::BF16 : (lora ? (tdt == DType::F32 ? DType::F32 : tdt) : DType::F32);
            }
            for (const auto& t : trainable) opt_states += optimizer_bytes(req.optimizer, t, state_dt);
        }

        // ---- activations -------------------------------------------------------
        ActivationContext actx;
        actx.batch = req.batch;
        actx.seq = seq;
        actx.stream = (lora && prec != Precision::FP32) ? (amp ? DType::F32 : half) : stream;
        if (lora && amp && !lora_fp32_base) actx.stream = half;  // 16-bit base: the residual stream is 16-bit
        actx.frozen_weight_casts = lora_fp32_base;
        if (kbit_upcast) actx.stream = DType::F32;
        actx.lowered = lowered;
        actx.autocast = amp;
        actx.weight_cache = fw.policy == PrecisionPolicy::Autocast;
        actx.fused_qkv_views = framework_profile(fw.framework).fused_qkv_views;
        if (fw.policy == PrecisionPolicy::OwnCopies && amp && !lora) {
            // FSDP2 MixedPrecisionPolicy: fp32 parameters, but the forward runs on
            // bf16 copies and bf16 inputs; no autocast, the stream is 16-bit.
            actx.autocast = false;
            actx.stream = half;
        }
        actx.recompute = req.recompute.value_or(Recompute::None);
        actx.recompute_every = req.recompute_every.value_or(1);
        actx.activation_offload = fw.activation_offload;
        if (train && fw.activation_offload && actx.recompute != Recompute::Full && actx.recompute != Recompute::Ops)
            fail(ErrorCode::InvalidArgument, "activation-offload",
                 "--activation-offload moves the checkpointed layers' inputs to CPU memory (torchtune, Unsloth): use it with --recompute full or ops");
        if (req.recompute_every && actx.recompute != Recompute::Full && actx.recompute != Recompute::Ops)
            fail(ErrorCode::InvalidArgument, "recompute-every", "--recompute-every chooses which layers are checkpointed: use it with --recompute full or ops");
        if ((req.recompute_method || req.recompute_num_layers) && actx.recompute != Recompute::Full)
            fail(ErrorCode::InvalidArgument, req.recompute_method ? "recompute-method" : "recompute-num-layers",
                 "--recompute-method / --recompute-num-layers choose which layers full recompute checkpoints (Megatron's): use them with --recompute full");
        if (req.recompute_num_layers && req.recompute_every && *req.recompute_every > 1)
            fail(ErrorCode::InvalidArgument, "recompute-num-layers",
                 "--recompute-num-layers (Megatron) and --recompute-every (torchtitan) are two ways to pick the checkpointed layers: use one");
        actx.recompute_method = req.recompute_method.value_or(RecomputeMethod::Uniform);
        actx.recompute_num_layers = req.recompute_num_layers.value_or(1);
        if (actx.recompute == Recompute::Full && (req.recompute_method || req.recompute_num_layers))
            job.assumptions.push_back(std::string("Megatron recompute_method ") + to_string(actx.recompute_method) + ", recompute_num_layers " +
                                      std::to_string(actx.recompute_num_layers) +
                                      (actx.recompute_method == RecomputeMethod::Uniform
                                           ? ": the layers in chunks of that many, each chunk's input kept and the chunk rebuilt at once"
                                           : ": the first that many layers of each model chunk checkpointed, the others keep their activations") +
                                      " (NVIDIA/Megatron-LM megatron/core/recompute.py@d98e8a64ddf3 L157-183)");
        actx.attention = req.attention;
        actx.train_base = !lora;
        if (lora) {
            actx.lora_targets = req.lora_targets;
            actx.lora_rank = req.lora_rank;
            actx.lora_dropout = req.lora_dropout.value_or(0.0);  // PEFT LoraConfig.lora_dropout default 0.0
            actx.fused_qkv_lora = framework_profile(fw.framework).fused_qkv_lora;
            actx.adapter = tdt;
            job.assumptions.push_back(actx.lora_dropout > 0.0
                                          ? "LoRA dropout " + fmt_prob(actx.lora_dropout) +
                                                ": each adapter keeps its own dropped copy of its input and a 1-byte mask"
                                          : std::string(req.lora_dropout ? "LoRA dropout 0" : "LoRA dropout 0 (PEFT's default; --lora-dropout)") +
                                                ": nn.Identity, no copy or mask");
        }
        actx.quant = *req.quant;
        actx.quantize_head = req.quantize_head;
        actx.bnb_4bit_saves_input = req.bnb_4bit_saves_input;
        {
            // torchtitan's FSDP mesh is dp_shard x cp: parameters, gradients and
            // optimizer states are sharded over the context-parallel ranks too
            // (pytorch/torchtitan torchtitan/distributed/parallel_dims.py@b5bcd76c66d0
            // L386 `expected_sizes["fsdp"] = self.dp_shard * self.cp`; models/llama3/
            // parallelize.py L63 applies fully_shard on that mesh).
            ParallelConfig pc = req.parallel;
            pc.fsdp_over_cp = fw.framework == Framework::Torchtitan;
            auto lay = resolve_layout(pc, g, seq, req.grad_accum, job.gpu.gpus_per_node);
            if (!lay) throw InputError(lay.error());
            job.layout = lay.value();
            if (pc.fsdp_over_cp && pc.fsdp == Fsdp::Full && pc.cp > 1)
                job.assumptions.push_back("torchtitan: FSDP shards over dp x cp = " + std::to_string(job.layout.shard) + " ranks");
        }
        // Activations of one rank: its share of the sequence and of each tensor.
        actx.tp = job.layout.cfg.tp;
        actx.sp = job.layout.cfg.sp;
        actx.cp = job.layout.cfg.cp;
        actx.ep = job.layout.cfg.ep;
        actx.capacity_factor = job.layout.cfg.capacity_factor;
        actx.seq = std::max<std::int64_t>(1, seq / std::max<std::int64_t>(1, job.layout.cfg.cp));
        if (decoder_seq > 0) actx.decoder_seq = std::max<std::int64_t>(1, decoder_seq / std::max<std::int64_t>(1, job.layout.cfg.cp));
        if (megatron)
            job.assumptions.push_back("Megatron mixed precision: 16-bit parameters, fp32 main gradients, fp32 master weights and optimizer states");
        // The optimizer's implementation: the user's, else the framework's.
        // Megatron builds TransformerEngine's (or apex's) FusedAdam
        // (NVIDIA/Megatron-LM d98e8a64ddf3, megatron/core/optimizer/__init__.py
        // L13-22), DeepSpeed ZeRO its FusedAdam for Adam/AdamW
        // (microsoft/DeepSpeed 38327e07f6cd, deepspeed/runtime/engine.py
        // L1415-1440); both update in place with multi_tensor_apply. torch.optim
        // defaults to foreach on CUDA (torch/optim/adam.py L346-353).
        const bool adam = req.optimizer == Optimizer::Adam || req.optimizer == Optimizer::AdamW;
        if (req.optimizer_impl) {
            job.opt_impl = *req.optimizer_impl;
        } else if (adam && train && !lora && (req.parallel.distributed_optimizer || req.parallel.zero >= 1)) {
            job.opt_impl = OptimizerImpl::Fused;
            job.assumptions.push_back(std::string("optimizer implementation fused: ") +
                                      (req.parallel.distributed_optimizer ? "Megatron's TransformerEngine FusedAdam" : "DeepSpeed's FusedAdam") +
                                      " (the framework's default; --optimizer-impl overrides)");
        } else {
            job.opt_impl = OptimizerImpl::Foreach;
        }
        req.optimizer_impl = job.opt_impl;
        if (fw.rewrite.any()) job.graph = std::make_shared<const ModelGraph>(rewrite_graph(g, fw.rewrite));
        else job.graph = untied;
        if (ds_bf16) job.assumptions.push_back("DeepSpeed bf16: bf16 parameters and gradients, fp32 master weights and optimizer states");
        job.assumptions.insert(job.assumptions.end(), fw.assumptions.begin(), fw.assumptions.end());
        job.framework = std::move(fw);
        job.req = req;
        job.train = train;
        job.lora = lora;
        job.amp = amp;
        job.prec = prec;
        job.half = half;
        job.lowered = lowered;
        job.wdt = wdt;
        job.tdt = tdt;
        job.state_dt = state_dt;
        job.quant = quant;
        job.seq = seq;
        job.capacity = capacity;
        job.actx = actx;
        job.trainable = std::move(trainable);
        job.trainable_params = trainable_params;
        job.largest_linear = largest_linear;
        job.weights = weights;
        job.adapter_weights = adapter_weights;
        job.grads = grads;
        job.master = master;
        job.opt_states = opt_states;
        job.dequant = dequant;
        job.head_dequant = head_dequant;
        job.dequant_in_forward = dequantizes(quant);
        return job;
    });
}

}  // namespace gpumem
