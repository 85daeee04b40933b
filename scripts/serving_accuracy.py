#!/usr/bin/env python3
"""gpumem serving against public engine start-up logs, per engine.

Runs `gpumem serving ... --format json` for every log in
tests/fixtures/groundtruth/{vllm,sglang,tgi}_startup_logs.json and llamacpp_logs.json
whose settings gpumem can express, and compares what the engine printed:
vLLM's "Model loading took" (weights), "Available KV cache memory" (KV pool),
"GPU KV cache size" (tokens) and "Maximum concurrency"; SGLang's weights and
"#tokens"; TGI's "max batch total tokens"; llama.cpp's model, KV and compute buffer sizes. Logs it cannot
score are listed with the reason.

Usage: python3 scripts/serving_accuracy.py [--gpumem build/gpumem] [--rows] [--json] [--check-aims]
  --rows        print every scored row with its command
  --check-aims  exit 1 unless issue 13's aims hold: weights within 1% beyond the log's 0.01 GiB rounding (vLLM's "Model loading took";
                SGLang's figure is a free-memory difference that includes more than the weights; rows in CAUSES excepted),
                KV pool within 3% median (vLLM), llama.cpp model and KV buffers within 2%.
The README's serving table is this script's summary (scripts/update-readme.py).
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "tests", "fixtures", "groundtruth")
GIB = 1024 ** 3
MIB = 1024 ** 2


def run(gpumem, args):
    p = subprocess.run([gpumem, *args, "--format", "json"], capture_output=True, text=True, cwd=ROOT)
    if p.returncode != 0:
        msg = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}"
        if "unknown model" in msg:
            return None, "no built-in preset for the model"
        return None, msg
    return json.loads(p.stdout), None


def gpu_flags(gpu, gib):
    """The catalog card a log's GPU names, with the total the log prints when it prints one."""
    g = gpu.lower()
    name = ("H100-80GB" if "h100" in g else "H200-141GB" if "h200" in g else "A100-40GB" if "a100" in g and "40" in g
            else "A100-80GB" if "a100" in g else "L4-24GB" if " l4" in g else "RTX-3090" if "3090" in g else "RTX-4090" if "4090" in g
            else "L40S-48GB" if "l40" in g else "A10G-24GB" if "a10" in g else None)
    if name is None and gib is None:
        return None
    flags = ["--gpu", name or "RTX-4090"]
    if gib is not None:
        flags += ["--gpu-memory", f"{gib}GiB"]
    return flags


def pct(got, want):
    return 100.0 * (got - want) / want


def vllm_rows(gpumem):
    fx = json.load(open(os.path.join(FIX, "vllm_startup_logs.json")))
    scored, skipped = [], []
    for r in fx["rows"]:
        rid = r["id"]
        if r["engine"] != "V1":
            continue  # scored by vllm_v0_rows
        if r["quantization"] and r["quantization"] != "fp8":
            skipped.append((rid, "quantized checkpoint whose config.json is not a preset here"))
            continue
        if "low-confidence" in (r.get("notes") or ""):
            skipped.append((rid, "settings not fully known (the fixture's own note)"))
            continue
        gib = r["gpu_memory_gib"] if "log:" in (r["gpu"] or "") else None
        gf = gpu_flags(r["gpu"] or "", gib)
        if gf is None or r["gpu_memory_utilization"] is None:
            skipped.append((rid, "GPU or gpu_memory_utilization not stated"))
            continue
        args = ["serving", r["model"], *gf, "--tp", str(r["tensor_parallel_size"]), "--pp", str(r["pipeline_parallel_size"]),
                "--gpu-memory-utilization", str(r["gpu_memory_utilization"]), "--max-model-len", str(r["max_model_len"])]
        if r.get("max_num_seqs"):
            args += ["--max-num-seqs", str(r["max_num_seqs"])]
        if r.get("max_num_batched_tokens"):
            args += ["--max-num-batched-tokens", str(r["max_num_batched_tokens"])]
        if r.get("kv_cache_dtype") == "fp8":
            args += ["--kv-dtype", "fp8"]
        if r.get("enforce_eager"):
            args += ["--enforce-eager"]
        if r["quantization"] == "fp8":
            args += ["--quant", "fp8"]  # vllm serve --quantization fp8 (online)
        out, err = run(gpumem, args)
        if out is None:
            skipped.append((rid, err))
            continue
        row = {"engine": "vllm", "id": rid, "command": "gpumem " + shlex.join(args), "errors": {}}
        if r.get("model_loading_gib"):
            row["errors"]["weights"] = pct(out["per_gpu"]["weights"] / GIB, r["model_loading_gib"])
            row["weights_abs_gib"] = abs(out["per_gpu"]["weights"] / GIB - r["model_loading_gib"])
        if r.get("available_kv_cache_gib"):
            row["errors"]["kv_pool"] = pct(out["per_gpu"]["kv_cache"] / GIB, r["available_kv_cache_gib"])
        if r.get("kv_cache_tokens"):
            row["errors"]["kv_tokens"] = pct(out["kv_cache_tokens"], r["kv_cache_tokens"])
        if r.get("max_concurrency"):
            row["errors"]["concurrency"] = pct(out["max_concurrency"], r["max_concurrency"])
        scored.append(row)
    return scored, skipped


