#!/usr/bin/env python3
"""Generates the accuracy table: gpumem's estimate for every measurement in
tests/fixtures/groundtruth/measured.json that it can express, and its error.

Usage: python3 scripts/accuracy.py [--gpumem build/gpumem] [--write] [--json] [--section all|classic|frameworks]
Without --write it prints the Markdown table, then the framework-measurement
section (tests/fixtures/groundtruth/framework_measured.json) under its own
heading; with --write it replaces the block between <!-- accuracy:begin -->
and <!-- accuracy:end --> in README.md with the first, and the block between
<!-- framework-accuracy:begin --> and <!-- framework-accuracy:end --> with the
second if those markers exist. --json prints the framework rows' results as
JSON (for tests). --section classic prints only the original table.
The measurements are public (their sources are in the fixture); nothing here
is fitted to them.
"""
import argparse
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1024 * 1024
GIB = 1024 * MIB
# Multi-GPU measurements (tests/fixtures/groundtruth/distributed_measured.json)
# that gpumem can express: flags and the per_gpu field compared.
DISTRIBUTED = {
    "torchtune-llama3.1-70b-lora-8xa100": (
        ["llama-3-70b", "--mode", "lora", "--lora-rank", "16", "--lora-targets", "q_proj,k_proj,v_proj", "--gpus", "8",
         "--fsdp", "full", "--batch", "2", "--seq", "2048", "--recompute", "full", "--precision", "bf16", "--gpu", "A100-80GB"],
        "peak_reserved"),
    "peft-llama2-70b-lora-zero3-8xh100": (
        ["llama-2-70b", "--mode", "lora", "--lora-rank", "8", "--lora-targets", "all-linear", "--zero", "3", "--gpus", "8",
         "--batch", "8", "--seq", "2048", "--grad-accum", "4", "--recompute", "full", "--precision", "amp-bf16", "--gpu", "H100"],
        "total_device"),
}
# Measurements whose settings gpumem can only bracket: (flags, field, option name, low value, high value).
BRACKETED = {
    "torchtitan-llama3.1-8b-fsdp-8xh100": (
        ["llama-3-8b", "--gpus", "8", "--fsdp", "full", "--batch", "2", "--seq", "8192", "--precision", "bf16",
         "--gpu", "H100", "--gpu-memory", "96GiB"], "peak_reserved", "--recompute", "full", "selective",
        "torchtitan's op-level selective checkpointing (keeps every other matmul output) lies between gpumem's full and "
        "selective recompute"),
    "torchtitan-llama3.1-8b-fsdp-128xh100": (
        ["llama-3-8b", "--gpus", "128", "--nodes", "16", "--fsdp", "full", "--batch", "2", "--seq", "8192", "--precision",
         "bf16", "--gpu", "H100", "--gpu-memory", "96GiB"], "peak_reserved", "--recompute", "full", "selective",
        "as above"),
}
# load_in_8bit -> LLM.int8; load_in_4bit's defaults are fp4 without double
# quantization and fp32 compute, which gpumem approximates with nf4 (double
# quantization, 16-bit compute).
# load_in_4bit=True with BitsAndBytesConfig's defaults: fp4, no double quantization.
OCTOCODER_SHORT = {"octocoder-bf16-short": ["none"], "octocoder-int8-short": ["int8"], "octocoder-4bit-short": ["fp4", "--no-double-quant"]}


