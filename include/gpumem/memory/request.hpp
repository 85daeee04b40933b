// gpumem/memory/request.hpp — the one request structure shared by every front end.
//
// The CLI fills it from flags, the HTTP service from a JSON body whose keys
// are the CLI's flag names, and the Python bindings from keyword arguments;
// validate() returns the same precise message for all of them.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpumem/core/bytes.hpp"
#include "gpumem/core/dtype.hpp"
#include "gpumem/core/result.hpp"
#include "gpumem/memory/parallel.hpp"
#include "gpumem/model/load.hpp"
#include "gpumem/model/onnx.hpp"

namespace gpumem {

struct Calibration;  // memory/calibration.hpp

enum class Mode { Train, Lora, QLora, Infer };
enum class Precision { FP32, FP16, BF16, AmpFP16, AmpBF16 };
// paged-adamw / paged-adamw8bit: bitsandbytes PagedAdamW(32bit) / PagedAdamW8bit,
// whose large states live in CUDA managed memory outside PyTorch's allocator.
enum class Optimizer { SGD, SGDMomentum, Adam, AdamW, AdamW8bit, Adafactor, Lion, PagedAdamW, PagedAdamW8bit };
// ops: op-level selective checkpointing (torchtitan selective_ac_option "op":
// the outputs of every other matmul and of attention are saved, the rest rebuilt).
enum class Recompute { None, Selective, Full, Ops };
// Which layers full recompute checkpoints (Megatron-LM --recompute-method with
// --recompute-num-layers N, megatron/core/recompute.py@d98e8a64ddf3 L157-183):
// uniform: the layers in chunks of N, each chunk's input kept and the chunk
// rebuilt at once; block: the first N layers of each model chunk, one by one.
enum class RecomputeMethod { Uniform, Block };
enum class Attention { Eager, Flash };
// int8: bitsandbytes LLM.int8 (Linear8bitLt); int4: GPTQ-style (group 128);
// nf4 / fp4: bitsandbytes Linear4bit with quant_type "nf4" / "fp4".
enum class Quant { None, Int8, Int4, NF4, FP4 };
// torch.optim implementations: foreach (default on CUDA since PyTorch 2.0),
// fused, and the per-parameter for-loop (PyTorch 1.x default, HF's old AdamW).
enum class OptimizerImpl { Foreach, Fused, ForLoop };
// optimizer.zero_grad(set_to_none=True) (PyTorch >= 2.0 default) frees
// gradients after each step; set_to_none=False (PyTorch 1.x) keeps them.
enum class ZeroGrad { SetToNone, Zero };
// --allocator: `pytorch` simulates the CUDA caching allocator (rounding,
// segments, caching, cuBLAS workspaces); `none` reports live tensor bytes only,
// as PyTorch's CPU profiler sees them.
enum class AllocatorKind { PyTorch, None };
// --load-dtype: the dtype from_pretrained materialises the checkpoint in on the
// GPU: `weights` (torch_dtype given: the weights' own dtype) or `fp32`
// (torch_dtype not given: torch's default dtype, then cast with model.to()).
enum class LoadDtype { Weights, FP32 };
// --framework: the training framework whose loop, modeling code and precision
// policy the step follows (memory/framework.hpp has each profile's rules and
// their sources).
enum class Framework { HF, Torchtune, LitGPT, NanoGPT, Megatron, Torchtitan, DeepSpeed, Axolotl, Unsloth, LlamaFactory };
// How the loss reads the logits: full cross-entropy over [b, s, V] (HF: an
// fp32 copy, then log_softmax saved), chunked over the sequence (torchtune,
// LitGPT), a fused kernel saving only the logits and per-row statistics
// (Unsloth, Megatron's fused vocab-parallel CE), or fused linear
// cross-entropy that never materialises the logits (Liger, cut-cross-entropy).
enum class CrossEntropy { Full, Chunked, Fused, FusedLinear };
// Whether the loop still references the logits during backward (nanoGPT's
// `logits, loss = model(X, Y)`) or drops them when the loss is computed.
enum class LogitsLifetime { Freed, Kept };
// Modeling code: Hugging Face eager modules, fused kernels (RMSNorm, SwiGLU,
// RoPE: Liger, Unsloth, torchtune/torchtitan compiled), or Transformer Engine
// layers (Megatron-Core).
enum class Kernels { Eager, Fused, TE };
// FP8 / FP4 training recipe (memory and time; memory/fp8.hpp): Transformer
// Engine delayed or current scaling, MXFP8 and NVFP4 block scaling, torchao
// Float8 tensorwise / rowwise.
enum class Fp8Recipe { None, Delayed, Current, Tensorwise, Rowwise, MXFP8, NVFP4 };
// CUDA graphs in training (memory/framework.hpp, docs/frameworks.md):
// `compile` is torch.compile(mode="reduce-overhead") (Inductor's CUDA graph
// trees: the compiled forward and backward in one private pool per device);
// `megatron` is Megatron-Core's per-layer graphs (--cuda-graph-impl local,
// formerly --enable-cuda-graph: every transformer layer's forward and backward
// captured into one shared private pool; embedding, loss and optimizer eager).
enum class CudaGraphs { None, Compile, Megatron };

const char* to_string(Mode);
const char* to_string(Precision);
const char* to_string(Optimizer);
const char* to_string(Recompute);
const char* to_string(Attention);
const char* to_string(Quant);
const char* to_string(OptimizerImpl);
const char* to_string(ZeroGrad);
const char* to_string(AllocatorKind);
const char* to_string(LoadDtype);
// An unset recompute prints as resolved jobs hold it when the framework has no default.
inline const char* to_string(const std::optional<Recompute>& r) { return to_string(r.value_or(Recompute::None)); }
const char* to_string(Framework);
const char* to_string(CrossEntropy);
const char* to_string(LogitsLifetime);
const char* to_string(Kernels);
const char* to_string(Fp8Recipe);
const char* to_string(CudaGraphs);
const char* to_string(RecomputeMethod);

struct EstimateRequest {
    std::string model;                 // preset name, path, or "" with params_count
    // false: `model` names a built-in preset only and no file is read for it
    // (requests to the HTTP service; api run() sets it from CallOptions).
    bool files = true;
    std::optional<std::int64_t> params_count;  // --params 7B
    // Loss of an ONNX model whose graph output is not a loss (sum, mean,
    // cross-entropy, none; unset: sum with a note). Other models ignore it.
    std::optional<std::string> loss;
    Mode mode = Mode::Train;
    std::int64_t batch = 1;            // micro-batch per GPU
    std::optional<std::int64_t> seq;   // default: min(2048, model max positions)
    std::int64_t grad_accum = 1;
    std::optional<Precision> precision;  // default: amp-bf16 for training, bf16 for inference
    Optimizer optimizer = Optimizer::AdamW;
    // Default by framework (resolve_job): Megatron's distributed optimizer and
    // DeepSpeed ZeRO run a fused Adam; plain PyTorch defaults to foreach.
    std::optional<OptimizerImpl> optimizer_impl;
    ZeroGrad zero_grad = ZeroGrad::SetToNone;
    // Each parameter stepped and its gradient freed in its post-accumulate-grad
    // hook (torchtune optimizer_in_bwd): no full set of gradients ever exists.
    bool optimizer_in_backward = false;
    LoadDtype load_dtype = LoadDtype::Weights;  // the load phase (memory/features.hpp)
    std::optional<Recompute> recompute;  // default: the framework's (none for hf)
    Attention attention = Attention::Flash;
    std::int64_t lora_rank = 16;
    std::vector<std::string> lora_targets;  // default: q_proj,k_proj,v_proj,o_proj (or the family's names)
    std::optional<Quant> quant;        // default none (nf4 for qlora)
    // bitsandbytes 4-bit (nf4/fp4): absmax constants quantized again
    // (compress_statistics / bnb_4bit_use_double_quant). Default on, as the
    // QLoRA recipe (artidoro/qlora qlora.py --double_quant); HF's
    // BitsAndBytesConfig defaults to False.
    bool double_quant = true;
    // lm_head quantized too (LitGPT / Lightning's BitsandbytesPrecision
    // converts every nn.Linear); HF and bitsandbytes skip it by default.
    bool quantize_head = false;
    // bitsandbytes < 0.43.2: MatMul4Bit keeps its input for backward
    // (ctx.tensors = (A, B)); 0.43.2 and later keep only the packed weight.
    bool bnb_4bit_saves_input = false;
    // PEFT prepare_model_for_kbit_training: every parameter that is not
    // quantized (embeddings, norms, the output layer) cast to fp32, so the
    // residual stream and the checkpointed layer inputs are fp32 (bitsandbytes
    // layers return their input's dtype). Unset: the framework's (axolotl on
    // for QLoRA / 8-bit LoRA without FSDP or ZeRO-3).
    std::optional<bool> kbit_upcast;
    // PEFT LoraConfig.lora_dropout (default 0: nn.Identity). Unset: 0.
    std::optional<double> lora_dropout;
    // Encoder-decoder models (T5): decoder tokens per sample. Unset: --seq.
    std::optional<std::int64_t> decoder_seq;
    std::optional<DType> kv_dtype;     // default: the activation dtype
    std::int64_t gen_len = 0;          // inference: generated tokens (prompt = seq)
    std::string gpu = "H100-80GB";
    std::optional<Bytes> gpu_memory;   // overrides the catalog's capacity
    std::optional<Bytes> cuda_context; // overrides the CUDA context estimate
    bool cuda_lazy_loading = true;     // CUDA_MODULE_LOADING=LAZY (default since CUDA 11.7 + PyTorch 1.13)
    AllocatorKind allocator = AllocatorKind::PyTorch;
    std::string alloc_conf;            // PYTORCH_CUDA_ALLOC_CONF syntax
    std::optional<Bytes> cublas_workspace;  // overrides one cuBLAS workspace's size
    bool analytic = false;             // skip the step simulation (fast path)
    // ---- framework (memory/framework.hpp): unset fields take the profile's default
    std::optional<Framework> framework;        // default hf
    std::optional<CrossEntropy> cross_entropy;
    std::optional<LogitsLifetime> logits;
    std::optional<Kernels> kernels;
    std::optional<std::int64_t> recompute_every;  // checkpoint every N-th layer (torchtitan ac_freq, HF: 1)
    std::optional<RecomputeMethod> recompute_method;   // Megatron --recompute-method (default uniform)
    std::optional<std::int64_t> recompute_num_layers;  // Megatron --recompute-num-layers (default 1)
    std::optional<bool> compile;               // torch.compile of the model (Inductor); default the framework's
    std::optional<bool> compile_loss;          // whether --compile covers the loss too; default the framework's
    std::optional<bool> activation_offload;    // saved activations offloaded to CPU (torchtune, Unsloth); default the framework's
    Fp8Recipe fp8_recipe = Fp8Recipe::None;    // FP8 linears: memory and time (implies --fp8 for time)
    CudaGraphs cuda_graphs = CudaGraphs::None; // CUDA graphs in training: a private pool the eager allocations cannot use
    ParallelConfig parallel;           // distributed layout (default: one GPU)
    // --calibration (memory/calibration.hpp): terms fitted to a measured run,
    // applied to every estimate of this request. The front end reads it from
    // OtherInputs::calibration (a file or the document inline).
    std::shared_ptr<const Calibration> calibration;
};

// ---- command inputs ---------------------------------------------------------
// Plain data read by the plan layer (time model, planner, sweep): defined with
// the request so that the one field table (memory/fields.hpp) can fill them.

// How load_model reads this request's MODEL (presets only or files too; its ONNX loss).
inline ModelLoadOptions model_options(const EstimateRequest& r) {
    ModelLoadOptions o;
    o.onnx.loss = r.loss.value_or("");
    o.files = r.files;
    return o;
}

struct ComputeOptions {
    // End-to-end model FLOPs utilisation (PaLM's MFU): step = 6ND / (GPUs x
    // peak x mfu), bubble and communication inside it. Default: predicted.
    std::optional<double> mfu;
    std::optional<double> achieved_tflops;   // per GPU, end-to-end (model FLOPs), overrides the prediction
    // Compute-only efficiencies (fraction of the dense peak) overriding the
    // calibrated defaults: GEMMs, and fused (flash) attention kernels.
    std::optional<double> gemm_efficiency;
    std::optional<double> attention_efficiency;
    std::optional<double> fp8_efficiency;    // FP8 linears (--fp8), fraction of the FP8 peak
    std::optional<double> tokens;            // token budget for time / GPU-hours (training)
    std::optional<double> price_per_gpu_hour;  // flag name in errors: --price-per-gpu-hour
    std::optional<double> nvlink_gbs;        // intra-node link, GB/s per GPU (default by GPU)
    std::optional<double> ib_gbs;            // inter-node link, GB/s per GPU (default by GPU)
    // fp32 matmuls on TF32 tensor cores (torch.backends.cuda.matmul.allow_tf32 = True or
    // torch.set_float32_matmul_precision("high")); PyTorch's default since 1.12 is False.
    bool tf32 = false;
    // Linear layers run FP8 GEMMs (TransformerEngine fp8 autocast, torchao
    // Float8Linear); attention and the rest stay in the 16-bit dtype. Time only:
    // memory is modelled as the 16-bit run.
    bool fp8 = false;
    // Tensor-parallel collectives overlapped with the GEMMs (Megatron
    // --tp-comm-overlap with TransformerEngine userbuffers, torchtitan async TP).
    // Megatron-LM's default is off: the collectives block.
    bool tp_comm_overlap = false;
    // Data-parallel gradient reduction (and the distributed optimizer's / ZeRO's
    // parameter all-gather) overlapped with the backward (forward) pass: PyTorch
    // DDP and FSDP do it by default, Megatron with --overlap-grad-reduce
    // --overlap-param-gather, DeepSpeed with overlap_comm. Off: after the backward.
    bool dp_comm_overlap = true;
    // Tokens per sample for --params jobs (no graph, so the job's own seq is 1);
    // the CLI passes --seq here. Default 2048.
    std::optional<std::int64_t> seq;
};

struct SweepRequest {
    EstimateRequest base;               // everything but batch and seq
    std::vector<std::int64_t> batches;  // empty: {base.batch}
    std::vector<std::int64_t> seqs;     // empty: {base.seq} (or the model's default)
    bool simulate = true;               // false: analytic estimate() only (fast)
};

struct PlanRequest {
    EstimateRequest base;             // model, seq, gpu, mode, precision, optimizer ...; parallel.gpus / nodes / gpus_per_node = the cluster
    std::int64_t global_batch = 0;    // sequences per optimizer step (default: 4 per GPU)
    double headroom = 0.05;           // keep this fraction of the GPU free
    std::int64_t top = 10;
    std::int64_t confirm = 5;         // winners re-checked by the simulator
    // Restrictions (empty = search all). --only-tp may go beyond a node.
    std::vector<std::int64_t> tp, pp, cp, ep;
    std::vector<int> zero;
    std::vector<Recompute> recompute;
    std::vector<Precision> precision; // searched precisions (implies search_precision)
    std::vector<Optimizer> optimizer; // searched optimizers (implies search_optimizer)
    bool search_precision = false;    // also try bf16 / amp-bf16 / fp16 beside the user's
    bool search_optimizer = false;    // also try 8-bit AdamW and Adafactor beside the user's
    bool allow_offload = true;
    ComputeOptions compute;
    int threads = 0;                  // 0: all cores
};

// Serving engines (gpumem serving, memory/serving.hpp): the engine and its
// own start-up settings, each defaulting to the engine's documented default.
enum class Engine { VLLM, SGLang, LlamaCpp, TGI, TRTLLM };
const char* to_string(Engine);
struct ServingOptions {
    std::optional<Engine> engine;                         // vLLM unless given (or set by the command line after --); fit: given = the engine's fit
    std::optional<double> gpu_memory_utilization;         // vLLM --gpu-memory-utilization (0.9)
    std::optional<std::int64_t> max_model_len;            // tokens per request (the model's maximum positions)
    std::optional<std::int64_t> max_num_seqs;             // requests per step (1024 on GPUs >= 70 GiB but A100, else 256)
    std::optional<std::int64_t> max_num_batched_tokens;   // tokens per step (8192 / 2048 likewise)
    std::optional<std::int64_t> block_size;               // KV block size in tokens (16)
    std::optional<Bytes> kv_cache_memory;                 // vLLM --kv-cache-memory: the KV budget itself
    bool enforce_eager = false;                           // no CUDA graphs
    bool enable_prefix_caching = false;                   // vLLM --enable-prefix-caching (off for hybrid linear-attention models in 0.19)
    std::optional<double> cpu_offload_gb;                 // vLLM --cpu-offload-gb: GiB of each GPU's weights kept in pinned host memory (0)
    std::optional<std::int64_t> data_parallel_size;       // vLLM --data-parallel-size: engine replicas (1)
    bool enable_expert_parallel = false;                  // vLLM --enable-expert-parallel: routed experts over tp x dp ranks, whole
    std::optional<double> mem_fraction_static;            // SGLang --mem-fraction-static (its default rule by GPU and layout)
    std::optional<std::int64_t> max_total_tokens;         // SGLang --max-total-tokens: caps the KV pool
    std::optional<std::string> engine_version;            // whose defaults apply (vLLM "0.19"; SGLang "0.5.6" or "0.4.6")
    std::optional<std::int64_t> request_len;              // tokens per request the concurrency is asked for (max_model_len)
    std::optional<std::int64_t> output_len;               // generated tokens per request, for the throughput (256)
    std::vector<std::string> command;                     // the engine's own command line (after `--`)
    // llama.cpp (memory/llamacpp.hpp); -c, -b, -np are max_model_len's ctx_size, max_num_batched_tokens, max_num_seqs.
    std::optional<std::string> quant;                     // GGUF file type when no .gguf is at hand (Q4_K_M, Q8_0, F16, ...)
    std::optional<std::int64_t> n_gpu_layers;             // -ngl: layers offloaded (all)
    std::optional<std::int64_t> ctx_size;                 // -c: KV cells over all slots (0: the model's training context)
    std::optional<std::int64_t> ubatch_size;              // -ub: physical batch (512)
    std::optional<std::string> flash_attn;                // -fa on|off|auto (auto)
    std::optional<std::string> cache_type_k, cache_type_v;  // -ctk / -ctv (f16)
    std::optional<std::string> tensor_split;              // -ts 3,1: devices and their shares of the layers
    std::optional<std::string> split_mode;                // -sm none|layer (layer)
    bool no_mmap = false;                                 // --no-mmap: CPU weights copied into RAM, not mapped
    bool no_kv_offload = false;                           // -nkvo: KV cache in host RAM
    std::optional<bool> kv_unified;                       // -kvu: one KV stream shared by the slots
    bool swa_full = false;                                // --swa-full: sliding-window layers keep the whole context
    std::optional<double> cuda_memory_fraction;           // TGI --cuda-memory-fraction (1.0)
    std::optional<double> free_gpu_memory_fraction;       // TensorRT-LLM kv_cache_free_gpu_memory_fraction (0.9)
};

// Inputs of the commands that are not jobs (doctor, snapshot, compat).
struct OtherInputs {
    std::string message;                      // doctor: the CUDA out-of-memory text ("-": standard input)
    std::string file;                         // snapshot: the snapshot file; compat megatron: the argument JSON
    std::string data;                         // snapshot: the file's bytes (uploads)
    std::optional<std::int64_t> device;       // snapshot: device index
    bool replay = true;                       // snapshot: replay the trace (false: summary only)
    std::int64_t stage = 3;                   // compat deepspeed: ZeRO stage
    std::optional<std::int64_t> largest_layer_params;  // compat deepspeed (cold estimate, stage 3)
    double buffer_factor = 1.5;               // compat deepspeed: additional_buffer_factor
    std::string timeline;                     // estimate: write the simulated timeline here (CLI)
    std::string out;                          // calibrate: write the calibration document here (CLI)
    std::string plot;                         // sweep: write an SVG plot here (CLI)
    std::string format = "text";              // text|json|csv|markdown (CLI)
    nlohmann::json config;                    // estimate: an uploaded config.json (service, Python)
    // --calibration: a calibration file's path (CLI, Python) or the document
    // itself (JSON requests); parsed into EstimateRequest::calibration.
    nlohmann::json calibration;
    // calibrate: what the user measured for the job (any of them).
    std::optional<Bytes> measured_allocated;  // torch.cuda.max_memory_allocated()
    std::optional<Bytes> measured_reserved;   // torch.cuda.max_memory_reserved()
    std::optional<Bytes> measured_total;      // nvidia-smi "used" for the process
};

// Everything any command takes, filled only through the field table.
struct Request {
    EstimateRequest job;
    ComputeOptions compute;
    PlanRequest plan;    // .base and .compute are copied from job/compute by the dispatch
    SweepRequest sweep;  // .base likewise
    ServingOptions serving;
    OtherInputs other;
};

// Enum parsers used by every front end: the error names the flag and lists
// the accepted values.
Result<Mode> parse_mode(std::string_view s);
Result<Precision> parse_precision(std::string_view s);
Result<Optimizer> parse_optimizer(std::string_view s);
Result<Recompute> parse_recompute(std::string_view s);
Result<Attention> parse_attention(std::string_view s);
Result<Quant> parse_quant(std::string_view s);
Result<OptimizerImpl> parse_optimizer_impl(std::string_view s);
Result<ZeroGrad> parse_zero_grad(std::string_view s);
Result<AllocatorKind> parse_allocator(std::string_view s);
// "7,8,8,7" -> {7, 8, 8, 7}: a comma-separated list of counts, zeros and repeats allowed (--pp-layers).
Result<std::vector<std::int64_t>> parse_count_list(std::string_view s, std::string_view field);
// "24GiB", "80GB", "1.5 TiB", "512MiB", "1073741824" -> bytes.
Result<Bytes> parse_size(std::string_view s, std::string_view field);

// Fills a request from a JSON object whose keys are the CLI flag names
// ("model", "mode", "batch", "seq", "grad-accum" or "grad_accum", ...).
Result<EstimateRequest> request_from_json(const nlohmann::json& body);
nlohmann::json request_to_json(const EstimateRequest& r);

// The command line that reproduces a request (`gpumem <command> MODEL --flag
// value ...`, defaults omitted): printed by failing invariant checks and by
// the planner so that any job can be re-run as it was.
std::string request_to_command(const EstimateRequest& r, std::string_view command = "estimate");

}  // namespace gpumem
