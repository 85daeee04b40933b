#!/usr/bin/env python3
"""Mutation driver for the value side of gpumem's inputs (issue 15).

Takes real inputs (Hugging Face config.json files: the built-in presets and
any --seed-dir; Megatron argument sets; DeepSpeed estimator options), changes
one to three values each (huge, negative, zero, fractional, string, null,
list or object values, deleted keys), runs build/gpumem on each with a time
limit, and reports every run that breaks the input contract
(docs/limits.md): an exit other than 0 (an answer) or 2 (an input error), a
signal, a time-out, or an answer that prints a negative or saturated byte
count. Deterministic: the same --seed and --count give the same inputs.

Usage (from the repository root, after building):
  python3 fuzz/mutate_configs.py [--count 1500] [--seed 15] [--kinds hf,megatron,deepspeed]
                                 [--seed-dir DIR ...] [--gpumem build/gpumem] [--timeout 30]
                                 [--jobs 2] [--keep DIR]
Exit status 1 when any run broke the contract (each is listed with its
command and the mutation), else 0.
"""
import argparse
import concurrent.futures
import copy
import glob
import json
import os
import random
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INT64_MAX = 2**63 - 1

# Values a mutation puts in place of a number (or anything else).
HUGE = [10**9, 2**31, 2**32 + 3, 2**53 + 1, 10**15, 10**18, INT64_MAX, 2**64, 10**30]
SMALL = [0, -1, -2, -(10**9), -(2**63), -(2**64)]
FLOATS = [0.5, 1.5, 2.000001, -0.5, 1e30, -1e30, 1e308, 4.9e-324]
OTHERS = ["abc", "", "12", "1e9", None, True, False, [], [1, 2], {}, {"a": 1}]

# Megatron argument sets: the shapes the tests use (GPT-3 1.3B, a MoE, MLA,
# GQA, interleaved pipeline).
MEGATRON_SEEDS = [
    {"num_layers": 24, "hidden_size": 2048, "num_attention_heads": 16, "vocab_size": 50257, "seq_length": 2048,
     "micro_batch_size": 4, "tensor_model_parallel_size": 2, "world_size": 8},
    {"num_layers": 32, "hidden_size": 4096, "ffn_hidden_size": 14336, "num_attention_heads": 32, "group_query_attention": True,
     "num_query_groups": 8, "padded_vocab_size": 32000, "seq_length": 4096, "micro_batch_size": 1, "swiglu": True,
     "normalization": "RMSNorm", "num_experts": 8, "moe_router_topk": 2, "moe_ffn_hidden_size": 14336,
     "expert_model_parallel_size": 8, "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 4,
     "world_size": 64, "sequence_parallel": True, "recompute_granularity": "selective", "use_distributed_optimizer": True,
     "untie_embeddings_and_output_weights": True, "disable_bias_linear": True, "global_batch_size": 256},
    {"num_layers": 61, "hidden_size": 7168, "ffn_hidden_size": 18432, "num_attention_heads": 128, "padded_vocab_size": 129280,
     "seq_length": 4096, "micro_batch_size": 1, "swiglu": True, "normalization": "RMSNorm", "multi_latent_attention": True,
     "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_head_dim": 128, "qk_pos_emb_head_dim": 64, "v_head_dim": 128,
     "num_experts": 256, "moe_router_topk": 8, "moe_ffn_hidden_size": 2048, "moe_shared_expert_intermediate_size": 2048,
     "moe_layer_freq": "[0]*3+[1]*58", "mtp_num_layers": 1, "expert_model_parallel_size": 64, "pipeline_model_parallel_size": 16,
     "tensor_model_parallel_size": 1, "world_size": 1024, "num_layers_per_virtual_pipeline_stage": 1,
     "account_for_embedding_in_pipeline_split": True, "account_for_loss_in_pipeline_split": True,
     "use_distributed_optimizer": True, "untie_embeddings_and_output_weights": True},
    {"num_layers": 96, "hidden_size": 12288, "num_attention_heads": 96, "vocab_size": 50257, "seq_length": 2048,
     "micro_batch_size": 1, "tensor_model_parallel_size": 8, "pipeline_model_parallel_size": 8, "context_parallel_size": 2,
     "data_parallel_size": 16, "num_microbatches": 64, "virtual_pipeline_model_parallel_size": 2,
     "recompute_granularity": "full", "kv_channels": 128, "make_vocab_size_divisible_by": 128},
]