def run(gpumem, args):
    out = subprocess.run([gpumem, "estimate", *args, "--format", "json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def bert_large_args(m):
    dtype = m["dtype"] or ""
    opt = m["optimizer"] or ""
    args = ["bert-large-uncased", "--gpu", "V100-16GB", "--seq", str(m["seq_len"]), "--batch", str(m["batch_size"]),
            "--grad-accum", str(m.get("grad_accum", 1)), "--attention", "eager",
            # The same source measured this machine's CUDA context: 1343 MiB.
            "--cuda-context", "1343MiB",
            # 2022 stack (torch 1.x, transformers' Trainer): zero_grad() kept
            # gradients (set_to_none=False) and optimizers ran a per-parameter loop.
            "--zero-grad", "zero", "--optimizer-impl", "for-loop"]
    args += ["--precision", "amp-fp16" if "fp16" in dtype else "fp32"]
    if "Adafactor" in opt:
        args += ["--optimizer", "adafactor"]
    elif "8bit" in opt:
        args += ["--optimizer", "adamw-8bit"]
    else:
        args += ["--optimizer", "adamw"]
    if m.get("gradient_checkpointing"):
        args += ["--recompute", "full"]
    return args


def rows(gpumem):
    gt = json.load(open(os.path.join(ROOT, "tests/fixtures/groundtruth/measured.json")))
    out = []
    for m in gt["measured"]:
        mid = m["id"]
        if mid.startswith("hf-train-"):
            args = bert_large_args(m)
            est = run(gpumem, args)
            predicted = est["per_gpu"]["total_device"] / MIB
            out.append((mid, "nvidia-smi MiB", m["value"], predicted, "gpumem estimate " + " ".join(args)))
        elif mid in OCTOCODER_SHORT:
            # Prompt: ~20 tokens (the source's KV-cache demo shows 20), 60 generated.
            args = ["octocoder", "--mode", "infer", "--gpu", "A100-40GB", "--batch", "1", "--seq", "20", "--gen-len", "60",
                    "--precision", "bf16", "--quant", *OCTOCODER_SHORT[mid]]
            est = run(gpumem, args)
            predicted = est["per_gpu"]["peak_allocated"] / 2**30
            out.append((mid, "max_memory_allocated GiB", m["value"], predicted, "gpumem estimate " + " ".join(args)))
        elif mid == "accelerate-bert-base-cased-load":
            args = [os.path.join("tests/fixtures/configs/bert-base-cased.json"), "--mode", "infer", "--precision", "fp32",
                    "--seq", "1"]
            est = run(gpumem, [os.path.join(ROOT, args[0])] + args[1:])
            predicted = est["per_gpu"]["weights"] / MIB
            out.append((mid, "memory_allocated MiB (weights)", m["value"], predicted, "gpumem estimate " + " ".join(args) + " (per_gpu.weights)"))
        else:
            out.append((mid, m.get("metric", ""), m["value"], None, "not expressible: " + not_expressible_reason(m)))
    for s in gt["seed_notes"]:
        if s["id"] == "cn-toy-mlp-fp32":
            # First training step of seed 000's loop: no optimizer state yet, the
            # peak is in backward (max_memory_allocated, MiB).
            args = ["tests/fixtures/models/toy_mlp.json", "--batch", "10240", "--precision", "fp32", "--optimizer", "sgd",
                    "--gpu", "A100-80GB"]
            est = run(gpumem, [os.path.join(ROOT, args[0])] + args[1:])
            out.append(("seed-000-toy-mlp-peak", "max_memory_allocated MiB", s["values"]["peak"],
                        est["per_gpu"]["peak_allocated"] / MIB, "gpumem estimate " + " ".join(args)))
    dist = json.load(open(os.path.join(ROOT, "tests/fixtures/groundtruth/distributed_measured.json")))
    for m in dist["measured"]:
        if m["id"] not in DISTRIBUTED:
            continue
        args, field = DISTRIBUTED[m["id"]]
        est = run(gpumem, args)
        unit = GIB if m["unit"] == "GiB" else 1e9
        out.append((m["id"], f"{m['metric'].split(' ')[0]} {m['unit']} (gpumem {field})", m["value"],
                    est["per_gpu"][field] / unit, "gpumem estimate " + " ".join(args)))
    for m in dist["measured"]:
        if m["id"] not in BRACKETED:
            continue
        args, field, opt, lo, hi, why = BRACKETED[m["id"]]
        unit = GIB if m["unit"] == "GiB" else 1e9
        a = run(gpumem, args + [opt, lo])["per_gpu"][field] / unit
        b = run(gpumem, args + [opt, hi])["per_gpu"][field] / unit
        out.append((m["id"], m["metric"].split(" ")[0] + " " + m["unit"], m["value"], None,
                    f"bracketed: {opt} {lo} gives {a:.1f}, {opt} {hi} gives {b:.1f}; {why}; `gpumem estimate {' '.join(args)} {opt} ...`"))
    rest = len(dist["measured"]) - len(DISTRIBUTED) - len(BRACKETED)
    out.append(("(other multi-GPU entries)", "", float(rest), None,
                "capacity boundaries or settings too incomplete to reproduce: see tests/fixtures/groundtruth/DISTRIBUTED.md"))
    return out


def not_expressible_reason(m):
    if "octocoder" in m["id"]:
        return "the long prompt's token count is not given"
    if m["id"] in ("hf-anatomy-cuda-context",):
        return "context only (it is the --cuda-context used for the V100 rows)"
    if m["id"] == "hf-anatomy-model-loaded":
        return "weights of BertForSequenceClassification on load, no training step"
    return "settings not given"


def table(rs):
    lines = ["| measurement | metric | measured | gpumem | error | command |", "|---|---|---:|---:|---:|---|"]
    for mid, metric, meas, pred, cmd in rs:
        if pred is None:
            lines.append(f"| {mid} | {metric} | {meas:.2f} | - | - | {cmd} |")
        else:
            err = 100.0 * (pred - meas) / meas
            lines.append(f"| {mid} | {metric} | {meas:.2f} | {pred:.2f} | {err:+.1f}% | `{cmd}` |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------------------
# Framework measurements (tests/fixtures/groundtruth/framework_measured.json): every row's settings are mapped to
# `gpumem estimate` flags, or the row says why it cannot be expressed. Flags that the binary does not list in
# `estimate --help` are never passed; a row that needs one is reported as "not yet expressible: <flag>".

FRAMEWORK_FILE = os.path.join(ROOT, "tests/fixtures/groundtruth/framework_measured.json")
FRAMEWORK_FIELD = {"max_memory_allocated": "peak_allocated", "active_bytes_peak": "peak_allocated",
                   "max_memory_reserved": "peak_reserved", "nvidia_smi_used": "total_device",
                   "unspecified_peak": "total_device"}
UNIT_BYTES = {"GB": 1e9, "GiB": 2.0 ** 30, "MB": 2.0 ** 20, "MiB": 2.0 ** 20, "bytes": 1.0}
# Hugging Face ids (lower case) that name the same architecture as a preset under another id.
MODEL_ALIASES = {
    "meta-llama/meta-llama-3-8b": ("llama-3-8b", None),
    "meta-llama/meta-llama-3-8b-instruct": ("llama-3-8b", None),
    "meta-llama/meta-llama-3.1-8b": ("llama-3.1-8b", None),
    "meta-llama/llama-3.1-8b-instruct": ("llama-3.1-8b", None),
    "meta-llama/llama-3.1-70b-instruct": ("llama-3.1-70b", None),
    "meta-llama/llama-3.2-1b-instruct": ("llama-3.2-1b", None),
    "meta-llama/llama-3.2-3b-instruct": ("llama-3.2-3b", None),
    "unsloth/mistral-7b-v0.2": ("mistral-7b-v0.1", "Mistral-7B-v0.2 modelled by the v0.1 preset (same shapes; v0.2 drops the 4096-token sliding window, irrelevant at these lengths)"),
    "tinyllama/tinyllama-1.1b-intermediate-step-1431k-3t": ("tinyllama-1.1b", None),
}
GPU_MAP = [  # (substring of the row's gpu, gpumem flags, approximation note or None)
    ("A10G", ["--gpu", "A10G-24GB"], None),
    ("A100-SXM4-40GB", ["--gpu", "A100-40GB"], None),
    ("A100 40GB", ["--gpu", "A100-40GB"], None),
    ("A100 80GB", ["--gpu", "A100-80GB"], None),
    ("A100 with", ["--gpu", "A100-80GB"], "A100 run with a per-process memory fraction: modelled as an A100-80GB"),
    ("A100", ["--gpu", "A100-80GB"], "A100 size not stated: A100-80GB assumed"),
    ("RTX 4090", ["--gpu", "RTX-4090"], None),
    ("A6000", ["--gpu", "A100-80GB", "--gpu-memory", "48GiB"], "RTX A6000 modelled as an Ampere A100 with 48 GiB"),
    ("L40S", ["--gpu", "L40S-48GB"], None),
    ("H100 HBM2e 96 GB", ["--gpu", "H100-80GB", "--gpu-memory", "96GiB"], None),
    ("H100", ["--gpu", "H100-80GB"], None),
    ("H200", ["--gpu", "H200-141GB"], None),
    ("T4", ["--gpu", "T4-16GB"], None),
    ("V100", ["--gpu", "V100-32GB"], None),
]
TARGETS = {  # the framework's LoRA target names -> Hugging Face module names, by gpumem model_type
    "litgpt": {"query": "q", "key": "k", "value": "v", "projection": "o", "mlp": "mlp", "head": "lm_head"},
    "torchtune": {"q_proj": "q", "k_proj": "k", "v_proj": "v", "output_proj": "o", "mlp (w1,w2,w3)": "mlp", "output": "lm_head"},
}
HF_LINEAR = {  # model_type -> (q, k, v, o, mlp modules, fused qkv name or None)
    "llama": ("q_proj", "k_proj", "v_proj", "o_proj", ["gate_proj", "up_proj", "down_proj"], None),
    "mistral": ("q_proj", "k_proj", "v_proj", "o_proj", ["gate_proj", "up_proj", "down_proj"], None),
    "gemma": ("q_proj", "k_proj", "v_proj", "o_proj", ["gate_proj", "up_proj", "down_proj"], None),
    "qwen2": ("q_proj", "k_proj", "v_proj", "o_proj", ["gate_proj", "up_proj", "down_proj"], None),
    "phi": ("q_proj", "k_proj", "v_proj", "dense", ["fc1", "fc2"], None),
    "phi3": (None, None, None, "o_proj", ["gate_up_proj", "down_proj"], "qkv_proj"),
    "gpt_neox": (None, None, None, "dense", ["dense_h_to_4h", "dense_4h_to_h"], "query_key_value"),
}


class NotExpressible(Exception):
    pass


def estimate_flags(gpumem):
    out = subprocess.run([gpumem, "estimate", "--help"], capture_output=True, text=True, check=True).stdout
    return set(re.findall(r"--[a-z0-9][a-z0-9-]*", out))


def presets(gpumem):
    out = subprocess.run([gpumem, "models"], capture_output=True, text=True, check=True).stdout
    by_hf, types = {}, {}
    for ln in out.splitlines():
        parts = ln.split()
        if len(parts) == 3 and "/" in parts[2]:
            by_hf[parts[2].lower()] = parts[0]
            types[parts[0]] = parts[1]
    return by_hf, types


def _need(flags, flag, what):
    if flag not in flags:
        raise NotExpressible(f"not yet expressible: {flag} ({what})")


def _lora_targets(r, model_type, approx):
    lo = r["lora"]
    names = lo.get("targets") or []
    kind = lo.get("target_names")
    if not names:
        raise NotExpressible("LoRA targets not stated")
    if kind == "hf":
        if "all-linear" in names:
            return ",".join(["all-linear"] + [n for n in names if n == "lm_head"])
        if any(" " in n or "(" in n or "." in n for n in names):
            raise NotExpressible(f"LoRA targets {names} are not module names")
        return ",".join(names)
    table = TARGETS.get(kind)
    if table is None or model_type not in HF_LINEAR:
        raise NotExpressible(f"no LoRA target mapping for {kind} names on a {model_type} model")
    q, k, v, o, mlp, fused = HF_LINEAR[model_type]
    want = [table[n] for n in names]
    out = []
    if fused:
        qkv = [x for x in want if x in ("q", "k", "v")]
        if qkv and len(qkv) != 3:
            if r["framework"] != "litgpt":
                raise NotExpressible(f"LoRA on part of the fused {fused} ({','.join(qkv)}) has no gpumem target")
            # LitGPT's LoRAQKVLinear: one dropout of the input and one A for the
            # enabled parts; modelled as LoRA on the whole fused projection.
            approx.append(f"LoRA on {','.join(qkv)} of the fused {fused} modelled on the whole of it "
                          f"(one more adapter pair per layer: rank x (hidden + hidden) parameters)")
        if qkv:
            out.append(fused)
    else:
        out += [{"q": q, "k": k, "v": v}[x] for x in want if x in ("q", "k", "v")]
    if "o" in want:
        out.append(o)
    if "mlp" in want:
        out += mlp
    if "lm_head" in want:
        out.append("lm_head")
    return ",".join(out)


def _bnb_before_0432(v):
    """True when the row's bitsandbytes version (or its date note) is older than 0.43.2."""
    if not v:
        return False
    if v.startswith("< 0.43.2"):
        return True
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", v)
    return bool(m) and tuple(int(x) for x in m.groups()) < (0, 43, 2)


def _precision(p):
    if p is None:
        raise NotExpressible("precision not stated")
    pl = p.lower()
    table = [("bf16-true", "bf16"), ("bf16-mixed", "amp-bf16"), ("16-true", "fp16"), ("16-mixed", "amp-fp16"),
             ("32-true", "fp32"), ("dtype: bf16", "bf16"), ("mixedprecisionpolicy(param_dtype=bf16", "amp-bf16"),
             ("model dtype bfloat16, use_amp false", "bf16"), ("fp32", "fp32"), ("bf16: true", "bf16"),
             ("bf16: auto", "bf16"), ("--bf16 true", "bf16")]
    for key, val in table:
        if pl.startswith(key) or key in pl:
            return val, None
    if pl.startswith("16-bit") or pl.startswith("4-bit"):
        return "bf16", "16-bit flavour not stated: bf16 assumed"
    raise NotExpressible(f"precision '{p}' has no mapping")


# torchtitan commits (as the rows' sources name them) whose train.py left the
# loss uncompiled under training.compile.
TORCHTITAN_LOSS_NOT_COMPILED = ("torchtitan 9dec370ad",)


def _optimizer(r, task, flags):
    o = r.get("optimizer")
    notes, args = [], []
    if o is None:
        if task in ("lora", "qlora"):
            return ["--optimizer", "adamw"], ["optimizer not stated: AdamW assumed (adapter states only)"]
        raise NotExpressible("optimizer not stated")
    ol = o.lower()
    if "4bit" in ol:
        raise NotExpressible(f"optimizer '{o}' (4-bit states) has no gpumem equivalent")
    if "lora-fa" in ol:
        raise NotExpressible("LoRA-FA optimizer (frozen A, no A gradients) has no gpumem equivalent")
    # Paged only when the optimizer named is (text before any parenthesis):
    # torchtune's "8-bit AdamW" row merely notes the config's paged default.
    paged = "paged" in ol.split("(")[0]
    if "8-bit adamw (" in ol and "paged" in ol:
        notes.append("8-bit AdamW implementation not stated (torchtune's docs offer torchao AdamW8bit and bitsandbytes PagedAdamW8bit): "
                     "non-paged states in the allocator assumed")
    if paged:
        # bitsandbytes paged optimizers keep their states in CUDA managed
        # memory: counted on the device, not in the allocator's statistics.
        eight = "8bit" in ol or "8-bit" in ol
        args = ["--optimizer", "paged-adamw8bit" if eight else "paged-adamw"]
    elif "8bit" in ol or "8-bit" in ol:
        args = ["--optimizer", "adamw-8bit"]
    elif "sgd" in ol:
        args = ["--optimizer", "sgd"]
    elif "adamw" in ol or "adam" in ol:
        args = ["--optimizer", "adamw"]
    else:
        raise NotExpressible(f"optimizer '{o}' has no mapping")
    if paged:
        notes.append("paged optimizer: states in CUDA managed memory (device total, not allocator statistics)")
    if "fused=true" in ol.replace(" ", "") or "fused: true" in ol:
        args += ["--optimizer-impl", "fused"]
    return args, notes


def framework_args(r, flags, by_hf, types):
    """gpumem estimate arguments for one row, the per_gpu field to compare, and approximation notes."""
    if r["kind"] not in ("measured", "capacity_boundary"):
        raise NotExpressible(f"kind {r['kind']} has no mapping")
    if r.get("suspect"):
        raise NotExpressible("excluded: the number contradicts the row's settings (see 'suspect')")
    task = r["task"]
    if task == "adapter":
        raise NotExpressible("LLaMA-Adapter has no gpumem mode")
    if task == "peft-other":
        raise NotExpressible(f"PEFT method {(r.get('method') or '').split(' ')[0]} has no gpumem mode")
    method = r.get("method") or ""
    if task == "lora" and method.startswith("LoRA +") and method != "LoRA + rsLoRA":
        raise NotExpressible(f"LoRA variant '{method}' has no gpumem mode")
    fused_kernels = r["framework"] == "unsloth" or "unsloth" in method.lower() or method.startswith("kernels:")
    model = (r.get("model") or "").lower()
    approx = []
    if model in MODEL_ALIASES:
        preset, note = MODEL_ALIASES[model]
        if note:
            approx.append(note)
    elif model in by_hf:
        preset = by_hf[model]
    else:
        raise NotExpressible(f"no preset or config for {r.get('model')}")
    mtype = types.get(preset, "")
    if r.get("seq_len") is None:
        raise NotExpressible("sequence length of the peak batch not stated (padded per batch, or not given)")
    if r.get("micro_batch_size") is None:
        raise NotExpressible("micro batch not stated")
    mode = {"full": "train", "pretrain": "train", "lora": "lora", "qlora": "qlora"}[task]
    args = [preset, "--mode", mode, "--batch", str(r["micro_batch_size"]), "--seq", str(r["seq_len"])]
    if "--framework" in flags:
        args += ["--framework", r["framework"]]
    # lit-gpt puts the dataset's longest sample in the first micro-batch only
    # (finetune/lora.py@8641822b3249 L212: get_batch(..., longest_seq_ix if
    # iter_num == 0)); later micro-batches are random, shorter samples. With
    # adapters only (tiny gradients) on one GPU, the run peaks in that first
    # micro-batch, before any earlier graph is held by the loop's `logits`:
    # compared with the simulated first step of one micro-batch.
    first_micro_batch = ("first micro-batch" in (r.get("seq_len_note") or "") and task in ("lora", "qlora") and
                         (r.get("num_gpus") or 1) == 1)
    if first_micro_batch:
        args += ["--grad-accum", "1"]
        approx.append("the longest sample runs in the first micro-batch only (lit-gpt finetune/lora.py L212): "
                      "compared with the simulated first step of one micro-batch (no earlier graph held)")
    elif r.get("grad_accum"):
        args += ["--grad-accum", str(r["grad_accum"])]
    prec, note = _precision(r.get("precision"))
    args += ["--precision", prec]
    if note:
        approx.append(note)
    oargs, onotes = _optimizer(r, task, flags)
    args += oargs
    approx += onotes
    gc = r.get("grad_checkpointing")
    if gc is None:
        raise NotExpressible("activation checkpointing not stated")
    gcs = str(gc).lower()
    if gc is False:
        args += ["--recompute", "none"]
    elif gcs == "offload":
        _need(flags, "--activation-offload", "checkpointed layer inputs offloaded to the CPU")
        args += ["--recompute", "full", "--activation-offload"]
    elif "op-level" in gcs or "selective_ac_option 'op'" in gcs:
        # torchtitan's per-op selective checkpointing (every other matmul output saved)
        args += ["--recompute", "ops"]
    elif gc is True or gcs in ("full", "true") or gcs.startswith("per block"):
        args += ["--recompute", "full"]
    else:
        raise NotExpressible(f"activation checkpointing '{gc}' has no mapping")
    if task in ("lora", "qlora"):
        lo = r.get("lora") or {}
        if lo.get("rank") is None:
            raise NotExpressible("LoRA rank not stated")
        args += ["--lora-rank", str(lo["rank"]), "--lora-targets", _lora_targets(r, mtype, approx)]
        if lo.get("dropout") is None:
            raise NotExpressible("LoRA dropout not stated")
        if lo["dropout"] > 0:
            _need(flags, "--lora-dropout", f"LoRA dropout {lo['dropout']} keeps a dropped copy of each adapted input")
            args += ["--lora-dropout", str(lo["dropout"])]
        if lo.get("adapter_dtype", "").startswith("fp32"):
            approx.append("fp32 adapter weights (autocast_adapter_dtype) modelled in the base dtype")
    q = r.get("quantization")
    if q:
        qt = q["type"].lower()
        if qt.startswith("nf4"):
            args += ["--quant", "nf4"]
            if q.get("double_quant") is False:
                if "--no-double-quant" in flags:
                    args += ["--no-double-quant"]
                else:
                    approx.append("nf4 without double quantization modelled with double quantization")
            elif q.get("double_quant") is None:
                approx.append("double quantization not stated")
        elif qt.startswith("int8"):
            args += ["--quant", "int8"]
        else:
            raise NotExpressible(f"quantization {q['type']} has no mapping")
        if "lm_head" in (q.get("quantized_modules") or ""):
            _need(flags, "--quantize-head", "lm_head quantized too")
            args += ["--quantize-head"]
        if _bnb_before_0432(q.get("bnb_version")) and qt.startswith("nf4"):
            _need(flags, "--bnb-4bit-saves-input", "bitsandbytes < 0.43.2 keeps the 4-bit matmul input")
            args += ["--bnb-4bit-saves-input"]
        elif q.get("library", "").startswith("bitsandbytes") and not q.get("bnb_version") and qt.startswith("nf4"):
            approx.append("bitsandbytes version not stated")
    ce = (r.get("cross_entropy") or "full").lower()
    if ce.startswith("fused-linear"):
        _need(flags, "--cross-entropy", "loss without materialized logits")
        args += ["--cross-entropy", "fused-linear"]
    elif ce.startswith("chunked"):
        _need(flags, "--cross-entropy", "chunked cross-entropy")
        args += ["--cross-entropy", "chunked"]
    elif ce.startswith("fused"):
        _need(flags, "--cross-entropy", "fused cross-entropy")
        args += ["--cross-entropy", "fused"]
    elif "--cross-entropy" in flags:
        args += ["--cross-entropy", "full"]
    if r.get("activation_offloading") and "--activation-offload" not in args:
        _need(flags, "--activation-offload", "activation offloading")
        args += ["--activation-offload"]
    if r.get("optimizer_in_backward"):
        _need(flags, "--optimizer-in-backward", "optimizer step fused into the backward")
        args += ["--optimizer-in-backward"]
    if r.get("compile"):
        _need(flags, "--compile", "torch.compile")
        args += ["--compile"]
        # torchtitan compiled the loss with the blocks except from 2024-12-18
        # (e8977b0) to 2025-04-02 (bbb1b61): train.py@9dec370ad26b L137-138.
        if r["framework"] == "torchtitan" and any(c in (r.get("source") or "") for c in TORCHTITAN_LOSS_NOT_COMPILED):
            _need(flags, "--compile-loss", "torch.compile of the blocks only")
            args += ["--no-compile-loss"]
            approx.append("torchtitan at this commit compiled the blocks, not the loss (train.py L137-138 commented out)")
    if r.get("fp8"):
        if "tensorwise" in str(r["fp8"]) and "--fp8-recipe" in flags:
            args += ["--fp8-recipe", "tensorwise"]
        else:
            args += ["--fp8"]
            approx.append("FP8 linears: gpumem's --fp8 changes time only")
    if fused_kernels:
        _need(flags, "--kernels", "fused Triton kernels (Unsloth / axolotl LoRA kernels)")
        args += ["--kernels", "fused"]
    att = (r.get("attention") or "").lower()
    if "eager" in att and "not stated" not in att:
        args += ["--attention", "eager"]
    elif "xformers" in att or "flex" in att:
        approx.append(f"{r['attention']} modelled as flash attention")
    gpus = r.get("num_gpus") or 1
    if gpus > 1:
        args += ["--gpus", str(gpus)]
        if (r.get("num_nodes") or 1) > 1:
            args += ["--nodes", str(r["num_nodes"])]
    shard = (r.get("sharding") or "").lower()
    if shard.startswith("fsdp"):
        args += ["--fsdp", "full"]
        # FSDP1 flat parameters (use_orig_params=True with frozen and LoRA
        # weights in one unit): the frozen weights get gradients too.
        if "use_orig_params=true" in shard:
            _need(flags, "--fsdp-version", "FSDP1 flat parameters")
            args += ["--fsdp-version", "1"]
        # LitGPT's finetune scripts accumulate inside fabric.no_backward_sync
        # (= FSDP.no_sync()): litgpt/finetune/full.py@26857050fe3f L280-281.
        if ("no_sync" in shard or r["framework"] == "litgpt") and (r.get("grad_accum") or 1) > 1:
            _need(flags, "--no-sync", "gradient accumulation inside FSDP.no_sync()")
            args += ["--no-sync"]
    elif "zero-3" in shard:
        args += ["--zero", "3"]
        if "offload" in shard:
            args += ["--offload-params", "cpu", "--offload-optimizer", "cpu"]
    elif shard:
        raise NotExpressible(f"sharding '{r['sharding']}' has no mapping")
    if (r.get("pp") or 1) > 1:
        raise NotExpressible("pipeline stage split and microbatch count not stated")
    for key, flag in (("tp", "--tp"), ("pp", "--pp"), ("cp", "--cp")):
        if (r.get(key) or 1) > 1:
            args += [flag, str(r[key])]
    if (r.get("tp") or 1) > 1:
        args += ["--sp"]
    gpu = r.get("gpu")
    for sub, gflags, note in GPU_MAP:
        if gpu and sub in gpu:
            args += gflags
            if note:
                approx.append(note)
            break
    else:
        args += ["--gpu", "A100-80GB"]
        approx.append(f"GPU {'not stated' if not gpu else repr(gpu)}: A100-80GB assumed")
    if r["kind"] == "capacity_boundary":
        return args, "fits", approx
    field = FRAMEWORK_FIELD[r["metric"]]
    if first_micro_batch and field == "peak_allocated":
        field = "first_step.peak_allocated"
    if r["metric"] == "unspecified_peak" and r["framework"] == "torchtune":
        # torchtune's memory log prints allocator statistics only (active,
        # allocated, reserved: torchtune/training/memory.py get_memory_stats),
        # never device-wide memory; its 2024-04 README QLoRA figure (9.29 GB)
        # was the tutorial's max_memory_reserved, so reserved is compared.
        field = "peak_reserved"
        approx.append("statistic not named; torchtune logs only allocator statistics: compared with peak_reserved")
    elif r["metric"] == "unspecified_peak":
        approx.append("statistic not named: compared with total_device (device-wide)")
    if r["metric"] == "active_bytes_peak":
        approx.append("active_bytes.all.peak compared with peak_allocated")
    if r["unit"] in ("MB",):
        approx.append("MB read as MiB")
    return args, field, approx


def framework_rows(gpumem):
    data = json.load(open(FRAMEWORK_FILE))
    flags = estimate_flags(gpumem)
    by_hf, types = presets(gpumem)
    out = []
    for r in data["measured"]:
        res = {"id": r["id"], "framework": r["framework"], "kind": r["kind"], "task": r["task"], "metric": r.get("metric"),
               "unit": r.get("unit"), "measured": r["value"] if r["kind"] == "measured" else None, "field": None,
               "predicted": None, "error_pct": None, "args": None, "approximations": [], "cause": None,
               "error_cause": r.get("error_cause"), "completeness": r.get("completeness")}
        try:
            args, field, approx = framework_args(r, flags, by_hf, types)
        except NotExpressible as e:
            res["cause"] = str(e)
            out.append(res)
            continue
        proc = subprocess.run([gpumem, "estimate", *args, "--format", "json"], capture_output=True, text=True)
        if proc.returncode != 0:
            res["cause"] = "gpumem error: " + (proc.stderr.strip().splitlines() or ["?"])[-1]
            res["args"] = args
            out.append(res)
            continue
        est = json.loads(proc.stdout)
        if field == "fits":
            # A run the source reports as out of memory: gpumem must not say it fits.
            res.update(field=field, args=args, approximations=approx, oom_agrees=not est["per_gpu"]["fits"])
            out.append(res)
            continue
        # "first_step.peak_allocated": the simulation's first step; else a per-GPU field.
        pred = (est["simulation"]["first_step"][field.split(".", 1)[1]] if field.startswith("first_step.") else est["per_gpu"][field]) / UNIT_BYTES[r["unit"]]
        res.update(field=field, predicted=pred, error_pct=100.0 * (pred - r["value"]) / r["value"], args=args,
                   approximations=approx)
        out.append(res)
    return out


def _pct(xs, q):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def framework_summary(rs):
    groups = {}
    for r in rs:
        groups.setdefault(r["framework"], []).append(r)
    summary = {}
    # The aim is stated for rows whose settings are fully known: the
    # fixture's completeness grade "high" (settings reproducible from the source alone).
    known = [r for r in rs if r.get("completeness") == "high"]
    for name, g in sorted(groups.items()) + [("overall", rs), ("settings fully known (completeness high)", known)]:
        scored = [r for r in g if r["error_pct"] is not None]
        errs = [abs(r["error_pct"]) for r in scored]
        worst = max(scored, key=lambda r: abs(r["error_pct"])) if scored else None
        measured = [r for r in g if r["kind"] == "measured"]
        summary[name] = {
            "rows": len(g), "measured": len(measured), "n": len(scored),
            "not_yet_expressible": sum(1 for r in measured if (r["cause"] or "").startswith("not yet expressible")),
            "excluded": sum(1 for r in measured if (r["cause"] or "").startswith("excluded")),
            "not_expressible": sum(1 for r in measured if r["cause"] and not r["cause"].startswith(("not yet expressible", "excluded"))),
            "median_abs_error_pct": _pct(errs, 0.5) if errs else None, "p90_abs_error_pct": _pct(errs, 0.9) if errs else None,
            "worst_error_pct": worst["error_pct"] if worst else None, "worst_id": worst["id"] if worst else None,
            "beyond_20": sum(1 for r in scored if abs(r["error_pct"]) > 20),
            "beyond_20_unexplained": sum(1 for r in scored if abs(r["error_pct"]) > 20 and not r["error_cause"])}
    return summary


def framework_table(rs):
    s = framework_summary(rs)
    f = lambda x: "-" if x is None else f"{x:.1f}%"
    lines = ["Rows of `tests/fixtures/groundtruth/framework_measured.json`: GPU memory the frameworks published for their own "
             "fine-tuning and training runs. Each row's settings are mapped to `gpumem estimate` flags; the statistic the "
             "framework printed picks the field compared (max_memory_allocated and active bytes -> peak_allocated, reserved -> "
             "peak_reserved, unnamed 'peak memory' / 'VRAM' -> total_device).", "",
             "| framework | rows | measured | n scored | not yet expressible | not expressible | excluded | median abs error | p90 abs error | worst | beyond 20% (no named cause) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for name, v in s.items():
        worst = "-" if v["worst_id"] is None else f"{v['worst_error_pct']:+.1f}% ({v['worst_id']})"
        lines.append(f"| {name} | {v['rows']} | {v['measured']} | {v['n']} | {v['not_yet_expressible']} | {v['not_expressible']} | {v['excluded']} | "
                     f"{f(v['median_abs_error_pct'])} | {f(v['p90_abs_error_pct'])} | {worst} | {v['beyond_20']} ({v['beyond_20_unexplained']}) |")
    oom = [r for r in rs if r["kind"] == "capacity_boundary"]
    judged = [r for r in oom if r.get("oom_agrees") is not None]
    wrong = [r["id"] for r in judged if not r["oom_agrees"]]
    lines += ["", f"Runs the sources report as out of memory: {len(oom)}; expressible {len(judged)}, gpumem answers "
              f"\"does not fit\" for {len(judged) - len(wrong)}" + (f", \"fits\" for {', '.join(wrong)}" if wrong else "") + "."]
    lines += ["", "| measurement | metric | measured | gpumem | error | command or cause |", "|---|---|---:|---:|---:|---|"]
    for r in rs:
        if r["kind"] != "measured":
            continue
        metric = f"{r['metric']} {r['unit']}"
        if r["error_pct"] is None:
            lines.append(f"| {r['id']} | {metric} | {r['measured']:g} | - | - | {r['cause']} |")
        else:
            note = ("; " + "; ".join(r["approximations"])) if r["approximations"] else ""
            if abs(r["error_pct"]) > 20 and r["error_cause"]:
                note += "; known cause: " + r["error_cause"]
            lines.append(f"| {r['id']} | {metric} -> {r['field']} | {r['measured']:g} | {r['predicted']:.4g} | "
                         f"{r['error_pct']:+.1f}% | `gpumem estimate {' '.join(r['args'])}`{note} |")
    causes = {}
    for r in rs:
        if r["kind"] == "measured" and r["cause"]:
            key = re.sub(r"\d+(\.\d+)?", "N", r["cause"].split(" (")[0]) if r["cause"].startswith("not yet") else r["cause"]
            causes[key] = causes.get(key, 0) + 1
    lines += ["", "| cause a row is not scored | rows |", "|---|---:|"]
    for k, v in sorted(causes.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {k} | {v} |")
    return "\n".join(lines) + "\n"


def replace_block_if_present(text, name, body):
    b, e = f"<!-- {name}:begin -->\n", f"<!-- {name}:end -->"
    if b not in text or e not in text:
        return text
    i, j = text.index(b) + len(b), text.index(e)
    return text[:i] + body + text[j:]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpumem", default=os.path.join(ROOT, "build/gpumem"))
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--json", action="store_true", help="print the framework rows' results as JSON and exit")
    ap.add_argument("--check-aims", action="store_true",
                    help="exit 1 unless the framework measurements meet issue 12's aims: median <= 5%% and p90 <= 10%% "
                         "where the settings are fully known, and no row beyond 20%% without a named cause")
    ap.add_argument("--section", choices=["all", "classic", "frameworks"], default="all",
                    help="classic: only the original table (what the README's accuracy block holds); frameworks: only the "
                         "framework-measurement section")
    a = ap.parse_args()
    if a.check_aims:
        rs = framework_rows(a.gpumem)
        summ = framework_summary(rs)
        known, overall = summ["settings fully known (completeness high)"], summ["overall"]
        bad = [r["id"] for r in rs if r["error_pct"] is not None and abs(r["error_pct"]) > 20 and not r["error_cause"]]
        # a run that ran out of memory must never be answered "fits"
        wrong_fits = [r["id"] for r in rs if r.get("oom_agrees") is False]
        ok = (known["n"] > 0 and known["median_abs_error_pct"] <= 5 and known["p90_abs_error_pct"] <= 10 and not bad and not wrong_fits)
        print(f"settings fully known: n {known['n']}, median {known['median_abs_error_pct']:.1f}%, p90 {known['p90_abs_error_pct']:.1f}%; "
              f"overall: n {overall['n']}, median {overall['median_abs_error_pct']:.1f}%, p90 {overall['p90_abs_error_pct']:.1f}%; "
              f"beyond 20% without a named cause: {', '.join(bad) or 'none'}; OOM runs answered \"fits\": {', '.join(wrong_fits) or 'none'}")
        sys.exit(0 if ok else 1)
    if a.json:
        rs = framework_rows(a.gpumem)
        json.dump({"rows": rs, "summary": framework_summary(rs)}, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return
    t = table(rows(a.gpumem)) if a.section != "frameworks" else ""
    ft = framework_table(framework_rows(a.gpumem)) if a.section != "classic" else ""
    if not a.write:
        if t:
            sys.stdout.write(t)
        if ft:
            sys.stdout.write(("\n" if t else "") + "## Framework measurements\n\n" + ft)
        return
    path = os.path.join(ROOT, "README.md")
    text = open(path).read()
    if t:
        b, e = "<!-- accuracy:begin -->\n", "<!-- accuracy:end -->"
        i, j = text.index(b) + len(b), text.index(e)
        text = text[:i] + t + text[j:]
    if ft:
        text = replace_block_if_present(text, "framework-accuracy", ft)
    open(path, "w").write(text)


if __name__ == "__main__":
    main()
