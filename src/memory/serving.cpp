// GPU memory of a model served by an engine (gpumem/memory/serving.hpp).
#include "gpumem/memory/serving.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "gpumem/memory/gpu_catalog.hpp"
#include "gpumem/memory/job.hpp"
#include "engine_args.hpp"
#include "gpumem/memory/llamacpp.hpp"
#include "gpumem/memory/paged_kv.hpp"
#include "gpumem/memory/weight_quant.hpp"
#include "gpumem/memory/parallel.hpp"
#include "gpumem/model/load.hpp"

namespace gpumem {

namespace {

using engine_args::check;
using engine_args::to_fraction;

std::string gib(Bytes b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f", static_cast<double>(b.count()) / 1073741824.0);
    return buf;
}

// `--dtype`: both engines take auto, bfloat16, float16/half, float32/float.
void apply_model_dtype(const std::string& engine, const std::string& v, EstimateRequest& job) {
    if (v == "bfloat16") job.precision = Precision::BF16;
    else if (v == "float16" || v == "half") job.precision = Precision::FP16;
    else if (v == "float32" || v == "float") job.precision = Precision::FP32;
    else check(v == "auto", "precision", engine + " --dtype " + v + " is not modelled (auto, bfloat16, float16, float32)");
}

}  // namespace

namespace {

bool is_python(const std::string& a) { return a.rfind("python", 0) == 0; }

// `python -m sglang.launch_server ...` / `sglang serve ...`: SGLang's flag
// names (server_args.py@7ae368efde14 ServerArgs.add_cli_args).
void apply_sglang_command(const std::vector<std::string>& argv, std::size_t i, ServingOptions& o, EstimateRequest& job) {
    o.engine = Engine::SGLang;
    engine_args::FlagReader f(argv, i, "sglang");
    static const std::vector<std::string> kIgnored = {"--host", "--port", "--served-model-name", "--api-key", "--log-level", "--random-seed",
                                                      "--tokenizer-path", "--chat-template", "--revision", "--download-dir"};
    static const std::vector<std::string> kBool = {"--trust-remote-code", "--enable-metrics", "--disable-radix-cache", "--log-requests",
                                                   "--skip-tokenizer-init"};
    while (f.next()) {
        std::string a = f.flag();
        if (a.rfind("--", 0) != 0) fail(ErrorCode::InvalidArgument, "command", "unexpected argument \"" + a + "\" in the sglang command line");
        if (a == "--model-path" || a == "--model") {
            const std::string m = f.value();
            if (job.model.empty()) job.model = m;
        } else if (a == "--tp" || a == "--tp-size" || a == "--tensor-parallel-size") {
            job.parallel.tp = engine_args::to_int("sglang", a, f.value());
        } else if (a == "--pp" || a == "--pp-size" || a == "--pipeline-parallel-size") {
            job.parallel.pp = engine_args::to_int("sglang", a, f.value());
        } else if (a == "--mem-fraction-static") {
            o.mem_fraction_static = to_fraction("sglang", a, "mem-fraction-static", f.value());
        } else if (a == "--context-length") {
            o.max_model_len = engine_args::to_int("sglang", a, f.value());
        } else if (a == "--max-total-tokens") {
            o.max_total_tokens = engine_args::to_int("sglang", a, f.value());
        } else if (a == "--max-running-requests") {
            o.max_num_seqs = engine_args::to_int("sglang", a, f.value());
        } else if (a == "--chunked-prefill-size") {
            o.max_num_batched_tokens = engine_args::to_int("sglang", a, f.value());
        } else if (a == "--page-size") {
            o.block_size = engine_args::to_int("sglang", a, f.value());
        } else if (a == "--disable-cuda-graph") {
            o.enforce_eager = true;
        } else if (a == "--kv-cache-dtype") {
            const std::string v = f.value();
            if (v == "fp8_e5m2" || v == "fp8_e4m3") job.kv_dtype = DType::F8_E4M3;
            else if (v == "bf16" || v == "bfloat16") job.kv_dtype = DType::BF16;
            else check(v == "auto", "kv-dtype", "sglang --kv-cache-dtype " + v + " is not modelled (auto, fp8_e5m2, fp8_e4m3, bf16)");
        } else if (a == "--dtype") {
            apply_model_dtype("sglang", f.value(), job);
        } else if (a == "--quantization") {
            const std::string v = f.value();
            if (v == "fp8") o.quant = v;
        } else if (std::find(kBool.begin(), kBool.end(), a) != kBool.end()) {
        } else if (std::find(kIgnored.begin(), kIgnored.end(), a) != kIgnored.end()) {
            f.value();  // its value, ignored
        } else {
            fail(ErrorCode::InvalidArgument, "command",
                 "sglang " + a + " is not modelled by gpumem serving: drop it, or use the flags it models (--model-path, --tp, --pp, "
                 "--mem-fraction-static, --context-length, --max-total-tokens, --max-running-requests, --chunked-prefill-size, --page-size, "
                 "--kv-cache-dtype, --dtype, --disable-cuda-graph)");
        }
    }
}

// `text-generation-launcher --model-id MODEL ...` (launcher/src/main.rs Args @db931fcf).
void apply_tgi_command(const std::vector<std::string>& argv, std::size_t i, ServingOptions& o, EstimateRequest& job) {
    o.engine = Engine::TGI;
    engine_args::FlagReader f(argv, i, "tgi");
    static const std::vector<std::string> kIgnored = {"--hostname", "--port", "--max-concurrent-requests", "--revision", "--huggingface-hub-cache",
                                                      "--max-waiting-tokens", "--waiting-served-ratio", "--max-best-of", "--max-stop-sequences",
                                                      "--max-top-n-tokens", "--json-output", "--otlp-endpoint", "--api-key", "--cors-allow-origin",
                                                      "--shard-uds-path", "--master-addr", "--master-port", "--validation-workers"};
    static const std::vector<std::string> kBool = {"--trust-remote-code", "--disable-custom-kernels", "--json-output", "--sharded"};
    while (f.next()) {
        std::string a = f.flag();
        if (a.rfind("--", 0) != 0) fail(ErrorCode::InvalidArgument, "command", "unexpected argument \"" + a + "\" in the text-generation-launcher command line");
        if (a == "--model-id") {
            const std::string m = f.value();
            if (job.model.empty()) job.model = m;
        } else if (a == "--num-shard") {
            job.parallel.tp = engine_args::to_int("tgi", a, f.value());
        } else if (a == "--max-total-tokens") {
            o.max_total_tokens = engine_args::to_int("tgi", a, f.value());
        } else if (a == "--max-input-tokens" || a == "--max-input-length") {
            engine_args::to_int("tgi", a, f.value());  // bounds the warmup requests with --max-total-tokens; v3 sizes the warmup by the prefill budget
        } else if (a == "--max-batch-prefill-tokens") {
            o.max_num_batched_tokens = engine_args::to_int("tgi", a, f.value());
        } else if (a == "--max-batch-size") {
            o.max_num_seqs = engine_args::to_int("tgi", a, f.value());
        } else if (a == "--cuda-memory-fraction") {
            o.cuda_memory_fraction = to_fraction("tgi", a, "cuda-memory-fraction", f.value());
        } else if (a == "--max-batch-total-tokens") {
            f.value();  // ignored by flash models: the warmup infers it (backends/v3/src/lib.rs L89-97)
        } else if (a == "--cuda-graphs") {
            if (f.value() == "0") o.enforce_eager = true;
        } else if (a == "--kv-cache-dtype") {
            const std::string v = f.value();
            check(v == "fp8_e4m3fn" || v == "fp8_e5m2", "kv-dtype", "tgi --kv-cache-dtype takes fp8_e4m3fn or fp8_e5m2 (got " + v + ")");
            job.kv_dtype = DType::F8_E4M3;
        } else if (a == "--dtype") {
            apply_model_dtype("tgi", f.value(), job);
        } else if (a == "--quantize") {
            fail(ErrorCode::InvalidArgument, "command", "tgi --quantize is not modelled by gpumem serving yet (quantized weights)");
        } else if (std::find(kBool.begin(), kBool.end(), a) != kBool.end()) {
        } else if (std::find(kIgnored.begin(), kIgnored.end(), a) != kIgnored.end()) {
            f.value();
        } else {
            fail(ErrorCode::InvalidArgument, "command",
                 "tgi " + a + " is not modelled by gpumem serving: drop it, or use the flags it models (--model-id, --num-shard, --max-total-tokens, "
                 "--max-input-tokens, --max-batch-prefill-tokens, --max-batch-size, --cuda-memory-fraction, --kv-cache-dtype, --dtype, --cuda-graphs)");
        }
    }
}

// `trtllm-serve MODEL ...` (tensorrt_llm/commands/serve.py option names).
void apply_trtllm_command(const std::vector<std::string>& argv, std::size_t i, ServingOptions& o, EstimateRequest& job) {
    o.engine = Engine::TRTLLM;
    const std::size_t first = i;
    engine_args::FlagReader f(argv, i, "trtllm-serve");
    static const std::vector<std::string> kIgnored = {"--host", "--port", "--log_level", "--tokenizer", "--served_model_name", "--num_postprocess_workers",
                                                      "--reasoning_parser", "--metadata_server_config_file", "--server_role"};
    static const std::vector<std::string> kBool = {"--trust_remote_code"};
    while (f.next()) {
        std::string a = f.flag();
        if (a.rfind("--", 0) != 0) {
            check(job.model.empty() || f.index() == first, "command", "unexpected argument \"" + a + "\" in the trtllm-serve command line");
            if (job.model.empty()) job.model = a;
            continue;
        }
        std::replace(a.begin(), a.end(), '-', '_');
        a = "--" + a.substr(2);
        if (a == "--tp_size") {
            job.parallel.tp = engine_args::to_int("trtllm-serve", a, f.value());
        } else if (a == "--pp_size") {
            job.parallel.pp = engine_args::to_int("trtllm-serve", a, f.value());
        } else if (a == "--max_batch_size") {
            o.max_num_seqs = engine_args::to_int("trtllm-serve", a, f.value());
        } else if (a == "--max_num_tokens") {
            o.max_num_batched_tokens = engine_args::to_int("trtllm-serve", a, f.value());
        } else if (a == "--max_seq_len") {
            o.max_model_len = engine_args::to_int("trtllm-serve", a, f.value());
        } else if (a == "--kv_cache_free_gpu_memory_fraction") {
            o.free_gpu_memory_fraction = to_fraction("trtllm-serve", a, "free-gpu-memory-fraction", f.value());
        } else if (a == "--backend") {
            const std::string v = f.value();
            check(v == "pytorch", "command", "trtllm-serve --backend " + v + " is not modelled: a TensorRT engine's memory is fixed by its build (use the pytorch backend)");
        } else if (a == "--extra_llm_api_options") {
            fail(ErrorCode::InvalidArgument, "command", "trtllm-serve --extra_llm_api_options is not read by gpumem serving: give its settings as flags "
                                                        "(--free-gpu-memory-fraction, --max-total-tokens for max_tokens, --block-size for tokens_per_block)");
        } else if (std::find(kBool.begin(), kBool.end(), a) != kBool.end()) {
        } else if (std::find(kIgnored.begin(), kIgnored.end(), a) != kIgnored.end()) {
            f.value();
        } else {
            fail(ErrorCode::InvalidArgument, "command",
                 "trtllm-serve " + a + " is not modelled by gpumem serving: drop it, or use the options it models (--tp_size, --pp_size, --max_batch_size, "
                 "--max_num_tokens, --max_seq_len, --kv_cache_free_gpu_memory_fraction, --backend pytorch)");
        }
    }
}

// `vllm serve MODEL ...` / `python -m vllm.entrypoints.openai.api_server ...`
// from argument `i` on (vllm/engine/arg_utils.py flag names).
void apply_vllm_command(const std::vector<std::string>& argv, std::size_t i, ServingOptions& o, EstimateRequest& job) {
    o.engine = Engine::VLLM;
    const std::size_t first = i;
    engine_args::FlagReader f(argv, i, "vllm");
    // Flags that do not change memory are accepted and ignored.
    static const std::vector<std::string> kIgnored = {"--host", "--port", "--served-model-name", "--api-key", "--trust-remote-code",
                                                      "--disable-log-requests",
                                                      "--disable-log-stats", "--uvicorn-log-level", "--seed", "--tokenizer", "--revision",
                                                      "--download-dir", "--load-format", "--generation-config", "--chat-template"};
    static const std::vector<std::string> kBoolIgnored = {"--trust-remote-code", "--disable-log-requests", "--disable-log-stats"};
    while (f.next()) {
        const std::string a = f.flag();
        if (a.rfind("--", 0) != 0 && a != "-tp" && a != "-pp" && a != "-q") {
            check(job.model.empty() || f.index() == first, "command", "unexpected argument \"" + a + "\" in the vllm command line");
            if (job.model.empty()) job.model = a;  // a MODEL given before `--` stands in for this one
            continue;
        }
        if (a == "--model") {
            const std::string m = f.value();
            if (job.model.empty()) job.model = m;
        } else if (a == "--max-model-len") {
            o.max_model_len = engine_args::to_int("vllm", a, f.value());
        } else if (a == "--tensor-parallel-size" || a == "-tp") {
            job.parallel.tp = engine_args::to_int("vllm", a, f.value());
        } else if (a == "--pipeline-parallel-size" || a == "-pp") {
            job.parallel.pp = engine_args::to_int("vllm", a, f.value());
        } else if (a == "--gpu-memory-utilization") {
            o.gpu_memory_utilization = to_fraction("vllm", a, "gpu-memory-utilization", f.value());
        } else if (a == "--max-num-seqs") {
            o.max_num_seqs = engine_args::to_int("vllm", a, f.value());
        } else if (a == "--max-num-batched-tokens") {
            o.max_num_batched_tokens = engine_args::to_int("vllm", a, f.value());
        } else if (a == "--block-size") {
            o.block_size = engine_args::to_int("vllm", a, f.value());
        } else if (a == "--kv-cache-memory") {
            o.kv_cache_memory = Bytes(engine_args::to_int("vllm", a, f.value()));
        } else if (a == "--enforce-eager") {
            o.enforce_eager = true;
        } else if (a == "--cpu-offload-gb") {
            const std::string v = f.value();
            try {
                std::size_t used = 0;
                const double gb = std::stod(v, &used);
                check(used == v.size() && gb >= 0 && gb < 1e6, "cpu-offload-gb", "vllm --cpu-offload-gb " + v + ": give GiB as a number >= 0");
                o.cpu_offload_gb = gb;
            } catch (const std::logic_error&) {
                fail(ErrorCode::InvalidArgument, "cpu-offload-gb", "vllm --cpu-offload-gb " + v + ": give GiB as a number >= 0");
            }
        } else if (a == "--data-parallel-size" || a == "-dp") {
            o.data_parallel_size = engine_args::to_int("vllm", a, f.value());
        } else if (a == "--enable-expert-parallel" || a == "-ep") {
            o.enable_expert_parallel = true;
        } else if (a == "--enable-prefix-caching" || a == "--no-enable-prefix-caching") {
            o.enable_prefix_caching = a == "--enable-prefix-caching";
        } else if (a == "--kv-cache-dtype") {
            const std::string v = f.value();
            if (v == "fp8" || v == "fp8_e4m3" || v == "fp8_e5m2") job.kv_dtype = DType::F8_E4M3;
            else if (v == "bfloat16") job.kv_dtype = DType::BF16;
            else if (v == "float16" || v == "half") job.kv_dtype = DType::F16;
            else check(v == "auto", "kv-dtype", "vllm --kv-cache-dtype " + v + " is not modelled (auto, fp8, fp8_e4m3, fp8_e5m2, bfloat16, float16)");
        } else if (a == "--dtype") {
            apply_model_dtype("vllm", f.value(), job);
        } else if (a == "--quantization" || a == "-q") {
            const std::string v = f.value();
            if (v == "fp8") o.quant = v;  // online FP8; other methods come from the checkpoint's config
        } else if (std::find(kIgnored.begin(), kIgnored.end(), a) != kIgnored.end()) {
            if (std::find(kBoolIgnored.begin(), kBoolIgnored.end(), a) == kBoolIgnored.end()) f.value();  // its value, ignored
        } else {
            fail(ErrorCode::InvalidArgument, "command",
                 "vllm " + a + " is not modelled by gpumem serving: drop it, or use the flags it models (--max-model-len, --tensor-parallel-size, "
                 "--pipeline-parallel-size, --gpu-memory-utilization, --max-num-seqs, --max-num-batched-tokens, --block-size, --kv-cache-dtype, "
                 "--kv-cache-memory, --dtype, --enforce-eager, --enable-prefix-caching, --cpu-offload-gb, --data-parallel-size, --enable-expert-parallel)");
        }
    }
}

// `docker run [docker options] IMAGE [args]`: the engine by the image (vLLM's
// vllm/vllm-openai runs `vllm serve` with the args, TGI's launcher likewise,
// llama.cpp's server image llama-server; SGLang's and TensorRT-LLM's images
// take the whole command), its version by the tag unless --engine-version is given.
std::vector<std::string> docker_engine_argv(const std::vector<std::string>& argv, ServingOptions& o) {
    static const std::vector<std::string> kWithValue = {"-p", "--publish", "-v", "--volume", "-e", "--env", "--gpus", "--name", "--shm-size", "--ipc",
                                                        "--network", "--net", "--runtime", "-w", "--workdir", "--mount", "--env-file", "-u", "--user",
                                                        "--ulimit", "--cpus", "--memory", "-m", "--device", "--platform", "--entrypoint", "--hostname", "--label"};
    std::size_t i = 2;
    for (; i < argv.size(); ++i) {
        const std::string& a = argv[i];
        if (a.empty() || a[0] != '-') break;
        if (a.find('=') == std::string::npos && std::find(kWithValue.begin(), kWithValue.end(), a) != kWithValue.end()) ++i;
    }
    check(i < argv.size(), "command", "docker run: no image in the command line");
    const std::string image = argv[i];
    const std::vector<std::string> rest(argv.begin() + static_cast<std::ptrdiff_t>(i) + 1, argv.end());
    const auto colon = image.rfind(':');
    std::string tag = colon == std::string::npos || image.find('/', colon) != std::string::npos ? "" : image.substr(colon + 1);
    if (!tag.empty() && tag[0] == 'v') tag = tag.substr(1);
    const auto minor = [&](int want_major) {  // "0.7.3" -> 7 when the major is want_major, else -1
        int major = -1, mi = -1;
        if (std::sscanf(tag.c_str(), "%d.%d", &major, &mi) == 2 && major == want_major) return mi;
        return -1;
    };
    std::vector<std::string> out;
    if (image.find("vllm-openai") != std::string::npos) {
        // vLLM before 0.8 ran the V0 engine by default.
        const int mi = minor(0);
        if (!o.engine_version && mi >= 6 && mi < 8) o.engine_version = tag.substr(0, tag.find('.', tag.find('.') + 1));
        if (!o.engine_version && mi >= 0 && mi < 6)
            fail(ErrorCode::InvalidArgument, "engine-version", "vLLM " + tag + " (the image's tag) is older than the versions gpumem models (0.6.4 and later)");
        out = {"vllm", "serve"};
    } else if (image.find("text-generation-inference") != std::string::npos) {
        int major = -1, mi = -1;
        if (!o.engine_version && std::sscanf(tag.c_str(), "%d.%d", &major, &mi) == 2)
            o.engine_version = major >= 3 ? (mi >= 3 ? "3.3" : mi >= 1 ? "3.1" : "3.0") : "2.2";
        out = {"text-generation-launcher"};
    } else if (image.find("llama.cpp") != std::string::npos) {
        out = {"llama-server"};
    } else if (image.find("sglang") != std::string::npos || image.find("tensorrt") != std::string::npos || image.find("trtllm") != std::string::npos) {
        if (!o.engine_version && image.find("sglang") != std::string::npos && minor(0) == 4) o.engine_version = "0.4.6";
        return rest;  // the image takes the engine's whole command
    } else {
        fail(ErrorCode::InvalidArgument, "command",
             "docker image " + image + " is not one gpumem serving knows (vllm/vllm-openai, lmsysorg/sglang, ghcr.io/huggingface/text-generation-inference, "
             "nvcr.io/nvidia/tensorrt-llm, ghcr.io/ggml-org/llama.cpp:server)");
    }
    out.insert(out.end(), rest.begin(), rest.end());
    return out;
}

}  // namespace

void apply_engine_command(const std::vector<std::string>& argv, ServingOptions& o, EstimateRequest& job) {
    if (argv.empty()) return;
    if (argv.size() >= 2 && (argv[0] == "docker" || argv[0] == "podman") && argv[1] == "run") {
        const auto inner = docker_engine_argv(argv, o);
        check(!inner.empty() && !(inner.size() == 1 && inner[0] == "docker"), "command", "docker run: no engine command after the image");
        return apply_engine_command(inner, o, job);
    }
    // `vllm serve MODEL ...` or `python -m vllm.entrypoints.openai.api_server --model MODEL ...`
    std::size_t i = 0;
    if (argv.size() >= 3 && is_python(argv[0]) && argv[1] == "-m" && argv[2].rfind("sglang.launch_server", 0) == 0)
        return apply_sglang_command(argv, 3, o, job);
    if (argv.size() >= 2 && argv[0] == "sglang" && argv[1] == "serve") return apply_sglang_command(argv, 2, o, job);
    if (argv[0] == "text-generation-launcher") return apply_tgi_command(argv, 1, o, job);
    if (argv[0] == "trtllm-serve") return apply_trtllm_command(argv, argv.size() > 1 && argv[1] == "serve" ? 2 : 1, o, job);
    // llama-server / llama-cli, with or without a path (build/bin/llama-server).
    {
        const std::string prog = argv[0].substr(argv[0].find_last_of('/') == std::string::npos ? 0 : argv[0].find_last_of('/') + 1);
        if (prog == "llama-server" || prog == "llama-cli" || prog == "llama-server.exe" || prog == "llama-cli.exe") {
            if (!o.max_num_seqs && prog.rfind("llama-cli", 0) == 0) o.max_num_seqs = 1;  // one conversation
            return apply_llamacpp_command(argv, 1, o, job);
        }
    }
    if (argv.size() >= 2 && argv[0] == "vllm" && argv[1] == "serve") {
        i = 2;
    } else if (argv.size() >= 3 && is_python(argv[0]) && argv[1] == "-m" && argv[2].rfind("vllm.entrypoints", 0) == 0) {
        i = 3;
    } else {
        fail(ErrorCode::InvalidArgument, "command",
             "the engine command line must start with `vllm serve`, `python -m vllm.entrypoints.openai.api_server`, "
             "`python -m sglang.launch_server`, `sglang serve`, `text-generation-launcher`, `trtllm-serve`, `llama-server`, `llama-cli` or `docker run IMAGE ...` (got \"" + argv[0] + "\")");
    }
    apply_vllm_command(argv, i, o, job);
}

namespace {


// Weights of each pipeline stage's ranks: gpumem's inference layout (each
// rank's share of the tensor-parallel weights, the stage's layers).
ParallelResult served_layout(const ModelGraph& g, const EstimateRequest& job, Precision prec, std::int64_t tp, std::int64_t pp, std::int64_t max_len,
                             Bytes* nccl_per_communicator, std::int64_t ep_dp = 1) {
    EstimateRequest inf = job;
    inf.mode = Mode::Infer;
    inf.precision = prec;
    inf.batch = 1;
    inf.seq = std::min<std::int64_t>(16, max_len);
    inf.gen_len = 0;
    inf.analytic = true;
    inf.parallel.tp = tp;
    inf.parallel.pp = pp;
    // Expert parallelism over tp x dp ranks (vLLM's EP group): each rank holds
    // 1 / (tp x dp) of the experts' bytes, as gpumem's ep over dp with the
    // experts split by tp gives.
    inf.parallel.gpus = tp * pp * ep_dp;
    inf.parallel.ep = ep_dp;
    const Job resolved = take(resolve_job(g, inf));
    *nccl_per_communicator = resolved.layout.cfg.nccl_per_communicator;
    return parallel_memory(g, resolved);
}

// Memory outside PyTorch that tensor parallelism adds (NCCL and the engine's
// all-reduce buffers): measured 1.79 GiB per rank on H100 at tp 2 (vLLM PR
// #10511: non_torch_memory 3.58 GiB against 1.79 GiB at tp 1); other GPUs and
// pipeline-only layouts: one NCCL communicator (docs/assumptions.md).
Bytes tp_buffers(const GpuSpec& gpu, std::int64_t tp, std::int64_t pp, Bytes nccl_per_communicator) {
    const bool nvswitch_gen = gpu.arch == "hopper" || gpu.arch == "blackwell";
    return tp > 1 && nvswitch_gen ? MiB(1833) : tp * pp > 1 ? nccl_per_communicator : Bytes(0);
}

// nvidia-smi's memory.total (MiB), which SGLang's default fraction reads
// (get_nvgpu_memory_capacity), where public logs show it; else CUDA's total.
std::int64_t nvidia_smi_mib(const GpuSpec& gpu, Bytes capacity) {
    static const std::map<std::string, std::int64_t> kSmi = {{"H100-80GB", 81559}, {"A100-80GB", 81920}, {"A100-40GB", 40960},
                                                             {"H200-141GB", 143771}, {"RTX-4090", 24564}, {"L4-24GB", 23034}};
    const auto it = kSmi.find(gpu.name);
    return it != kSmi.end() ? it->second : capacity.count() / (1024 * 1024);
}

// What every engine reads the same way: the card, the layout, the weights'
// and the cache's dtypes (the result's names are filled here too).
struct Served {
    GpuSpec gpu;
    Bytes capacity;
    std::int64_t tp = 1, pp = 1;
    Precision prec = Precision::BF16;
    DType model_dt = DType::BF16, kv_dt = DType::BF16;
};
Served served_basics(const ModelGraph& g, const EstimateRequest& job, Engine engine, ServingResult& out) {
    Served s;
    out.model_name = g.name;
    out.engine = to_string(engine);
    out.job = job;
    s.tp = std::max<std::int64_t>(1, job.parallel.tp);
    s.pp = std::max<std::int64_t>(1, job.parallel.pp);
    out.tp = s.tp;
    out.pp = s.pp;
    s.gpu = take(find_gpu(job.gpu));
    out.gpu = s.gpu.name;
    s.capacity = job.gpu_memory.value_or(s.gpu.memory);
    s.prec = job.precision.value_or(Precision::BF16);
    check(s.prec == Precision::BF16 || s.prec == Precision::FP16 || s.prec == Precision::FP32, "precision",
          "serving runs the weights in bf16, fp16 or fp32 (--precision bf16|fp16|fp32)");
    s.model_dt = s.prec == Precision::FP32 ? DType::F32 : s.prec == Precision::FP16 ? DType::F16 : DType::BF16;
    s.kv_dt = job.kv_dtype.value_or(s.model_dt);
    return s;
}

// What the engine loads beyond the parameters: the RoPE cache (vLLM, SGLang)
// and the checkpoint's quantization_config (or --quant fp8, vLLM's and
// SGLang's online FP8) applied to each stage's weights (memory/weight_quant.hpp).
void adjust_served_weights(const ModelGraph& g, const ServingOptions& o, const Served& sv, ParallelResult& par, ServingResult& out, bool rope = true) {
    std::optional<WeightQuant> q = g.weight_quant;
    if (o.quant) {
        check(*o.quant == "fp8", "quant", "--quant " + *o.quant + ": vLLM, SGLang and TGI quantize online only to fp8 here (--quant fp8); "
                                          "quantized checkpoints are read from their config.json's quantization_config");
        check(!q, "quant", "--quant fp8: the checkpoint is already quantized (" + (q ? q->method : std::string()) + ")");
        q = online_fp8();
    }
    // vLLM's RoPE cos/sin caches, one per rank and RoPE config, [max_positions,
    // rotary_dim] in the model dtype (rotary_embedding/base.py), are part of
    // what "Model loading took" counts (docs/research/quant.md section 1).
    if (rope && g.max_positions > 0 && g.transformer->rotary_dim > 0) {
        const Bytes cache = dtype_bytes(g.transformer->rope_fp32 ? DType::F32 : sv.model_dt,
                                        checked_mul(checked_mul(g.transformer->rope_configs, g.max_positions), g.transformer->rotary_dim));
        for (auto& st : par.stages) st.weights = st.weights + cache;
    }
    if (!q) return;
    std::vector<std::int64_t> layers;
    for (const auto& st : par.stages) layers.push_back(st.layers);
    const auto delta = quantized_weight_delta(g, *q, sv.tp, layers, dtype_bytes(sv.model_dt, 1).count(), sv.gpu);
    for (std::size_t s = 0; s < par.stages.size() && s < delta.size(); ++s) par.stages[s].weights = par.stages[s].weights + delta[s];
    out.assumptions.push_back(describe_weight_quant(*q, sv.gpu));
}

// Engines whose linear-attention state (Qwen3-Next) or chunked-attention KV
// layout (Llama 4) gpumem does not model answer with an error rather than a
// KV pool that pages every layer in full.
void refuse_unmodelled_layouts(const TransformerDims& d, const std::string& engine) {
    check(d.linear_layers.empty(), "engine",
          engine + "'s state for linear-attention layers (Qwen3-Next) is not modelled; gpumem serving answers for this model with --engine vllm");
    check(d.attention_chunk == 0, "engine",
          engine + "'s KV cache for chunked local attention (Llama 4) is not modelled; gpumem serving answers for this model with --engine vllm");
}

// One layer's MLP working set for `tokens` tokens (an estimate of the
// engines' activation and CUDA-graph peaks): the residual and normed hidden
// states, the gate/up projection and its activation (SwiGLU/GeGLU families;
// non-gated MLPs are smaller).
Bytes mlp_working_set(const TransformerDims& d, std::int64_t tp, DType dt, std::int64_t tokens) {
    const std::int64_t I = (d.intermediate + tp - 1) / tp;
    return dtype_bytes(dt, checked_mul(tokens, 2 * d.hidden + 3 * I));
}

}  // namespace

std::int64_t sglang_kv_tokens(Bytes pre, Bytes after, double mem_fraction_static, Bytes cell, std::int64_t page_size,
                              std::optional<std::int64_t> max_total_tokens) {
    const double rest = static_cast<double>(after.count()) - static_cast<double>(pre.count()) * (1.0 - mem_fraction_static);
    if (rest <= 0 || cell <= Bytes(0)) return 0;
    std::int64_t tokens = static_cast<std::int64_t>(std::floor(rest / static_cast<double>(cell.count())));
    if (max_total_tokens) tokens = std::min(tokens, *max_total_tokens);
    const std::int64_t page = std::max<std::int64_t>(1, page_size);
    return tokens / page * page;
}

double sglang_default_mem_fraction(const std::string& version, std::int64_t gpu_mem_mib, std::int64_t tp, std::int64_t pp,
                                   std::int64_t chunked_prefill_size, std::int64_t cuda_graph_max_bs) {
    if (version == "0.4.6") {
        // v0.4.6.post1 server_args.py L221-238: a ladder by tp on GPUs up to
        // 80 GB, else 13 GiB reserved.
        if (gpu_mem_mib > 81920) return static_cast<double>(gpu_mem_mib - 13 * 1024) / static_cast<double>(gpu_mem_mib);
        return tp >= 16 ? 0.79 : tp >= 8 ? 0.81 : tp >= 4 ? 0.85 : tp >= 2 ? 0.87 : 0.88;
    }
    // v0.5.6 server_args.py L701-867: reserved MiB = 512 + 1.5 x max(chunked
    // prefill, 2048) + 2 x cuda_graph_max_bs + tp x pp / 8 GiB, at least 10 GiB
    // on GPUs above 60 GiB; fraction rounded to 3 decimals.
    double reserved = 512.0 + 1.5 * static_cast<double>(std::max<std::int64_t>(chunked_prefill_size, 2048)) + 2.0 * static_cast<double>(cuda_graph_max_bs) +
                      static_cast<double>(tp * pp) / 8.0 * 1024.0;
    if (gpu_mem_mib > 60 * 1024) reserved = std::max(reserved, 10240.0);
    return std::round((static_cast<double>(gpu_mem_mib) - reserved) / static_cast<double>(gpu_mem_mib) * 1000.0) / 1000.0;
}

namespace {

// SGLang (docs/research/sglang.md; v0.5.6 = 7ae368efde14): the KV pool is what
// is left of mem_fraction_static x the free memory before the weights load;
// the rest of that free memory is slack for the request table, CUDA graphs
// and activations.
ServingResult sglang_memory(const ModelGraph& g, const EstimateRequest& job, const ServingOptions& o) {
    const TransformerDims& d = *g.transformer;
    refuse_unmodelled_layouts(d, "SGLang");
    ServingResult out;
    const Served sv = served_basics(g, job, o.engine.value_or(Engine::VLLM), out);
    const std::string version = o.engine_version.value_or("0.5.6");
    check(version == "0.5.6" || version == "0.4.6", "engine-version",
          "SGLang " + version + " is not modelled: gpumem serving knows SGLang 0.5.6 (the default) and 0.4.6 (their default fractions and sizes)");
    out.engine_version = version;
    const std::int64_t tp = sv.tp, pp = sv.pp;
    const Bytes capacity = sv.capacity;
    const std::int64_t smi = nvidia_smi_mib(sv.gpu, capacity);
    check(!o.gpu_memory_utilization, "gpu-memory-utilization", "--gpu-memory-utilization is vLLM's; SGLang's is --mem-fraction-static");
    // Defaults by GPU memory (server_args.py, v0.5.6 L725-807; v0.4.6 L241-272).
    const std::int64_t smi_gib = smi / 1024;
    const std::int64_t chunk_default = version == "0.4.6" ? (smi < 25000 ? 2048 : 8192)
                                                          : smi_gib < 35 ? 2048 : smi_gib < 60 ? 4096 : smi_gib < 160 ? 8192 : 16384;
    const std::int64_t graph_bs = version == "0.4.6" ? (smi < 25000 ? (tp < 4 ? 8 : 80) : smi > 81920 ? 256 : 160)
                                  : smi_gib < 20   ? 8
                                  : smi_gib < 35   ? (tp < 4 ? 24 : 80)
                                  : smi_gib < 60   ? (tp < 4 ? 32 : 160)
                                  : smi_gib < 160  ? (tp < 4 ? 256 : 512)
                                                   : 512;
    out.max_num_batched_tokens = o.max_num_batched_tokens.value_or(chunk_default);
    out.block_size = o.block_size.value_or(1);
    out.max_model_len = o.max_model_len.value_or(g.max_positions > 0 ? g.max_positions : 2048);
    check(out.max_model_len >= 1, "max-model-len", "--context-length must be a positive integer");
    check(out.block_size >= 1, "block-size", "--page-size must be a positive integer");
    const double mfs = o.mem_fraction_static.value_or(sglang_default_mem_fraction(version, smi, tp, pp, out.max_num_batched_tokens, graph_bs));
    check(mfs > 0.0 && mfs < 1.0, "mem-fraction-static", "--mem-fraction-static must be in (0, 1)");
    out.mem_fraction_static = mfs;

    Bytes nccl_comm;
    ParallelResult par = served_layout(g, job, sv.prec, tp, pp, out.max_model_len, &nccl_comm);
    adjust_served_weights(g, o, sv, par, out);
    const Bytes nccl = tp_buffers(sv.gpu, tp, pp, nccl_comm);
    const Bytes context = job.cuda_context.value_or(sv.gpu.cuda_context);
    // Free memory before the weights load: what the context and the
    // communicators leave (SGLang takes the minimum over ranks).
    const Bytes pre = capacity > context + nccl ? capacity - context - nccl : Bytes(0);
    std::int64_t tokens = -1;
    std::vector<Bytes> cells;
    for (std::size_t s = 0; s < par.stages.size(); ++s) {
        // One token's K and V on this rank over the stage's layers
        // (model_runner.py L1384-1437).
        const Bytes cell = kv_token_bytes_per_layer(d, tp, sv.kv_dt) * par.stages[s].layers;
        cells.push_back(cell);
        const Bytes after = pre > par.stages[s].weights ? pre - par.stages[s].weights : Bytes(0);
        const std::int64_t t = sglang_kv_tokens(pre, after, mfs, cell, out.block_size, o.max_total_tokens);
        tokens = tokens < 0 ? t : std::min(tokens, t);
    }
    tokens = std::max<std::int64_t>(0, tokens);
    // The request table (ReqToTokenPool: int32 [reqs, context + 4]), sized
    // after the KV pool from the slack (L1676-1685).
    const std::int64_t reqs = o.max_num_seqs.value_or(std::clamp<std::int64_t>(static_cast<std::int64_t>(
                                                                                    static_cast<double>(tokens) / static_cast<double>(out.max_model_len) * 512.0),
                                                                                2048, 4096));
    out.max_num_seqs = std::min(o.max_num_seqs.value_or(tokens / 2), reqs);
    const Bytes request_table = Bytes(checked_mul(checked_mul(reqs, out.max_model_len + 4), 4));
    const Bytes forward_peak = mlp_working_set(d, tp, sv.model_dt, out.max_num_batched_tokens);
    std::vector<ServingPerGpu> ranks;
    for (std::size_t s = 0; s < par.stages.size(); ++s) {
        ServingPerGpu r;
        r.weights = par.stages[s].weights;
        r.non_torch = nccl;
        r.cuda_context = context;
        r.capacity = capacity;
        r.requested = Bytes(static_cast<std::int64_t>(static_cast<double>(pre.count()) * mfs));
        r.kv_cache = tokens > 0 ? Bytes(checked_mul(tokens + out.block_size, cells[s].count())) : Bytes(0);
        r.request_table = request_table;
        r.activation_peak = forward_peak;
        r.cuda_graph = o.enforce_eager ? Bytes(0) : mlp_working_set(d, tp, sv.model_dt, graph_bs);
        r.total_device = r.cuda_context + r.non_torch + r.weights + r.kv_cache + r.request_table + r.activation_peak + r.cuda_graph;
        ranks.push_back(r);
    }
    out.kv_cache_tokens = tokens;
    out.fit_max_model_len = g.max_positions > 0 ? std::min(tokens, g.max_positions) : tokens;
    out.kv_cache_blocks = tokens / out.block_size;
    out.max_concurrency = static_cast<double>(tokens) / static_cast<double>(out.max_model_len);
    engine_args::set_request_len(out, o, "the engine's maximum request length", "the engine rejects such requests; raise --max-model-len or shorten --request-len");
    out.concurrency_at_request_len = static_cast<double>(tokens) / static_cast<double>(out.request_len);
    if (tokens <= 0) out.error = "Not enough memory. Please try to increase --mem-fraction-static.";
    std::size_t worst = 0;
    for (std::size_t s = 0; s < ranks.size(); ++s) {
        ranks[s].fits = out.error.empty() && ranks[s].total_device <= capacity;
        if (ranks[s].total_device > ranks[worst].total_device) worst = s;
    }
    out.per_rank = ranks;
    out.per_gpu = ranks[worst];
    char frac[32];
    std::snprintf(frac, sizeof frac, "%.3f", mfs);
    out.assumptions.push_back("SGLang " + version + ": KV pool = mem_fraction_static x free memory before the weights load - weights, in tokens of " +
                              std::to_string(cells.empty() ? 0 : cells.front().count()) + " bytes, rounded down to the page (" +
                              std::to_string(out.block_size) + "); the request table, CUDA graphs and activations use the rest (docs/research/sglang.md)");
    out.assumptions.push_back(std::string("mem_fraction_static ") + frac +
                              (o.mem_fraction_static ? "" : " (SGLang " + version + "'s default for " + std::to_string(smi) + " MiB, tp x pp " + std::to_string(tp * pp) + ")") +
                              ", chunked_prefill_size " + std::to_string(out.max_num_batched_tokens) + ", cuda_graph_max_bs " + std::to_string(graph_bs));
    out.assumptions.push_back("activations (an estimate): one chunk of " + std::to_string(out.max_num_batched_tokens) +
                              " tokens through one layer's MLP; CUDA graphs (an estimate): the largest captured batch's MLP working set");
    if (tp > 1) out.assumptions.push_back("tensor-parallel buffers outside PyTorch: as vLLM's (1.79 GiB per rank on H100-class GPUs, PR #10511), not measured for SGLang");
    return out;
}

// ---- TGI (docs/research/tgi.md; text-generation-inference db931fcf42da,
// the last release v3.3.7 = dfb3fbe78e0d, and the tags named there) --------

// The launcher's default --max-batch-prefill-tokens (launcher/src/main.rs
// L2114-2154 @db931fcf; L28-90, L281-358): the card's fp16 TFLOP/s x shards /
// the model's FLOPs per token when the card is in its table, else 4096; at
// most the model's positions and what its rough VRAM estimate allows.
std::int64_t tgi_default_prefill(const TransformerDims& d, std::int64_t max_positions, const GpuSpec& gpu, std::int64_t shards, double mf,
                                 std::int64_t smi_mib) {
    // Cards by nvidia-smi name (L1712-1786): catalog names onto the strings it knows.
    static const std::map<std::string, double> kTflops = {{"H100-80GB", 900}, {"H200-141GB", 989}, {"A100-80GB", 312}, {"A100-40GB", 312},
                                                          {"L4-24GB", 121},   {"L40S-48GB", 363},  {"A10G-24GB", 125}};
    const double H = static_cast<double>(d.hidden), hd = static_cast<double>(d.head_dim), nh = static_cast<double>(d.heads),
                 nkv = static_cast<double>(d.kv_heads), I = static_cast<double>(d.intermediate), L = static_cast<double>(d.layers);
    const double experts = d.experts > 0 ? static_cast<double>(d.experts_per_token) : 1.0;
    const double flop = L * (2 * nh * hd * H + 4 * nkv * hd * H + 4 * nh * hd * H + 6 * H * I * experts);
    std::int64_t p = 4096;
    if (const auto it = kTflops.find(gpu.name); it != kTflops.end()) {
        const double c = std::floor(it->second * 1e12 * static_cast<double>(shards) / flop);
        if (c > 100) p = static_cast<std::int64_t>(c);
    }
    if (max_positions > 0) p = std::min(p, max_positions);
    // The VRAM estimate (L62-90, L310-352, its own approximations kept).
    const double n_exp = d.experts > 0 ? static_cast<double>(d.experts) : 1.0;
    const double avail = static_cast<double>(smi_mib) * 1048576.0 * static_cast<double>(shards) * mf * 0.95;
    const double model = 2.0 * (L * (3 * I * n_exp * H + (nh + 2 * nkv) * hd + nh * hd * H) + 2.0 * static_cast<double>(d.vocab) * H);
    const double token = nkv * 2 * hd * 2 * L + (I + I / 2) * n_exp * 2 * 3;
    if (avail > model) p = std::min(p, static_cast<std::int64_t>((avail - model) / token));
    return std::max<std::int64_t>(1, p);
}

ServingResult tgi_memory(const ModelGraph& g, const EstimateRequest& job, const ServingOptions& o) {
    const TransformerDims& d = *g.transformer;
    refuse_unmodelled_layouts(d, "TGI");
    ServingResult out;
    const Served sv = served_basics(g, job, Engine::TGI, out);
    const std::string version = o.engine_version.value_or("3.3");
    check(version == "3.3" || version == "3.1" || version == "3.0" || version == "2.2", "engine-version",
          "TGI " + version + " is not modelled: gpumem serving knows TGI 3.3 (the default; 3.3.0-3.3.7), 3.1 (3.1.0-3.2.3), 3.0 (3.0.x) and 2.2 (1.4.1-2.2.x)");
    out.engine_version = version;
    check(!o.gpu_memory_utilization && !o.mem_fraction_static, "engine", "--gpu-memory-utilization and --mem-fraction-static are vLLM's and SGLang's; TGI's is --cuda-memory-fraction");
    check(sv.pp == 1, "pp", "TGI shards tensor-parallel only (--num-shard): no pipeline parallelism");
    const std::int64_t shards = sv.tp;
    check(d.kv_heads % shards == 0 || d.kv_heads == 1, "tp",
          "TGI splits the " + std::to_string(d.kv_heads) + " KV heads over the shards without replicating them (flash_causal_lm.py L1284-1296): --num-shard must divide them");
    const bool v3 = version != "2.2";
    const double W = version == "3.3" ? 0.90 : version == "3.1" ? 0.93 : 0.95;  // TGI_WIGGLE_ROOM (server/.../globals.py)
    const double mf = o.cuda_memory_fraction.value_or(1.0);
    check(mf > 0.0 && mf <= 1.0, "cuda-memory-fraction", "--cuda-memory-fraction must be in (0, 1]");
    const Bytes T = sv.capacity;  // torch's total_memory
    const std::int64_t smi = nvidia_smi_mib(sv.gpu, T);
    // Attention backend and block size (globals.py L37-46; launcher resolve_attention L131-199):
    // flashinfer (1 token) on compute capability >= 8.0 with head sizes 64/128/256, else paged (16) or flashdecoding (256).
    const bool modern = sv.gpu.compute_capability >= 80;
    const bool hd_ok = d.head_dim == 64 || d.head_dim == 128 || d.head_dim == 256;
    out.block_size = o.block_size.value_or(!v3 ? 16 : !modern ? 16 : hd_ok ? 1 : 256);
    const bool flashinfer = v3 && modern && hd_ok;
    // Lengths: v3 sizes the warmup by the prefill budget; 2.x defaulted input 4095, total 4096, prefill 4145.
    const std::int64_t mpe = g.max_positions > 0 ? g.max_positions : 4096;
    const std::int64_t P = o.max_num_batched_tokens.value_or(v3 ? tgi_default_prefill(d, g.max_positions, sv.gpu, shards, mf, smi)
                                                                : std::min<std::int64_t>(mpe, 4096) - 1 + 50);
    out.max_num_batched_tokens = P;
    check(P >= 1, "max-num-batched-tokens", "--max-batch-prefill-tokens must be positive");
    Bytes nccl_comm;
    ParallelResult par = served_layout(g, job, sv.prec, shards, 1, mpe, &nccl_comm);
    adjust_served_weights(g, o, sv, par, out, false);
    const Bytes nccl = shards > 1 ? nccl_comm : Bytes(0);
    const Bytes context = job.cuda_context.value_or(sv.gpu.cuda_context);
    const Bytes workspace = flashinfer ? MiB(128) : Bytes(0);  // layers/attention/flashinfer.py L38-43
    const Bytes weights = par.stages.front().weights;
    // One token's K and V on a shard (no replication), one block.
    const Bytes token_kv = kv_token_bytes_per_layer(d, shards, sv.kv_dt) * d.layers;
    const Bytes bb = token_kv * out.block_size;
    // The warmup: one request of P tokens (v3; 2.x: requests of max_input
    // tokens until P) with its blocks, then a prefill whose activations stay
    // cached when free memory is measured (L1507-1563). The activation peak is
    // an estimate: one layer's MLP over P tokens, and before v3 the logits of
    // every prompt token: 8 bytes a logit (fp16 logits, their fp32
    // log-softmax and an fp16 copy; a fit to the 2.x logs, docs/research/tgi.md).
    const std::int64_t max_input = v3 ? P : std::min<std::int64_t>(mpe, 4096) - 1;
    const std::int64_t reqs = (P + max_input - 1) / max_input;
    const std::int64_t B_w = checked_mul(reqs, (std::min(P, max_input) + out.block_size - 1) / out.block_size);
    Bytes act = mlp_working_set(d, shards, sv.model_dt, P);
    if (!v3) act += Bytes(checked_mul(checked_mul(P, (d.vocab + shards - 1) / shards), 8));
    const Bytes used = context + nccl + weights + workspace + act + Bytes(checked_mul(B_w, bb.count()));
    const double F1 = static_cast<double>(T.count()) - static_cast<double>(used.count());
    const double budget = v3 ? F1 - (1.0 - mf * W) * static_cast<double>(T.count()) : W * (F1 - (1.0 - mf) * static_cast<double>(T.count()));
    const std::int64_t blocks = F1 <= 0 ? 0 : static_cast<std::int64_t>(std::floor(std::max(0.0, budget) / static_cast<double>(bb.count()))) + B_w;
    out.kv_cache_blocks = blocks;
    out.kv_cache_tokens = checked_mul(blocks, out.block_size);
    // max_total_tokens: as given, else min(tokens, the model's positions) with
    // prefill chunking (v3 L1566-1579); 2.x: min(positions, 4096).
    out.max_model_len = o.max_total_tokens ? *o.max_total_tokens : o.max_model_len ? *o.max_model_len : v3 ? std::min(out.kv_cache_tokens, mpe) : std::min<std::int64_t>(mpe, 4096);
    out.max_num_seqs = o.max_num_seqs.value_or(0);
    ServingPerGpu r;
    r.weights = weights;
    r.non_torch = nccl + workspace;
    r.activation_peak = act;
    r.kv_cache = Bytes(checked_mul(blocks, bb.count()));
    r.cuda_context = context;
    r.cuda_graph = mlp_working_set(d, shards, sv.model_dt, 32);  // sizes up to 32, captured after the KV cache (estimate)
    r.capacity = T;
    r.requested = Bytes(static_cast<std::int64_t>(mf * W * static_cast<double>(T.count())));
    r.total_device = r.cuda_context + r.non_torch + r.weights + r.kv_cache + r.cuda_graph;
    if (F1 <= 0)
        out.error = "Not enough memory to handle " + std::to_string(P) + " prefill tokens. You need to decrease `--max-batch-prefill-tokens`";
    else if (out.kv_cache_tokens < out.max_model_len)
        out.error = "Not enough memory to handle `max_total_tokens=" + std::to_string(out.max_model_len) + "`";
    r.fits = out.error.empty() && r.total_device <= T;
    out.per_rank = {r};
    out.per_gpu = r;
    out.max_concurrency = out.max_model_len > 0 ? static_cast<double>(out.kv_cache_tokens) / static_cast<double>(out.max_model_len) : 0;
    out.fit_max_model_len = std::min(out.kv_cache_tokens, mpe);
    engine_args::set_request_len(out, o, "the engine's maximum request length", "the engine rejects such requests; raise --max-model-len or shorten --request-len");
    out.concurrency_at_request_len = static_cast<double>(out.kv_cache_tokens) / static_cast<double>(out.request_len);
    if (out.max_num_seqs == 0) out.max_num_seqs = std::max<std::int64_t>(1, static_cast<std::int64_t>(out.concurrency_at_request_len));
    char frac[32];
    std::snprintf(frac, sizeof frac, "%.2f", W);
    out.assumptions.push_back("TGI " + version + ": KV blocks = floor(" + (v3 ? std::string("(F1 - (1 - cuda_memory_fraction x ") + frac + ") x total)" : std::string(frac) + " x (F1 - (1 - cuda_memory_fraction) x total)") +
                              " / block) + the warmup's blocks, F1 = free memory after the warmup prefill (flash_causal_lm.py L1507-1563; docs/research/tgi.md)");
    out.assumptions.push_back("max_batch_prefill_tokens " + std::to_string(P) + (o.max_num_batched_tokens ? "" : " (the launcher's default for this card and model)") +
                              ", block size " + std::to_string(out.block_size) + (flashinfer ? " (flashinfer)" : "") + ", max_total_tokens " + std::to_string(out.max_model_len));
    out.assumptions.push_back(std::string("warmup activation peak (an estimate): one layer's MLP over the prefill") +
                              (v3 ? "" : " and 8 bytes per prompt-token logit (fp16 logits, fp32 log-softmax, an fp16 copy; fitted to public 2.x logs)") +
                              "; CUDA graphs (sizes up to 32) are captured after the KV cache, outside the budget (estimate)");
    return out;
}

// ---- TensorRT-LLM, PyTorch backend (docs/research/trtllm.md; 1.x,
// tensorrt_llm/_torch/pyexecutor/_util.py KvCacheCreator) -----------------

// The transient activation of one max_num_tokens prefill, as NVIDIA's
// aiconfigurator tabulates it (ai-dynamo/aiconfigurator @095f58a51c4c
// backends/base_backend.py _get_memory_usage): 2 x tokens x heads x head_dim
// x c bytes, c = 11, 6.5, 5 for tp 1, 2, >= 4 (MoE: 22, 13, 10); at least 70 MiB.
Bytes trtllm_activation(const TransformerDims& d, std::int64_t tokens, std::int64_t tp) {
    const bool moe = d.experts > 0;
    const double c = tp >= 4 ? (moe ? 10.0 : 5.0) : tp == 2 ? (moe ? 13.0 : 6.5) : (moe ? 22.0 : 11.0);
    const double b = 2.0 * static_cast<double>(tokens) * static_cast<double>(d.heads * d.head_dim) * c;
    return max(Bytes(static_cast<std::int64_t>(b)), MiB(70));
}

ServingResult trtllm_memory(const ModelGraph& g, const EstimateRequest& job, const ServingOptions& o) {
    const TransformerDims& d = *g.transformer;
    refuse_unmodelled_layouts(d, "TensorRT-LLM");
    ServingResult out;
    const Served sv = served_basics(g, job, Engine::TRTLLM, out);
    const std::string version = o.engine_version.value_or("1.2");
    check(version == "1.2" || version == "1.1" || version == "1.3", "engine-version",
          "TensorRT-LLM " + version + " is not modelled: gpumem serving follows the PyTorch backend of TensorRT-LLM 1.1-1.3 (--engine-version 1.2, the default); "
          "TensorRT engines' memory is fixed by their build");
    out.engine_version = version + " (PyTorch backend)";
    check(!o.gpu_memory_utilization && !o.mem_fraction_static && !o.cuda_memory_fraction, "engine",
          "TensorRT-LLM's KV share is --free-gpu-memory-fraction (kv_cache_free_gpu_memory_fraction), of the memory free after profiling");
    const std::int64_t tp = sv.tp, pp = sv.pp;
    const double f = o.free_gpu_memory_fraction.value_or(0.9);
    check(f > 0.0 && f <= 1.0, "free-gpu-memory-fraction", "--free-gpu-memory-fraction must be in (0, 1]");
    out.block_size = o.block_size.value_or(d.latent_kv && sv.gpu.compute_capability == 90 ? 64 : 32);  // FlashMLA forces 64
    out.max_num_seqs = o.max_num_seqs.value_or(2048);
    out.max_num_batched_tokens = o.max_num_batched_tokens.value_or(8192);
    out.max_model_len = o.max_model_len.value_or(g.max_positions > 0 ? g.max_positions : 2048);
    check(out.max_model_len >= 1 && out.max_num_seqs >= 1 && out.max_num_batched_tokens >= 1 && out.block_size >= 1, "max-model-len",
          "max_seq_len, max_batch_size, max_num_tokens and tokens_per_block must be positive");
    Bytes nccl_comm;
    ParallelResult par = served_layout(g, job, sv.prec, tp, pp, out.max_model_len, &nccl_comm);
    adjust_served_weights(g, o, sv, par, out, false);
    const Bytes nccl = tp_buffers(sv.gpu, tp, pp, nccl_comm);
    const Bytes context = job.cuda_context.value_or(sv.gpu.cuda_context);
    const Bytes act = trtllm_activation(d, std::min(out.max_num_batched_tokens, out.max_model_len), tp);
    // Runtime buffers, workspaces and the decode CUDA graphs captured before
    // profiling (34 sizes up to 128): 1.25 GiB, fitted to the two public logs
    // with full settings (docs/research/trtllm.md section 6) - an estimate.
    const Bytes runtime = o.enforce_eager ? GiB(1) : GiB(1) + MiB(256);
    std::vector<ServingPerGpu> ranks;
    std::int64_t tokens = -1;
    std::vector<Bytes> bpts;
    for (std::size_t s = 0; s < par.stages.size(); ++s) {
        ServingPerGpu r;
        r.weights = par.stages[s].weights;
        r.cuda_context = context;
        r.non_torch = nccl;
        r.activation_peak = act;
        r.cuda_graph = runtime;
        r.capacity = sv.capacity;
        const Bytes used = r.cuda_context + r.non_torch + r.weights + r.activation_peak + r.cuda_graph;
        const double base = static_cast<double>(sv.capacity.count()) - static_cast<double>(used.count());
        r.requested = Bytes(static_cast<std::int64_t>(std::max(0.0, base) * f));
        const Bytes bpt = kv_token_bytes_per_layer(d, tp, sv.kv_dt) * par.stages[s].layers;
        bpts.push_back(bpt);
        std::int64_t t = base <= 0 ? 0 : r.requested.count() / bpt.count();
        if (o.max_total_tokens) t = std::min(t, *o.max_total_tokens);
        tokens = tokens < 0 ? t : std::min(tokens, t);  // the minimum over ranks
        ranks.push_back(r);
    }
    const std::int64_t blocks = std::max<std::int64_t>(0, tokens) / out.block_size;  // int(max_tokens // tokens_per_block)
    out.kv_cache_blocks = blocks;
    out.kv_cache_tokens = blocks * out.block_size;
    for (std::size_t s = 0; s < ranks.size(); ++s) {
        ranks[s].kv_cache = bpts[s] * out.kv_cache_tokens;
        ranks[s].total_device = ranks[s].cuda_context + ranks[s].non_torch + ranks[s].weights + ranks[s].cuda_graph + ranks[s].kv_cache;
    }
    // max_seq_len beyond the pool is cut to it ("Adjusted max_seq_len to N").
    if (out.kv_cache_tokens <= 0) out.error = "Impossible to fit in memory: no KV-cache blocks are left after the weights and the profiling run";
    std::size_t worst = 0;
    for (std::size_t s = 0; s < ranks.size(); ++s) {
        ranks[s].fits = out.error.empty() && ranks[s].total_device <= sv.capacity;
        if (ranks[s].total_device > ranks[worst].total_device) worst = s;
    }
    out.per_rank = ranks;
    out.per_gpu = ranks[worst];
    out.max_concurrency = static_cast<double>(out.kv_cache_tokens) / static_cast<double>(out.max_model_len);
    out.fit_max_model_len = std::min(out.kv_cache_tokens, out.max_model_len);
    engine_args::set_request_len(out, o, "the engine's maximum request length", "the engine rejects such requests; raise --max-model-len or shorten --request-len");
    out.concurrency_at_request_len = std::min(static_cast<double>(out.max_num_seqs), static_cast<double>(out.kv_cache_tokens) / static_cast<double>(out.request_len));
    char frac[32];
    std::snprintf(frac, sizeof frac, "%.2f", f);
    out.assumptions.push_back("TensorRT-LLM " + out.engine_version + ": KV = kv_cache_free_gpu_memory_fraction (" + frac +
                              ") x (total - the memory held at the profiling run's peak), in blocks of " + std::to_string(out.block_size) +
                              " tokens (_util.py KvCacheCreator; docs/research/trtllm.md)");
    out.assumptions.push_back("profiling run (an estimate): one prefill of " + std::to_string(std::min(out.max_num_batched_tokens, out.max_model_len)) +
                              " tokens by NVIDIA aiconfigurator's activation table (" + gib(act) + " GiB); runtime buffers, workspaces and decode CUDA graphs " +
                              gib(runtime) + " GiB (fitted to two public logs)");
    return out;
}

}  // namespace

Result<ServingResult> serving_memory(const EstimateRequest& job_in, const ServingOptions& o_in) {
    return capture([&]() -> ServingResult {
        EstimateRequest job = job_in;
        ServingOptions o = o_in;
        apply_engine_command(o.command, o, job);
        if (o.engine == Engine::LlamaCpp) {
            check(!job.model.empty(), "model", "serving: name a model (a .gguf file, or a preset / config.json with --quant), or give llama-server's command line after --");
            return llamacpp_memory(job, o);
        }
        check(!o.n_gpu_layers && !o.ctx_size && !o.ubatch_size && !o.flash_attn && !o.cache_type_k && !o.cache_type_v && !o.tensor_split &&
                  !o.split_mode && !o.no_mmap && !o.no_kv_offload && !o.kv_unified,
              "engine", "--n-gpu-layers, --ctx-size, --ubatch-size, --flash-attn, --cache-type-k/v, --tensor-split, --split-mode, --no-mmap, "
                        "--no-kv-offload and --kv-unified are llama.cpp's (--engine llama.cpp)");
        check(!job.model.empty(), "model", "serving: name a model (preset, config.json or model folder), or give the engine's command line after --");
        check(!o.cpu_offload_gb || o.engine.value_or(Engine::VLLM) == Engine::VLLM, "cpu-offload-gb",
              "--cpu-offload-gb is modelled for vLLM only (--engine vllm)");
        check((!o.data_parallel_size && !o.enable_expert_parallel) || o.engine.value_or(Engine::VLLM) == Engine::VLLM, "data-parallel-size",
              "--data-parallel-size and --enable-expert-parallel are modelled for vLLM only (--engine vllm)");
        const ModelGraph g = take(load_model(job.model));
        check(g.transformer.has_value(), "model", "serving needs a transformer model (its layers, heads and vocabulary)");
        const TransformerDims& d = *g.transformer;
        if (o.engine == Engine::SGLang) return sglang_memory(g, job, o);
        if (o.engine == Engine::TGI) return tgi_memory(g, job, o);
        if (o.engine == Engine::TRTLLM) return trtllm_memory(g, job, o);
        ServingResult out;
        const Served sv = served_basics(g, job, o.engine.value_or(Engine::VLLM), out);
        // V1 (0.19, the default) or the V0 engine (docs/research/vllm_v0.md):
        // 0.6.5 .. 0.10 with VLLM_USE_V1=0 budget u x total - (weights +
        // activation peak + non-torch growth); 0.6.4 also counts the context.
        const std::string ver = o.engine_version.value_or("0.19");
        const bool v0 = ver == "V0" || ver == "v0" || ver == "0.6.4" || ver == "0.6.5" || ver == "0.6.6" || ver.rfind("0.7", 0) == 0 ||
                        ver.rfind("0.8", 0) == 0 || ver.rfind("0.9", 0) == 0 || ver.rfind("0.10", 0) == 0;
        check(v0 || ver == "0.19" || ver == "v1" || ver == "V1", "engine-version",
              "vLLM " + ver + " is not modelled: gpumem serving knows vLLM 0.19 (V1, the default) and the V0 engine of 0.6.4 to 0.10 "
              "(--engine-version 0.6.4, 0.6.5, 0.6.6, 0.7, 0.8, 0.9, 0.10 or V0); before 0.6.4 the budget was measured differently");
        const bool v064 = ver == "0.6.4";
        check(!v0 || d.linear_layers.empty(), "engine-version",
              "vLLM's V0 engine does not serve linear-attention models (Qwen3-Next); use --engine-version 0.19 (V1)");
        out.engine_version = v0 ? ver + " (V0)" : "0.19 (V1)";
        check(!o.mem_fraction_static, "mem-fraction-static", "--mem-fraction-static is SGLang's; vLLM's is --gpu-memory-utilization");
        check(!o.cuda_memory_fraction, "cuda-memory-fraction", "--cuda-memory-fraction is TGI's; vLLM's is --gpu-memory-utilization");
        check(!o.free_gpu_memory_fraction, "free-gpu-memory-fraction", "--free-gpu-memory-fraction is TensorRT-LLM's; vLLM's is --gpu-memory-utilization");
        check(!o.max_total_tokens, "max-total-tokens", "--max-total-tokens is SGLang's; with vLLM use --kv-cache-memory or --gpu-memory-utilization");
        const std::int64_t tp = sv.tp, pp = sv.pp;
        const GpuSpec& gpu = sv.gpu;
        const Bytes capacity = sv.capacity;
        const double u = o.gpu_memory_utilization.value_or(0.9);
        check(u > 0.0 && u <= 1.0, "gpu-memory-utilization", "--gpu-memory-utilization must be in (0, 1] (vLLM's own range)");
        out.gpu_memory_utilization = u;
        // vLLM's batch defaults for `vllm serve` (EngineArgs.get_batch_defaults):
        // 8192 tokens / 1024 sequences on GPUs of at least 70 GiB other than
        // the A100, else 2048 / 256.
        const bool big = !v0 && capacity >= GiB(70) && gpu.name.find("A100") == std::string::npos;
        out.block_size = o.block_size.value_or(16);
        out.max_model_len = o.max_model_len.value_or(g.max_positions > 0 ? g.max_positions : 2048);
        // V0 (config.py SchedulerConfig, arg_utils.py): 256 sequences; chunked
        // prefill only past 32768 tokens (2048 per step, 512 before 0.6.5),
        // else the whole max(max_model_len, 2048) in one step.
        const std::int64_t v0_tokens = out.max_model_len > 32768 ? (v064 ? 512 : 2048) : std::max<std::int64_t>(out.max_model_len, 2048);
        out.max_num_batched_tokens = o.max_num_batched_tokens.value_or(v0 ? v0_tokens : big ? 8192 : 2048);
        out.max_num_seqs = o.max_num_seqs.value_or(big ? 1024 : 256);
        check(out.max_model_len >= 1, "max-model-len", "--max-model-len must be a positive integer");
        check(out.max_num_seqs >= 1, "max-num-seqs", "--max-num-seqs must be a positive integer");
        check(out.max_num_batched_tokens >= 1, "max-num-batched-tokens", "--max-num-batched-tokens must be a positive integer");
        const DType model_dt = sv.model_dt;
        out.assumptions.push_back("vLLM " + out.engine_version + ": budget = gpu_memory_utilization x total - (weights + profile-run peak + non-torch memory" +
                                  (v064 ? " + the CUDA context" : "") + "), the rest is the paged KV cache; CUDA graphs are captured afterwards, outside the budget (" +
                                  (v0 ? "docs/research/vllm_v0.md" : "docs/research/vllm.md") + ")");
        out.assumptions.push_back("max_num_batched_tokens " + std::to_string(out.max_num_batched_tokens) + ", max_num_seqs " + std::to_string(out.max_num_seqs) +
                                  (o.max_num_seqs || o.max_num_batched_tokens ? "" : v0 ? " (V0's defaults)" : big ? " (vLLM's serve defaults on >= 70 GiB GPUs but A100)" : " (vLLM's serve defaults)") +
                                  ", block_size " + std::to_string(out.block_size) + (o.block_size ? "" : " (vLLM's CUDA default)"));

        Bytes nccl_comm;
        const std::int64_t dp = o.data_parallel_size.value_or(1);
        check(dp >= 1, "data-parallel-size", "--data-parallel-size must be a positive integer");
        check(!o.enable_expert_parallel || d.experts > 0, "enable-expert-parallel", "--enable-expert-parallel needs a mixture-of-experts model");
        if (o.enable_expert_parallel)
            check(d.experts % (tp * dp) == 0, "enable-expert-parallel",
                  "--enable-expert-parallel: the " + std::to_string(d.experts) + " experts do not split evenly over tp x dp = " + std::to_string(tp * dp) + " ranks");
        ParallelResult par = served_layout(g, job, sv.prec, tp, pp, out.max_model_len, &nccl_comm, o.enable_expert_parallel ? dp : 1);
        if (dp > 1)
            out.assumptions.push_back("--data-parallel-size " + std::to_string(dp) + ": " + std::to_string(dp) + " engine replicas of tp " + std::to_string(tp) +
                                      (o.enable_expert_parallel ? ", the experts spread over all " + std::to_string(tp * dp) + " ranks" : ", each holding all the weights") +
                                      "; the KV cache figures are one replica's");
        adjust_served_weights(g, o, sv, par, out);
        // --cpu-offload-gb (model_executor/models/utils.py maybe_offload_to_cpu):
        // the decoder layers' parameters, one after another, move to pinned
        // host memory until X GiB per GPU are there (the last one may pass X).
        Bytes offloaded;
        if (o.cpu_offload_gb && *o.cpu_offload_gb > 0) {
            const Bytes x = Bytes(static_cast<std::int64_t>(std::ceil(*o.cpu_offload_gb * 1073741824.0)));
            for (auto& st : par.stages) {
                const Bytes off = std::min(x, st.weights);
                st.weights = st.weights - off;
                offloaded = std::max(offloaded, off);
            }
            out.assumptions.push_back("--cpu-offload-gb " + gib(x) + ": that much of each GPU's weights in pinned host memory (vLLM offloads whole tensors, so "
                                      "up to one more tensor), streamed to the GPU every step");
        }
        const Bytes nccl = tp_buffers(gpu, tp, pp, nccl_comm);
        const bool nvswitch_gen = gpu.arch == "hopper" || gpu.arch == "blackwell";
        if (tp > 1)
            out.assumptions.push_back(nvswitch_gen ? "tensor-parallel buffers outside PyTorch: 1.79 GiB per rank (measured on H100 at tp 2, vLLM PR #10511)"
                                                   : "tensor-parallel buffers outside PyTorch: one NCCL communicator (not measured on this GPU)");

        // The profile run (gpu_model_runner.py profile_run / _dummy_run /
        // _dummy_sampler_run): max_num_batched_tokens tokens through the model
        // with attention skipped, then the sampler on min(max_num_seqs, tokens)
        // rows. Estimate: one layer's MLP working set (the residual and normed
        // hidden states, the gate/up projection and its activation) and the
        // sampler's logits in the model dtype, their fp32 copy and fp32
        // probabilities, held at once.
        const std::int64_t T = out.max_num_batched_tokens, R = std::min(out.max_num_seqs, T);
        Bytes forward_peak = mlp_working_set(d, tp, model_dt, T);
        Bytes sampler_peak = dtype_bytes(model_dt, checked_mul(R, d.vocab)) + dtype_bytes(DType::F32, checked_mul(2 * R, d.vocab));
        if (v0) {
            // V0's profile run (worker/model_runner.py profile_run): the MLP peak
            // holds 4 streams and 3 MLP-wide tensors per token (+1 stream for
            // tp's out-of-place all-reduce); the sampler's top-k/top-p sort holds
            // 39 bytes per logit with the final hidden states; the larger of the
            // two on the driver (a fit to 17 public logs, 2% mean error,
            // docs/research/vllm_v0.md section 5).
            const std::int64_t I = (d.intermediate + tp - 1) / tp;
            forward_peak = dtype_bytes(model_dt, checked_mul(T, 4 * d.hidden + 3 * I + (tp > 1 ? d.hidden : 0)));
            const Bytes sampler = Bytes(checked_mul(checked_mul(R, d.vocab), 39)) + dtype_bytes(model_dt, checked_mul(T, d.hidden));
            sampler_peak = sampler > forward_peak ? sampler - forward_peak : Bytes(0);  // the driver holds max(forward, sampler)
        }
        out.assumptions.push_back("profile-run peak (an estimate): " + std::to_string(T) + " tokens through one layer's MLP (" + gib(forward_peak) +
                                  " GiB) and the sampler on " + std::to_string(R) + " rows of the " + std::to_string(d.vocab) + "-token vocabulary (" +
                                  (v0 ? "V0: the larger of the two, 39 bytes a logit" : gib(sampler_peak) + " GiB: logits, their fp32 copy and fp32 probabilities") + ")");
        const Bytes requested = Bytes(static_cast<std::int64_t>(std::ceil(static_cast<double>(capacity.count()) * u)));

        PagedKvRequest kr;
        kr.tp = tp;
        kr.pp = pp;
        kr.block_size = out.block_size;
        kr.max_model_len = out.max_model_len;
        kr.kv_dtype = sv.kv_dt;
        kr.max_num_batched_tokens = out.max_num_batched_tokens;
        kr.state_dtype = kr.ssm_dtype = model_dt;  // mamba_cache_dtype / mamba_ssm_cache_dtype "auto"
        kr.prefix_caching = o.enable_prefix_caching;
        std::vector<ServingPerGpu> ranks;
        for (std::size_t s = 0; s < par.stages.size(); ++s) {
            ServingPerGpu r;
            r.weights = par.stages[s].weights;
            const bool last = s + 1 == par.stages.size();
            r.activation_peak = forward_peak + (last ? sampler_peak : Bytes(0));
            r.non_torch = nccl;
            r.capacity = capacity;
            r.requested = requested;
            r.cuda_context = job.cuda_context.value_or(gpu.cuda_context);
            const Bytes non_kv = r.weights + r.activation_peak + r.non_torch + (v064 ? r.cuda_context : Bytes(0));
            r.kv_cache = o.kv_cache_memory ? *o.kv_cache_memory : requested > non_kv ? requested - non_kv : Bytes(0);
            kr.available.push_back(r.kv_cache);
            // CUDA graphs (an estimate): the pool holds the largest captured
            // batch's working set (capture sizes up to min(2 x max_num_seqs, 512,
            // max_num_batched_tokens)).
            const std::int64_t cg = std::min<std::int64_t>({2 * out.max_num_seqs, 512, T});
            r.cuda_graph = o.enforce_eager ? Bytes(0) : mlp_working_set(d, tp, model_dt, cg);
            r.total_device = r.cuda_context + (o.kv_cache_memory ? non_kv + r.kv_cache : requested) + r.cuda_graph;
            ranks.push_back(r);
        }
        if (o.kv_cache_memory) out.assumptions.push_back("--kv-cache-memory " + gib(*o.kv_cache_memory) + " GiB: the KV budget as given (gpu_memory_utilization ignored)");
        if (v0 || offloaded > Bytes(0)) {
            // V0's CPU swap space: --swap-space 4 GiB of pinned host memory per worker (cache_engine.py).
            ServingHost h;
            if (v0) h.kv_cache = GiB(4) * (tp * pp);
            h.model = offloaded * (tp * pp);
            h.total = h.kv_cache + h.model;
            out.host = h;
            if (v0) out.assumptions.push_back("host RAM: V0's swap space, 4 GiB pinned per worker (--swap-space default)");
        } else {
            out.assumptions.push_back("host RAM: vLLM V1 keeps no KV cache on the CPU (preempted requests are recomputed); the processes' own memory is not counted");
            ServingHost h;
            out.host = h;
        }
        if (o.enforce_eager) out.assumptions.push_back("--enforce-eager: no CUDA graphs");
        else out.assumptions.push_back("CUDA graphs (an estimate): the largest captured batch's MLP working set");
        TransformerDims dk = d;
        if (v0) dk.sliding_window = dk.attention_chunk = 0;  // V0 pages every layer in full (no hybrid grouping)
        const PagedKvResult kv = take(paged_kv_cache(dk, kr));
        if (kv.block_size != out.block_size) {
            out.assumptions.push_back("linear-attention layers: one state of " + std::to_string(kv.state_page.count()) + " B per layer and request (" +
                                      (o.enable_prefix_caching ? "two with prefix caching" : "prefix caching off, vLLM's default for such models") +
                                      "); attention blocks raised to " + std::to_string(kv.block_size) + " tokens so that one page holds it (vLLM's log: "
                                      "\"Setting attention block size to " + std::to_string(kv.block_size) + " tokens\")");
            out.block_size = kv.block_size;
        }
        out.kv_cache_blocks = kv.num_blocks;
        out.kv_cache_tokens = kv.kv_cache_tokens;
        out.fit_max_model_len = g.max_positions > 0 ? std::min(kv.kv_cache_tokens, g.max_positions) : kv.kv_cache_tokens;
        out.max_concurrency = v0 ? static_cast<double>(kv.kv_cache_tokens) / static_cast<double>(out.max_model_len) : kv.max_concurrency;  // V0: blocks x 16 / L
        engine_args::set_request_len(out, o, "the engine's maximum request length", "the engine rejects such requests; raise --max-model-len or shorten --request-len");
        // Requests of another length: the count vLLM logs for max_model_len
        // (blocks / the blocks one request holds in every group), at request_len.
        if (out.request_len == out.max_model_len || v0) {
            out.concurrency_at_request_len = v0 ? static_cast<double>(kv.num_blocks) / static_cast<double>((out.request_len + out.block_size - 1) / out.block_size)
                                                : kv.max_concurrency;
        } else {
            PagedKvRequest at = kr;
            at.max_model_len = out.request_len;
            out.concurrency_at_request_len = take(paged_kv_cache(dk, at)).max_concurrency;
        }
        // The most constrained rank (fewest blocks) is the answer.
        std::size_t worst = 0;
        for (std::size_t s = 0; s < kv.stages.size(); ++s)
            if (kv.stages[s].blocks < kv.stages[worst].blocks) worst = s;
        // Start-up checks, in vLLM's order, with its messages.
        const Bytes free_at_start = capacity > ranks[worst].cuda_context ? capacity - ranks[worst].cuda_context : Bytes(0);
        if (!o.kv_cache_memory && free_at_start < requested)
            out.error = "Free memory on device (" + gib(free_at_start) + "/" + gib(capacity) + " GiB) on startup is less than desired GPU memory utilization (" +
                        std::to_string(u).substr(0, 4) + ", " + gib(requested) + " GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.";
        else if (ranks[worst].kv_cache <= Bytes(0))
            out.error = "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.";
        else if (v0 && kv.kv_cache_tokens < out.max_model_len)
            out.error = "The model's max seq len (" + std::to_string(out.max_model_len) + ") is larger than the maximum number of tokens that can be stored in KV cache (" +
                        std::to_string(kv.kv_cache_tokens) + "). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.";
        else if (!v0 && !kv.fits_one_request)
            out.error = "To serve at least one request with the model's max seq len (" + std::to_string(out.max_model_len) + "), (" + gib(kv.needed_per_request) +
                        " GiB KV cache is needed, which is larger than the available KV cache memory (" + gib(ranks[worst].kv_cache) +
                        " GiB). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.";
        for (auto& r : ranks) r.fits = out.error.empty() && r.total_device <= capacity;
        out.per_rank = ranks;
        out.per_gpu = ranks[worst];
        return out;
    });
}

}  // namespace gpumem