# vLLM V0-engine logs with a preset for their model and their settings known: the
# preset, the version whose budget applies, and the flags (card, lengths) they ran with.
V0 = {
    "vllm10517-rtx3090-llama31-8b-20k": ("llama-3.1-8b", "0.6.4", ["--gpu", "RTX-3090", "--gpu-memory", "23.58GiB", "--max-model-len", "20000"]),
    "vllm10517-rtx3090-llama31-8b-29k": ("llama-3.1-8b", "0.6.4", ["--gpu", "RTX-3090", "--gpu-memory", "23.58GiB", "--max-model-len", "29000"]),
    "cn-notes-rtx3090-qwen25-7b-v066": ("qwen2.5-7b-instruct", "0.6.6", ["--gpu", "RTX-3090", "--gpu-memory", "23.57GiB", "--max-model-len", "8192", "--max-num-seqs", "16"]),
    "oci-a10-llama31-8b-131k": ("llama-3.1-8b", "0.7", ["--gpu", "A10G-24GB", "--gpu-memory", "22.07GiB", "--max-model-len", "131072"]),
    "vllm10511-h100-llama3-8b-tp1": ("llama-3-8b", "0.6.5", ["--gpu", "H100-80GB", "--gpu-memory", "79.22GiB", "--max-model-len", "8192"]),
    "vllm10511-h100-llama3-8b-tp2": ("llama-3-8b", "0.6.5", ["--gpu", "H100-80GB", "--gpu-memory", "79.22GiB", "--max-model-len", "8192", "--tp", "2"]),
    "h200-tinyllama-rho-1b-v064": ("tinyllama-1.1b", "0.6.4", ["--gpu", "H200-141GB", "--gpu-memory", "139.8GiB", "--max-model-len", "2048"]),
    "rtx8gb-phi-1_5-v064": ("phi-1.5", "0.6.4", ["--gpu", "RTX-4090", "--gpu-memory", "7.92GiB", "--max-model-len", "2048", "--precision", "fp16"]),
    "rtx8gb-opt-125m-v064": ("opt-125m", "0.6.4", ["--gpu", "RTX-4090", "--gpu-memory", "7.92GiB", "--max-model-len", "2048", "--precision", "fp16"]),
    "kr-rtx2060-qwen3-4b-v08x": ("qwen3-4b", "0.8", ["--gpu", "RTX-4090", "--gpu-memory", "12GiB", "--max-model-len", "10000", "--max-num-seqs", "1",
                                                      "--gpu-memory-utilization", "0.95", "--precision", "fp16"]),
}


