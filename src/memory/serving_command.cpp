// The engines' own command lines (`gpumem serving -- <command>`): each
// engine's flag names and defaults onto gpumem's serving options
// (gpumem/memory/serving.hpp apply_engine_command).
#include "gpumem/memory/serving.hpp"

#include <algorithm>

#include "engine_args.hpp"
#include "gpumem/memory/gpu_catalog.hpp"
#include "gpumem/memory/llamacpp.hpp"
#include "gpumem/memory/parallel.hpp"
#include "serving_internal.hpp"

namespace gpumem {

namespace {

using engine_args::check;
using engine_args::to_number;

// `--dtype`: both engines take auto, bfloat16, float16/half, float32/float.
void apply_model_dtype(const std::string& engine, const std::string& v, EstimateRequest& job) {
    if (v == "bfloat16") job.precision = Precision::BF16;
    else if (v == "float16" || v == "half") job.precision = Precision::FP16;
    else if (v == "float32" || v == "float") job.precision = Precision::FP32;
    else check(v == "auto", "precision", engine + " --dtype " + v + " is not modelled (auto, bfloat16, float16, float32)");
}


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
            o.mem_fraction_static = to_number("sglang", a, "mem-fraction-static", f.value());
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
            o.cuda_memory_fraction = to_number("tgi", a, "cuda-memory-fraction", f.value());
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
            o.free_gpu_memory_fraction = to_number("trtllm-serve", a, "free-gpu-memory-fraction", f.value());
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
            o.gpu_memory_utilization = to_number("vllm", a, "gpu-memory-utilization", f.value());
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
            const double gb = to_number("vllm", a, "cpu-offload-gb", f.value());
            check(gb >= 0 && gb < 1e6, "cpu-offload-gb", "vllm --cpu-offload-gb takes GiB as a number >= 0");
            o.cpu_offload_gb = gb;
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

}  // namespace gpumem
