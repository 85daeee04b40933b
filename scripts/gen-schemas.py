#!/usr/bin/env python3
"""JSON Schemas of gpumem's answers (docs/schema/<command>.schema.json).

Writes each command's schema from its real outputs over a set of sample jobs
(the keys every sample has are required; types merged; new keys allowed, so
adding a field keeps schema_version). --check validates fresh outputs of the
same samples against the committed schemas (a ctest test): a removed or
retyped field fails until the schema (and, if incompatible, kSchemaVersion
in include/gpumem/api/api.hpp) is updated on purpose.

Usage: python3 scripts/gen-schemas.py [--gpumem build/gpumem] [--check]
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIR = os.path.join(ROOT, "docs/schema")
OOM = ("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity; 75.20 GiB already allocated; "
       "1.50 GiB free; 76.80 GiB reserved in total by PyTorch)")
SAMPLES = {
    "estimate": ["estimate gpt2 --seq 1024", "estimate llama-3-8b --mode infer --batch 8 --seq 2048 --gen-len 256 --analytic",
                 "estimate mixtral-8x7b --gpus 64 --nodes 8 --pp 4 --ep 8 --seq 8192 --precision bf16 --distributed-optimizer --analytic",
                 "estimate llama-3-8b --mode lora --batch 2 --seq 1024 --analytic", "estimate --params 7B --precision fp16 --optimizer adam"],
    "params": ["params gpt2", "params llama-3-8b"],
    "fit": ["fit gpt2 --analytic", "fit llama-3-8b --seq 4096 --gpu A100-80GB --analytic",
            "fit llama-3.1-8b --engine llama.cpp --quant Q4_K_M --gpu RTX-4090 --ctx-size 8192"],
    "advise": ["advise gpt2 --analytic", "advise llama-3-8b --batch 4 --seq 4096 --gpu A100-80GB --analytic"],
    "sweep": ["sweep gpt2 --batches 1,2 --analytic", "sweep gpt2 --batches 1 --seqs 256,512"],
    "plan": ["plan gpt2 --gpus 2 --top 2", "plan llama-3-8b --gpus 8 --top 2 --seq 4096"],
    "doctor": ["doctor " + shlex.quote(OOM), "doctor " + shlex.quote(OOM) + " --model gpt2 --batch 8"],
    "compat-deepspeed": ["compat deepspeed --params 2783959040 --largest-layer-params 65798144 --stage 3", "compat deepspeed gpt2 --stage 2"],
    "serving": ["serving llama-3.1-8b --gpu H100-80GB --max-model-len 32768", "serving llama-3.1-8b --gpu RTX-4090 --max-model-len 131072",
                "serving llama-3.1-8b --gpu A100-40GB --tp 2 --kv-dtype fp8 --enforce-eager",
                "serving llama-3.1-8b --engine sglang --gpu H100-80GB",
                "serving llama-3.1-8b --engine llama.cpp --quant Q4_K_M --gpu RTX-4090 --ctx-size 32768 --n-gpu-layers 20 --tensor-split 1,1"],
    "models": ["models"],
    "gpus": ["gpus"],
    "timeline": ["estimate gpt2 --seq 256 --timeline {tmp}/t.json"],
    "calibrate": ["calibrate gpt2 --seq 1024 --measured-total 9GiB --analytic",
                  "calibrate gpt2 --seq 512 --measured-allocated 3GiB --measured-reserved 4GiB --measured-total 5GiB"],
}
DESCRIPTIONS = {
    "estimate": "Per-GPU memory of one job part by part (per_gpu, breakdown summing to total_device), the resolved request, assumptions, and time.",
    "params": "Parameter counts by component and dtype.",
    "fit": "The largest micro-batch and the longest sequence that fit; with --engine, the serving answer (as gpumem serving) with what fits that engine: fit_max_model_len, concurrency and (llama.cpp) llamacpp.fit_gpu_layers and fit_ctx_size.",
    "advise": "Each memory-saving technique's saving and time cost, and the cheapest combination that fits.",
    "sweep": "Memory (and time) over micro-batch sizes and sequence lengths.",
    "plan": "Layouts that fit, fastest first.",
    "doctor": "Diagnosis of a CUDA out-of-memory message and ranked remedies.",
    "compat-deepspeed": "DeepSpeed's estimate_zero2/zero3_model_states_mem_needs rows.",
    "serving": "A model served by an engine (vLLM, SGLang, llama.cpp): per-GPU parts (per_gpu, per_rank), KV-cache blocks and tokens, maximum concurrency, host RAM and llama.cpp's buffers, throughput per concurrency, and the error the engine would stop with.",
    "models": "The built-in model presets.",
    "gpus": "The built-in GPU catalog.",
    "calibrate": "A calibration (docs/calibration.md): format gpumem-calibration version 1, the terms fitted to the measured job, and the job's figures before and after; saved, it is what --calibration reads.",
    "timeline": "The simulated allocator timeline of one step (gpumem estimate --timeline FILE.json, POST /v1/timeline).",
}


def outputs(gpumem, command):
    with tempfile.TemporaryDirectory() as tmp:
        for line in SAMPLES[command]:
            args = shlex.split(line.format(tmp=tmp))
            if command == "timeline":
                p = subprocess.run([gpumem, *args], capture_output=True, text=True)
                if p.returncode:
                    sys.exit(f"gpumem {line} failed: {p.stderr}")
                yield line, json.load(open(os.path.join(tmp, "t.json")))
                continue
            p = subprocess.run([gpumem, *args, "--format", "json"], capture_output=True, text=True)
            if p.returncode:
                sys.exit(f"gpumem {line} failed: {p.stderr}")
            yield line, json.loads(p.stdout)


def kind(v):
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


def infer(values):
    """One schema for all sample values."""
    kinds = sorted({kind(v) for v in values})
    if "integer" in kinds and "number" in kinds:
        kinds.remove("integer")
    s = {"type": kinds[0] if len(kinds) == 1 else kinds}
    objs = [v for v in values if isinstance(v, dict)]
    if objs:
        keys = []
        for o in objs:
            keys += [k for k in o if k not in keys]
        s["properties"] = {k: infer([o[k] for o in objs if k in o]) for k in keys}
        req = [k for k in keys if all(k in o for o in objs)]
        if req:
            s["required"] = req
    arrs = [x for v in values if isinstance(v, list) for x in v]
    if arrs:
        s["items"] = infer(arrs)
    return s


def validate(v, s, path="$"):
    """The subset of JSON Schema the files use: type, properties, required, items."""
    t = s.get("type")
    types = t if isinstance(t, list) else [t] if t else []
    k = kind(v)
    if types and k not in types and not (k == "integer" and "number" in types):
        return [f"{path}: {k}, schema says {t}"]
    errs = []
    if isinstance(v, dict):
        for r in s.get("required", []):
            if r not in v:
                errs.append(f"{path}: missing required \"{r}\"")
        for key, sub in s.get("properties", {}).items():
            if key in v:
                errs += validate(v[key], sub, f"{path}.{key}")
    if isinstance(v, list) and "items" in s:
        for i, x in enumerate(v):
            errs += validate(x, s["items"], f"{path}[{i}]")
    return errs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpumem", default=os.path.join(ROOT, "build/gpumem"))
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    bad = 0
    for command in SAMPLES:
        path = os.path.join(DIR, f"{command}.schema.json")
        samples = list(outputs(a.gpumem, command))
        if a.check:
            schema = json.load(open(path))
            for line, out in samples:
                errs = validate(out, schema)
                if errs:
                    bad += 1
                    print(f"gpumem {line} --format json does not match {os.path.relpath(path, ROOT)}:")
                    for e in errs[:10]:
                        print("  " + e)
            continue
        schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": f"gpumem/{command}.schema.json",
                  "title": f"gpumem {command} answer", "description": DESCRIPTIONS[command]}
        schema.update(infer([o for _, o in samples]))
        with open(path, "w") as f:
            json.dump(schema, f, indent=1)
            f.write("\n")
    if bad:
        sys.exit(f"{bad} outputs do not match their schema (docs/schema); update on purpose with python3 scripts/gen-schemas.py")


if __name__ == "__main__":
    main()