def vllm_v0_rows(gpumem):
    rows = {r["id"]: r for r in json.load(open(os.path.join(FIX, "vllm_startup_logs.json")))["rows"] if r["engine"] == "V0"}
    rows.update({r["id"]: r for r in json.load(open(os.path.join(FIX, "vllm_v0_logs.json")))["rows"]})
    scored, skipped = [], []
    for rid, r in rows.items():
        if rid not in V0:
            skipped.append((rid, "V0: no preset for the model, a quantized checkpoint, or settings not shown"))
            continue
        preset, version, flags = V0[rid]
        args = ["serving", preset, "--engine-version", version, *flags]
        if "--gpu-memory-utilization" not in flags:
            args += ["--gpu-memory-utilization", str(r["gpu_memory_utilization"])]
        out, err = run(gpumem, args)
        if out is None:
            skipped.append((rid, err))
            continue
        kv = r.get("kv_cache_gib", r.get("available_kv_cache_gib"))
        row = {"engine": "vllm V0", "id": rid, "command": "gpumem " + shlex.join(args), "errors": {"kv_pool": pct(out["per_gpu"]["kv_cache"] / GIB, kv)}}
        w = r.get("weights_gib", r.get("model_loading_gib"))
        if w:
            row["errors"]["weights"] = pct(out["per_gpu"]["weights"] / GIB, w)
            row["weights_abs_gib"] = abs(out["per_gpu"]["weights"] / GIB - w)
        scored.append(row)
    return scored, skipped


# Quantized checkpoints (tests/fixtures/groundtruth/vllm_quant_logs.json) whose
# config.json is a preset: "Model loading took" only (their budgets are not all known).
QUANT = {
    "gb10-qwen3-30b-a3b-fp8-v0130nv": ("qwen3-30b-a3b-fp8", ["--gpu", "H100-80GB"]),  # GB10 (SM121): no DeepGEMM, the Hopper scale layout
    "rtx5090-qwen3-30b-a3b-fp8-uvm-v0110rc2": ("qwen3-30b-a3b-fp8", ["--gpu", "H100-80GB"]),  # SM120 likewise
    "vllm33155-h100-gptoss120b-v0141": ("gpt-oss-120b", ["--gpu", "H100-80GB"]),  # Triton's Hopper MXFP4 layout
    "a100-40gb-gptoss20b": ("gpt-oss-20b", ["--gpu", "A100-40GB"]),  # Marlin
    "gptoss20b-shapes-137153": ("gpt-oss-20b", ["--gpu", "B200-180GB"]),  # the log's printed shapes: Blackwell's padding
}


def vllm_quant_rows(gpumem):
    fx = json.load(open(os.path.join(FIX, "vllm_quant_logs.json")))
    scored, skipped = [], []
    for r in fx["rows"]:
        rid = r["id"]
        if rid not in QUANT or not r.get("model_loading_gib"):
            skipped.append((rid, "quantized checkpoint whose config.json is not a preset here"))
            continue
        preset, flags = QUANT[rid]
        args = ["serving", preset, *flags, "--max-model-len", "4096"]
        out, err = run(gpumem, args)
        if out is None:
            skipped.append((rid, err))
            continue
        w = r["model_loading_gib"]
        scored.append({"engine": "vllm", "id": rid, "command": "gpumem " + shlex.join(args), "errors": {"weights": pct(out["per_gpu"]["weights"] / GIB, w)},
                       "weights_abs_gib": abs(out["per_gpu"]["weights"] / GIB - w)})
    return scored, skipped