# DeepSpeed estimator options (gpumem compat deepspeed): --params /
# --largest-layer-params / --gpus-per-node / --nodes / --buffer-factor.
DEEPSPEED_SEEDS = [
    {"params": 2783959040, "largest-layer-params": 65798144, "stage": 3, "gpus-per-node": 8, "nodes": 1, "buffer-factor": 1.5},
    {"params": "7B", "stage": 2, "gpus-per-node": 8, "nodes": 4},
]


def numeric_paths(obj, prefix=()):
    """Every path to a leaf (numbers first in importance: they are most of a config)."""
    out = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.append(prefix + (k,))
            if isinstance(v, (dict, list)):
                out.extend(numeric_paths(v, prefix + (k,)))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:8]):
            out.append(prefix + (i,))
            if isinstance(v, (dict, list)):
                out.extend(numeric_paths(v, prefix + (i,)))
    return out


def get_at(obj, path):
    for p in path:
        obj = obj[p]
    return obj


def new_value(rng, old):
    pool = rng.random()
    if isinstance(old, (int, float)) and not isinstance(old, bool):
        if pool < 0.35:
            return rng.choice(HUGE)
        if pool < 0.6:
            return rng.choice(SMALL)
        if pool < 0.8:
            return rng.choice(FLOATS) if rng.random() < 0.7 else float(old) + 0.5
        if pool < 0.9:
            return str(old)
        return rng.choice(OTHERS)
    return rng.choice(HUGE + SMALL + FLOATS + OTHERS)


def mutate(rng, doc, prefer_numbers=True):
    """One to three mutations; returns the new document and what was done."""
    doc = copy.deepcopy(doc)
    done = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        paths = numeric_paths(doc)
        if not paths:
            break
        nums = [p for p in paths if isinstance(get_at(doc, p), (int, float)) and not isinstance(get_at(doc, p), bool)]
        path = rng.choice(nums if nums and prefer_numbers and rng.random() < 0.85 else paths)
        parent = get_at(doc, path[:-1])
        key = path[-1]
        if rng.random() < 0.12 and isinstance(parent, dict):
            del parent[key]
            done.append(f"del {'.'.join(map(str, path))}")
        else:
            v = new_value(rng, parent[key])
            parent[key] = v
            done.append(f"{'.'.join(map(str, path))}={json.dumps(v)}")
    return doc, "; ".join(done)


def hf_seeds(dirs):
    files = []
    for d in dirs:
        files.extend(sorted(glob.glob(os.path.join(d, "*.json"))))
    seeds = []
    for f in files:
        try:
            with open(f) as fh:
                j = json.load(fh)
        except (OSError, ValueError):
            continue
        if isinstance(j, dict) and ("model_type" in j or "architectures" in j):
            seeds.append((os.path.basename(f), j))
    return seeds


BAD_NUMBER = re.compile(r"-9223372036854775808|9223372036854775807|\binf\b|\bnan\b", re.I)


def bad_numbers(stdout):
    """Negative byte counts or saturated / non-finite numbers in an answer."""
    problems = []
    if BAD_NUMBER.search(stdout):
        problems.append("saturated or non-finite number in output")
    try:
        j = json.loads(stdout)
    except ValueError:
        return problems

    def walk(v, key):
        if isinstance(v, dict):
            for k, x in v.items():
                walk(x, k)
        elif isinstance(v, list):
            for x in v:
                walk(x, key)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            k = str(key).lower()
            sized = any(w in k for w in ("bytes", "total", "memory", "peak", "reserved", "allocated", "capacity", "_mb", "params"))
            signed = any(w in k for w in ("delta", "saving", "headroom", "free", "margin", "diff", "change", "error", "residual", "slack"))
            if sized and not signed and v < 0:
                problems.append(f"negative {key} = {v}")

    walk(j, "")
    return problems[:3]


