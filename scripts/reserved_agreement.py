#!/usr/bin/env python3
# How far the analytic reserved peak (`gpumem estimate --analytic`) is from
# the simulated one (`gpumem estimate`, the caching-allocator replay) over a
# fixed draw of 70 jobs: 9 models, train / LoRA / QLoRA, every cross-entropy
# kernel, three recompute settings, one GPU, tp 2, pp 4 and ZeRO-2. The
# analytic reserved peak is a stand-in (docs/assumptions.md, "peaks"); this
# prints its error distribution, and with two binaries the jobs whose error
# changed between them.
# Usage: python3 scripts/reserved_agreement.py BIN [BIN_BEFORE]
import json
import random
import statistics
import subprocess
import sys

MODELS = ["gpt2", "qwen2-0.5b", "llama-3.2-1b", "tinyllama-1.1b", "phi-2", "llama-3-8b", "smollm2-135m", "opt-125m", "gemma-2b"]


def jobs():
    rng = random.Random(7)
    out = []
    for _ in range(70):
        m, mode = rng.choice(MODELS), rng.choice(["train", "lora", "qlora"])
        ce = rng.choice(["full", "fused", "chunked", "fused-linear"])
        b, s = rng.choice([1, 2, 4]), rng.choice([512, 1024, 2048, 4096])
        rc = rng.choice(["none", "full", "selective"])
        extra = rng.choice(["", "", "--gpus 4 --pp 4", "--gpus 2 --tp 2", "--gpus 4 --zero 2"])
        out.append(f"{m} --mode {mode} --batch {b} --seq {s} --cross-entropy {ce} --recompute {rc} {extra} --gpu-memory 1024TiB".split())
    return out


def reserved(binary, args):
    r = subprocess.run([binary, "estimate", *args, "--format", "json"], capture_output=True, text=True)
    return None if r.returncode else json.loads(r.stdout)["per_gpu"]["peak_reserved"]


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__ or "usage: reserved_agreement.py BIN [BIN_BEFORE]")
    binaries = sys.argv[1:]
    errors = {b: [] for b in binaries}
    for args in jobs():
        sim = reserved(binaries[0], args)
        ana = [reserved(b, args + ["--analytic"]) for b in binaries]
        if sim is None or None in ana:
            continue
        e = [(a - sim) / sim * 100 for a in ana]
        for b, x in zip(binaries, e):
            errors[b].append(x)
        if len(e) == 2 and abs(e[0] - e[1]) > 0.05:
            print(f"{' '.join(args):<110} before {e[1]:+6.1f}%  now {e[0]:+6.1f}%")
    for b, e in errors.items():
        print(f"{'now' if b == binaries[0] else 'before'}: {len(e)} jobs, median {statistics.median(e):+.1f}%, mean |error| "
              f"{statistics.mean(map(abs, e)):.1f}%, range {min(e):+.1f}% .. {max(e):+.1f}%, more than 3% under: {sum(x < -3 for x in e)}, "
              f"more than 10% over: {sum(x > 10 for x in e)}")


if __name__ == "__main__":
    main()