def vllm_hybrid_rows(gpumem):
    """The v0.19 logs of models with sliding-window, chunked, MLA or Mamba layers
    (tests/fixtures/groundtruth/vllm_hybrid_logs.json) that are not in the main file."""
    main = {r["id"] for r in json.load(open(os.path.join(FIX, "vllm_startup_logs.json")))["rows"]}
    fx = json.load(open(os.path.join(FIX, "vllm_hybrid_logs.json")))
    scored, skipped = [], []
    for r in fx["rows"]:
        rid = r["id"]
        if rid in main:
            continue
        st = r.get("settings") or {}
        gib = None
        if "log:" in (r.get("gpu") or ""):
            gib = float(r["gpu"].split("log:")[1].split("GiB")[0])
        gf = gpu_flags(r.get("gpu") or "", gib)
        if gf is None or st.get("quantization") or st.get("gpu_memory_utilization") is None:
            skipped.append((rid, "GPU, utilization or quantization not expressible"))
            continue
        args = ["serving", r["model"], *gf, "--tp", str(r.get("tp", 1)), "--gpu-memory-utilization", str(st["gpu_memory_utilization"]),
                "--max-model-len", str(st["max_model_len"]), "--max-num-batched-tokens", str(st["max_num_batched_tokens"])]
        if st.get("max_num_seqs"):
            args += ["--max-num-seqs", str(st["max_num_seqs"])]
        out, err = run(gpumem, args)
        if out is None:
            skipped.append((rid, err))
            continue
        row = {"engine": "vllm", "id": rid, "command": "gpumem " + shlex.join(args), "errors": {}}
        for q in r.get("quotes", []):
            if q.startswith("Model loading took"):
                row["errors"]["weights"] = pct(out["per_gpu"]["weights"] / GIB, float(q.split("took")[1].split("GiB")[0]))
        row["errors"]["kv_pool"] = pct(out["per_gpu"]["kv_cache"] / GIB, r["available_kv_gib"])
        row["errors"]["kv_tokens"] = pct(out["kv_cache_tokens"], r["kv_tokens"])
        row["errors"]["concurrency"] = pct(out["max_concurrency"], r["max_concurrency"])
        scored.append(row)
    return scored, skipped


def sglang_rows(gpumem):
    fx = json.load(open(os.path.join(FIX, "sglang_startup_logs.json")))
    scored, skipped = [], []
    for r in fx["logs"]:
        rid = r["id"]
        if r.get("quantization"):
            skipped.append((rid, "quantized checkpoint whose config.json is not a preset here"))
            continue
        gf = gpu_flags(r["gpu"] or "", r.get("gpu_memory_gib"))
        shared = any(w in (r["gpu"] or "").lower() for w in ("unknown", "wsl", "windows", "class", "likely"))
        if gf is None or shared:
            skipped.append((rid, "the GPU's free memory at start is not the card's (shared, WSL/Windows or unnamed GPU)"))
            continue
        args = ["serving", r["model"], "--engine", "sglang", *gf, "--tp", str(r["tp"])]
        if r.get("mem_fraction_static") is not None:
            args += ["--mem-fraction-static", str(r["mem_fraction_static"])]
        if r.get("context_length"):
            args += ["--max-model-len", str(r["context_length"])]
        ver = str(r.get("sglang_version") or "")
        if "0.4" in ver:
            args += ["--engine-version", "0.4.6"]
        out, err = run(gpumem, args)
        if out is None:
            skipped.append((rid, err))
            continue
        row = {"engine": "sglang", "id": rid, "command": "gpumem " + shlex.join(args), "errors": {}}
        if r.get("weights_gib"):
            row["errors"]["weights"] = pct(out["per_gpu"]["weights"] / GIB, r["weights_gib"])
        if r.get("kv_tokens"):
            row["errors"]["kv_tokens"] = pct(out["kv_cache_tokens"], r["kv_tokens"])
        scored.append(row)
    return scored, skipped