def run_case(gpumem, args, timeout):
    try:
        p = subprocess.run([gpumem, *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", "", ""
    return p.returncode, p.stdout, p.stderr


def cases(opts):
    """(kind, label, document, mutation, argv-builder) in a fixed order."""
    rng = random.Random(opts.seed)
    kinds = opts.kinds.split(",")
    hf = hf_seeds([os.path.join(ROOT, "data/presets/configs"), os.path.join(ROOT, "tests/fixtures/configs")] + opts.seed_dir)
    out = []
    for i in range(opts.count):
        kind = kinds[i % len(kinds)]
        if kind == "hf":
            name, seed = hf[rng.randrange(len(hf))]
            doc, what = mutate(rng, seed)
            cmd = rng.choice([["estimate", "{file}", "--format", "json"], ["estimate", "{file}", "--analytic", "--format", "json"],
                              ["params", "{file}", "--format", "json"], ["estimate", "{file}", "--mode", "infer", "--gen-len", "16", "--format", "json"],
                              ["serving", "{file}", "--format", "json"], ["fit", "{file}", "--analytic", "--format", "json"]])
            out.append((kind, name, doc, what, cmd))
        elif kind == "megatron":
            k = rng.randrange(len(MEGATRON_SEEDS))
            doc, what = mutate(rng, MEGATRON_SEEDS[k])
            out.append((kind, f"megatron-{k}", doc, what, ["compat", "megatron", "{file}", "--format", "json"]))
        elif kind == "deepspeed":
            if rng.random() < 0.5 and hf:
                name, seed = hf[rng.randrange(len(hf))]
                doc, what = mutate(rng, seed)
                stage = rng.choice(["2", "3"])
                out.append((kind, name, doc, what, ["compat", "deepspeed", "{file}", "--stage", stage, "--format", "json"]))
            else:
                k = rng.randrange(len(DEEPSPEED_SEEDS))
                doc, what = mutate(rng, DEEPSPEED_SEEDS[k])
                argv = ["compat", "deepspeed", "--format", "json"]
                for key, v in doc.items():
                    argv += [f"--{key}", v if isinstance(v, str) else json.dumps(v)]
                out.append((kind, f"deepspeed-{k}", None, what, argv))
        else:
            sys.exit(f"unknown kind {kind} (hf, megatron, deepspeed)")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=1500)
    ap.add_argument("--seed", type=int, default=15)
    ap.add_argument("--kinds", default="hf,megatron,deepspeed")
    ap.add_argument("--seed-dir", action="append", default=[], help="more HF config.json files (e.g. the ground-truth configs)")
    ap.add_argument("--gpumem", default=os.path.join(ROOT, "build/gpumem"))
    ap.add_argument("--timeout", type=float, default=30)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--keep", help="write each failing input here")
    opts = ap.parse_args()
    if opts.count > 100000:
        sys.exit("--count is limited to 100000")
    todo = cases(opts)
    failures = []
    with tempfile.TemporaryDirectory() as tmp:

        def one(idx):
            kind, label, doc, what, argv = todo[idx]
            path = os.path.join(tmp, f"case{idx}.json")
            if doc is not None:
                with open(path, "w") as fh:
                    json.dump(doc, fh)
            args = [a.replace("{file}", path) if isinstance(a, str) else a for a in argv]
            rc, so, se = run_case(opts.gpumem, args, opts.timeout)
            why = []
            if rc == "timeout":
                why.append(f"no answer within {opts.timeout:g} s")
            elif rc < 0:
                why.append(f"signal {-rc}")
            elif rc not in (0, 2):
                why.append(f"exit {rc}: {se.strip()[:200]}")
            elif rc == 0:
                why.extend(bad_numbers(so))
            elif rc == 2 and (not se.startswith("gpumem: error: ") or se.count("\n") > 1):
                why.append(f"error not one line: {se.strip()[:200]}")
            if not why:
                return None
            kept = ""
            if opts.keep and doc is not None:
                os.makedirs(opts.keep, exist_ok=True)
                kept = os.path.join(opts.keep, f"{kind}-{idx}.json")
                with open(kept, "w") as fh:
                    json.dump(doc, fh)
            return idx, kind, label, what, " ".join(map(str, argv)), "; ".join(why), kept

        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, opts.jobs)) as ex:
            for r in ex.map(one, range(len(todo))):
                if r:
                    failures.append(r)
    for idx, kind, label, what, argv, why, kept in failures:
        print(f"#{idx} {kind} {label} [{what}] gpumem {argv}: {why}" + (f" (input: {kept})" if kept else ""))
    print(f"{len(todo)} runs, {len(failures)} broke the contract")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