# llama.cpp logs: the preset of the logged model and the era of the build that printed them.
LLAMACPP = {
    "ci-pythia-2.8b-f16": ("pythia-2.8b", "2025-06"), "ci-pythia-2.8b-q2_k": ("pythia-2.8b", "2025-06"),
    "ci-pythia-2.8b-q3_k": ("pythia-2.8b", "2025-06"), "ci-pythia-2.8b-q4_0": ("pythia-2.8b", "2025-06"),
    "ci-pythia-2.8b-q4_k": ("pythia-2.8b", "2025-06"), "ci-pythia-2.8b-q5_k": ("pythia-2.8b", "2025-06"),
    "ci-pythia-2.8b-q6_k": ("pythia-2.8b", "2025-06"), "ci-pythia-2.8b-q8_0": ("pythia-2.8b", "2025-06"),
    "ollama-r1-distill-llama8b-q4km": ("llama-3.1-8b", "2025-06"), "mistral7b-v01-q4km-ngl20": ("mistral-7b-v0.1", "2025-06"),
    "phi3-mini-q4km-ub256": ("phi-3-mini", "2025-06"), "llama32-3b-q4km": ("llama-3.2-3b", "2026-04"),
    "metal-llama3-8b-np1": ("llama-3-8b", "2026-04"), "metal-llama3-8b-np4": ("llama-3-8b", "2026-04"),
    "metal-llama3-8b-q8kv": ("llama-3-8b", "2026-04"), "cpu-llama31-8b-q3kl-131k": ("llama-3.1-8b", "2025-06"),
    "graviton3-dolphin-llama31-8b-q4_0": ("llama-3.1-8b", "2025-06"), "ollama-gb10-llama31-8b-q4_0": ("llama-3.1-8b", "2026-04"),
    "qwen3-4b-q4km": ("qwen3-4b", "2026-04"), "jina-v4-qwen25vl3b-q8_0-ub4096": ("qwen2.5-3b-instruct", "2025-06"),
}


def llamacpp_rows(gpumem):
    fx = json.load(open(os.path.join(FIX, "llamacpp_logs.json")))
    scored, skipped = [], []
    for r in fx["logs"]:
        rid = r["id"]
        if rid not in LLAMACPP:
            skipped.append((rid, "no built-in preset for the model"))
            continue
        preset, era = LLAMACPP[rid]
        args = ["serving", preset, "--engine", "llama.cpp", "--engine-version", era, "--quant", r["ftype"], "--gpu", "RTX-4090",
                "--gpu-memory", "1024GiB", "--ctx-size", str(r["n_ctx"]), "--cache-type-k", r["type_k"], "--cache-type-v", r["type_v"]]
        if isinstance(r.get("ngl"), int):
            args += ["--n-gpu-layers", str(r["ngl"])]
        for key, flag in (("n_batch", "--max-num-batched-tokens"), ("n_ubatch", "--ubatch-size"), ("n_parallel", "--max-num-seqs")):
            if isinstance(r.get(key), int):
                args += [flag, str(r[key])]
        if isinstance(r.get("flash_attn"), bool):
            args += ["--flash-attn", "on" if r["flash_attn"] else "off"]
        out, err = run(gpumem, args)
        if out is None:
            skipped.append((rid, err))
            continue
        dev = out["per_rank"][0]
        host = out["host"]
        row = {"engine": "llama.cpp", "id": rid, "command": "gpumem " + shlex.join(args), "errors": {}}
        mb, kv, cb = r.get("model_buffer_mib") or {}, r.get("kv_buffer_mib") or {}, r.get("compute_buffer_mib") or {}
        model = []
        for k, v in mb.items():
            got = dev["weights"] if k in ("CUDA0", "MTL0") else host["model_mapped"]
            model.append(pct(got / MIB, v))
        if model:
            row["errors"]["model_buffer"] = max(model, key=abs)
        kvs = []
        for k, v in kv.items():
            got = host["kv_cache"] if k == "CPU" else dev["kv_cache"] + host["kv_cache"] if k == "total" else dev["kv_cache"]
            if k in ("CUDA0", "MTL0", "CPU", "total"):
                kvs.append(pct(got / MIB, v))
        if kvs:
            row["errors"]["kv_buffer"] = max(kvs, key=abs)
        if era == "2025-06":  # the compute fit describes these builds' reserve graph
            cs = []
            for k, v in cb.items():
                got = dev["activation_peak"] if k in ("CUDA0",) else host["compute"] if k in ("CUDA_Host", "CPU") else None
                if got is not None:
                    cs.append(pct(got / MIB, v))
            if cs:
                row["errors"]["compute_buffer"] = max(cs, key=abs)
        scored.append(row)
    return scored, skipped


# TGI logs whose model has a preset, the version family whose rules the build follows, and its flags.
TGI = {
    "G03": ("llama-3.1-8b", "2.2", ["--gpu", "A10G-24GB"]),
    "G09": ("mistral-7b-v0.1", "2.2", ["--gpu", "A100-80GB", "--max-num-batched-tokens", "32768", "--max-total-tokens", "8512"]),
}


def tgi_rows(gpumem):
    fx = json.load(open(os.path.join(FIX, "tgi_startup_logs.json")))
    scored, skipped = [], []
    for r in fx["logs"]:
        rid = r["id"]
        if rid not in TGI:
            skipped.append((rid, "TGI before 1.4.1, a model without a preset, or settings not fully known"))
            continue
        preset, version, flags = TGI[rid]
        args = ["serving", preset, "--engine", "tgi", "--engine-version", version, *flags]
        out, err = run(gpumem, args)
        if out is None:
            skipped.append((rid, err))
            continue
        scored.append({"engine": "tgi", "id": rid, "command": "gpumem " + shlex.join(args),
                       "errors": {"kv_tokens": pct(out["kv_cache_tokens"], r["max_batch_total_tokens"])}})
    return scored, skipped


# TensorRT-LLM (PyTorch backend) logs with a preset and full settings. Its
# runtime-buffer term was fitted to these logs, so they check the formula's
# composition, not an independent prediction.
TRTLLM = {
    "smollm2-135m-4070super-f0.9": ("smollm2-135m", ["--gpu", "RTX-4090", "--gpu-memory", "11.99GiB", "--free-gpu-memory-fraction", "0.9", "--max-model-len", "2048"]),
    "smollm2-135m-4070super-f0.25": ("smollm2-135m", ["--gpu", "RTX-4090", "--gpu-memory", "11.99GiB", "--free-gpu-memory-fraction", "0.25", "--max-model-len", "2048"]),
    "tinyllama-tp2-dynamo-disagg": ("tinyllama-1.1b", ["--gpu", "H100-80GB", "--tp", "2", "--free-gpu-memory-fraction", "0.25", "--max-model-len", "2048"]),
}


def trtllm_rows(gpumem):
    fx = json.load(open(os.path.join(FIX, "trtllm_startup_logs.json")))
    scored, skipped = [], []
    for r in fx["logs"]:
        rid = r["id"]
        if rid not in TRTLLM:
            skipped.append((rid, "TensorRT-LLM: a TensorRT engine, a model without a preset, or settings not fully known"))
            continue
        preset, flags = TRTLLM[rid]
        args = ["serving", preset, "--engine", "trtllm", *flags]
        out, err = run(gpumem, args)
        if out is None:
            skipped.append((rid, err))
            continue
        scored.append({"engine": "trtllm", "id": rid, "command": "gpumem " + shlex.join(args), "errors": {"kv_tokens": pct(out["kv_cache_tokens"], r["kv_tokens"])}})
    return scored, skipped


# Rows beyond an aim, with the evidenced cause (as framework_measured.json's error_cause).
CAUSES = {
    "llmd-h100-gemma3-4b-tp1": "weights: vLLM's Gemma 3 (a VLM) loads about 0.4 GiB beyond its parameters and RoPE caches, "
                               "not itemised here (the 27B logs 0.3 GiB more, -0.6%); its vision encoder's profiling is not modelled either",
    "llmd-h100-gptoss-20b-tp2": "weights: Triton's Hopper MXFP4 layout at tp 2 pads more than modelled (vLLM 0.19); "
                                "the tp-1 gpt-oss-120b H100 log (0.14.1) is within 0.4%",
}

QUANTITIES = [("weights", "weights"), ("kv_pool", "KV pool"), ("kv_tokens", "KV-cache tokens"), ("concurrency", "max concurrency"),
              ("model_buffer", "model buffers"), ("kv_buffer", "KV buffers"), ("compute_buffer", "compute buffers (estimate)")]


def summary(rows):
    out = []
    for engine in ("vllm", "vllm V0", "sglang", "tgi", "trtllm", "llama.cpp"):
        er = [r for r in rows if r["engine"] == engine]
        for key, label in QUANTITIES:
            xs = [abs(r["errors"][key]) for r in er if key in r["errors"]]
            if xs:
                worst = max((r for r in er if key in r["errors"]), key=lambda r: abs(r["errors"][key]))
                # Beyond the log's own rounding (GiB printed to 0.01): what the weights aim is judged on.
                beyond = [abs(r["errors"][key]) for r in er
                          if key in r["errors"] and r.get("weights_abs_gib", 1.0) > 0.005 and r["id"] not in CAUSES]
                out.append({"engine": engine, "quantity": label, "key": key, "n": len(xs), "median": statistics.median(xs),
                            "worst": abs(worst["errors"][key]), "worst_id": worst["id"], "worst_beyond_rounding": max(beyond, default=0.0)})
    return out


def table(s, skipped):
    lines = ["| engine | quantity | logs | median error | worst (log) |", "|---|---|---|---|---|"]
    for x in s:
        lines.append(f"| {x['engine']} | {x['quantity']} | {x['n']} | {x['median']:.2f}% | {x['worst']:.2f}% ({x['worst_id']}) |")
    lines.append("")
    for rid, why in CAUSES.items():
        lines.append(f"Beyond the aims with a named cause: {rid}: {why}.")
    lines.append("")
    by = {}
    for e, why in skipped:
        by.setdefault(why, []).append(e)
    lines.append(f"Not scored ({len(skipped)} logs): " + "; ".join(f"{why}: {len(ids)}" for why, ids in sorted(by.items())) + ".")
    return "\n".join(lines) + "\n"


def aims(s):
    bad = []
    for x in s:
        if x["engine"] == "vllm" and x["key"] == "weights" and x["worst_beyond_rounding"] > 1.0:
            bad.append(f"{x['engine']} weights worst {x['worst_beyond_rounding']:.2f}% > 1% (beyond the log's 0.01 GiB rounding)")
        if x["engine"] == "vllm" and x["key"] == "kv_pool" and x["median"] > 3.0:
            bad.append(f"vLLM KV pool median {x['median']:.2f}% > 3%")
        if x["engine"] == "llama.cpp" and x["key"] in ("model_buffer", "kv_buffer") and x["worst"] > 2.0:
            bad.append(f"llama.cpp {x['quantity']} worst {x['worst']:.2f}% > 2%")
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpumem", default=os.path.join(ROOT, "build", "gpumem"))
    ap.add_argument("--rows", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--check-aims", action="store_true")
    a = ap.parse_args()
    rows, skipped = [], []
    for f in (vllm_rows, vllm_hybrid_rows, vllm_quant_rows, vllm_v0_rows, sglang_rows, tgi_rows, trtllm_rows, llamacpp_rows):
        r, s = f(a.gpumem)
        rows += r
        skipped += [(f"{f.__name__[:-5].replace('_hybrid', '').replace('_v0', '').replace('_quant', '')}:{i}", why) for i, why in s]
    s = summary(rows)
    if a.json:
        print(json.dumps({"rows": rows, "skipped": skipped, "summary": s}, indent=1))
        return
    print(table(s, skipped), end="")
    if a.rows:
        for r in rows:
            print(f"{r['engine']:9s} {r['id']:40s} " + " ".join(f"{k} {v:+.2f}%" for k, v in r["errors"].items()) + f"\n    {r['command']}")
        for i, why in skipped:
            print(f"skipped {i}: {why}")
    if a.check_aims:
        bad = aims(s)
        for b in bad:
            print("aim missed:", b)
        sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
