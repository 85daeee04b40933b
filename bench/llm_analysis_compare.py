#!/usr/bin/env python3
"""Side by side with llm-analysis (github.com/cli99/llm-analysis, Python) on
one fixed grid of 192 training configurations: the time each tool takes and
how far apart their memory answers are.

Usage:
  python3 bench/llm_analysis_compare.py [--gpumem build/gpumem]
      [--llm-analysis-src DIR] [--repeat 3] [--json] [--save FILE]

DIR is a checkout of llm-analysis (the folder that holds llm_analysis/); it
also comes from the environment variable LLM_ANALYSIS_SRC. Without it the
script prints "skipped: ..." and exits 0. llm-analysis is imported from DIR
as it is (nothing installed); it imports `fire` only for its command line, so
a stand-in module is used where fire is not installed.

The grid: 4 Llama models (the gpumem presets llama-2-7b, llama-2-13b,
llama-2-70b, llama-3-8b; llm-analysis gets a ModelConfig built from the same
preset config.json, since its own Llama configs differ from the released
models) x micro-batch 1, 2, 4, 8 x sequence 1024, 2048, 4096 x 4 layouts on 8
H100-80GB GPUs: DeepSpeed ZeRO-1, ZeRO-2, ZeRO-3 over 8 data-parallel ranks,
and ZeRO-1 with tensor parallelism 4 (sequence parallel on) over 2. Both tools
are told bf16 weights, fp32 master weights and Adam, flash attention, no
recomputation, no gradient accumulation (gpumem: --framework deepspeed, which
is that recipe).

Timed, each as the median over --repeat passes over the whole grid:
  llm-analysis   LLMAnalysis(...).training(...) per configuration, in process
  gpumem CLI     one `gpumem estimate ... --analytic --format json` process
                 per configuration (wall time of the process)
  gpumem Python  gpumem.estimate(..., analytic=True) per configuration, in
                 process (the bindings next to the binary: build/python)
  gpumem Python, simulated: the same without analytic (one step replayed
                 through the allocator model), for reference
and the ratio llm-analysis time / gpumem time. Memory: the median relative
difference (llm-analysis - gpumem) / gpumem of the parts both tools estimate
(weights, gradients, optimizer states incl. fp32 master weights, activations,
and llm-analysis's estimated peak against gpumem's peak allocated), from the
analytic estimate. Nothing here changes either tool.

--save FILE writes the results as JSON to FILE as well (the README's paragraph
is rendered from bench/results/llm_analysis.json by scripts/update-readme.py).
"""
import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import time
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MODELS = ["llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b"]
BATCHES = [1, 2, 4, 8]
SEQS = [1024, 2048, 4096]
GPUS = 8
# (name, ZeRO stage, tensor-parallel size); data parallel = GPUS / tp.
LAYOUTS = [("zero1", 1, 1), ("zero2", 2, 1), ("zero3", 3, 1), ("tp4-zero1", 1, 4)]
GPUMEM_GPU = "H100-80GB"
LLMA_GPU = "h100-sxm-80gb"
# (label, llm-analysis summary key, gpumem per_gpu key)
PARTS = [
    ("weights", "weight_memory_per_gpu", "weights"),
    ("gradients", "gradient_memory_per_gpu", "gradients"),
    ("optimizer states", "optimizer_state_memory_per_gpu", "optimizer_states"),
    ("activations", "activation_memory_per_gpu", "activations"),
    ("peak", "estimated_peak_memory_per_gpu", "peak_allocated"),
]


def grid():
    """The 192 configurations, in a fixed order."""
    out = []
    for model in MODELS:
        for name, zero, tp in LAYOUTS:
            for seq in SEQS:
                for batch in BATCHES:
                    out.append({"model": model, "layout": name, "zero": zero, "tp": tp,
                                "seq": seq, "batch": batch})
    return out


def gpumem_args(c):
    a = [c["model"], "--framework", "deepspeed", "--gpu", GPUMEM_GPU, "--gpus", str(GPUS),
         "--zero", str(c["zero"]), "--batch", str(c["batch"]), "--seq", str(c["seq"])]
    if c["tp"] > 1:
        a += ["--tp", str(c["tp"]), "--sp"]
    return a


def gpumem_kwargs(c):
    kw = {"framework": "deepspeed", "gpu": GPUMEM_GPU, "gpus": GPUS, "zero": c["zero"],
          "batch": c["batch"], "seq": c["seq"]}
    if c["tp"] > 1:
        kw.update(tp=c["tp"], sp=True)
    return kw


def load_llm_analysis(src):
    """Imports llm_analysis from src; returns the module objects needed."""
    try:
        import fire  # noqa: F401
    except ImportError:
        # llm-analysis calls fire.Fire only in its __main__ entry points.
        sys.modules["fire"] = types.ModuleType("fire")
        sys.modules["fire"].Fire = lambda *a, **k: None
    sys.path.insert(0, src)
    from llm_analysis.logger import logger
    logger.setLevel(logging.CRITICAL)  # no log output (gpumem prints nothing either)
    from llm_analysis import analysis, config
    return analysis, config


def llma_model_config(config, model):
    """llm-analysis's ModelConfig from the gpumem preset's Hugging Face config."""
    with open(os.path.join(ROOT, "data", "presets", "configs", model + ".json")) as f:
        hf = json.load(f)
    return config.ModelConfig(
        name=model, num_layers=hf["num_hidden_layers"], n_head=hf["num_attention_heads"],
        hidden_dim=hf["hidden_size"], vocab_size=hf["vocab_size"],
        max_seq_len=hf["max_position_embeddings"],
        num_key_value_heads=hf.get("num_key_value_heads", hf["num_attention_heads"]),
        ffn_embed_dim=hf["intermediate_size"], model_type="llama", mlp_gated_linear_units=True)


def run_llma(analysis, config, configs, model_cfgs):
    gpu = config.get_gpu_config_by_name(LLMA_GPU)
    dtype = config.get_dtype_config_by_name("w16a16e16")
    out = []
    for c in configs:
        par = config.ParallelismConfig(tp_size=c["tp"], dp_size=GPUS // c["tp"])
        a = analysis.LLMAnalysis(model_cfgs[c["model"]], gpu, dtype, par)
        out.append(a.training(batch_size_per_gpu=c["batch"], gradient_accumulation_steps=1,
                              seq_len=c["seq"], ds_zero=analysis.DSZeRO(c["zero"]),
                              activation_recomputation=analysis.ActivationRecomputation.NONE,
                              flash_attn=True))
    return out


def run_cli(binary, configs):
    out, times = [], []
    for c in configs:
        cmd = [binary, "estimate"] + gpumem_args(c) + ["--analytic", "--format", "json"]
        t0 = time.perf_counter()
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        times.append(time.perf_counter() - t0)
        if p.returncode != 0:
            raise SystemExit(f"gpumem failed on {' '.join(cmd[1:])}: {p.stderr.strip()}")
        out.append(json.loads(p.stdout))
    return out, times


def run_py(gpumem, configs, analytic):
    return [gpumem.estimate(c["model"], analytic=analytic, **gpumem_kwargs(c))["per_gpu"].to_dict()
            for c in configs]


def run_sweep(gpumem, configs):
    """One gpumem.sweep call per (model, layout) over all batches x seqs;
    returns peak allocated bytes in grid order."""
    peaks = {}
    for model in MODELS:
        for name, zero, tp in LAYOUTS:
            c = next(c for c in configs if c["model"] == model and c["layout"] == name)
            kw = gpumem_kwargs(c)
            del kw["batch"], kw["seq"]
            s = gpumem.sweep(model, batches=BATCHES, seqs=SEQS, analytic=True, **kw)
            for p in s["points"]:
                peaks[(model, name, p["seq"], p["batch"])] = p["peak_allocated"]
    return [peaks[(c["model"], c["layout"], c["seq"], c["batch"])] for c in configs]


def timed(fn, repeat):
    """(last result, median total seconds over repeat passes)."""
    totals, res = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        res = fn()
        totals.append(time.perf_counter() - t0)
    return res, statistics.median(totals)


def commit_of(src):
    env = os.environ.get("LLM_ANALYSIS_COMMIT")
    if env:
        return env
    try:
        p = subprocess.run(["git", "-C", src, "rev-parse", "HEAD"], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True)
        if p.returncode == 0:
            return p.stdout.strip()
    except OSError:
        pass
    return "unknown (set LLM_ANALYSIS_COMMIT)"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpumem", default=os.path.join(ROOT, "build", "gpumem"), help="the gpumem binary")
    ap.add_argument("--python", default=None,
                    help="folder holding the gpumem Python package (default: python/ next to the binary)")
    ap.add_argument("--llm-analysis-src", default=os.environ.get("LLM_ANALYSIS_SRC"),
                    help="llm-analysis checkout (default: $LLM_ANALYSIS_SRC)")
    ap.add_argument("--repeat", type=int, default=3, help="passes over the grid per tool (median)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--save", default=None, help="also write the results as JSON to this file")
    args = ap.parse_args()

    src = args.llm_analysis_src
    if not src or not os.path.isfile(os.path.join(src, "llm_analysis", "analysis.py")):
        print(f"skipped: llm-analysis source not found (give --llm-analysis-src DIR or LLM_ANALYSIS_SRC; got {src!r})")
        return 0
    if not os.access(args.gpumem, os.X_OK):
        print(f"error: --gpumem: {args.gpumem} is not an executable gpumem binary", file=sys.stderr)
        return 2
    if args.repeat < 1:
        print("error: --repeat: must be at least 1", file=sys.stderr)
        return 2

    configs = grid()
    n = len(configs)
    assert n == 192, n

    t0 = time.perf_counter()
    analysis, config = load_llm_analysis(os.path.abspath(src))
    llma_import = time.perf_counter() - t0
    model_cfgs = {m: llma_model_config(config, m) for m in MODELS}

    llma, llma_t = timed(lambda: run_llma(analysis, config, configs, model_cfgs), args.repeat)

    cli_totals, cli, cli_per = [], None, []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        cli, per = run_cli(args.gpumem, configs)
        cli_totals.append(time.perf_counter() - t0)
        cli_per.extend(per)
    cli_t = statistics.median(cli_totals)
    # The cost of starting any process the same way, for scale.
    true_per = []
    for _ in configs:
        t0 = time.perf_counter()
        subprocess.run(["true"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        true_per.append(time.perf_counter() - t0)

    rows = [("llm-analysis (in process)", llma_t)]
    rows.append(("gpumem CLI, one process per config, --analytic", cli_t))
    py_dir = args.python or os.path.join(os.path.dirname(os.path.abspath(args.gpumem)), "python")
    py = py_sim = None
    try:
        sys.path.insert(0, py_dir)
        t0 = time.perf_counter()
        import gpumem
        gpumem_import = time.perf_counter() - t0
        py, py_t = timed(lambda: run_py(gpumem, configs, True), args.repeat)
        sweep, sweep_t = timed(lambda: run_sweep(gpumem, configs), args.repeat)
        _, sim_t = timed(lambda: run_py(gpumem, configs, False), 1)
        rows.append(("gpumem Python estimate() per config, analytic", py_t))
        rows.append(("gpumem Python sweep() per model x layout, analytic", sweep_t))
        rows.append(("gpumem Python estimate(), simulated step (1 pass)", sim_t))
    except ImportError as e:
        gpumem_import = None
        print(f"note: gpumem Python bindings not found in {py_dir} ({e}); in-process rows skipped")
    if py is not None and py != [r["per_gpu"] for r in cli]:
        raise SystemExit("gpumem CLI and Python estimate() disagree on the grid")
    if py is not None and sweep != [r["per_gpu"]["peak_allocated"] for r in cli]:
        raise SystemExit("gpumem estimate and sweep disagree on the grid")

    # Memory: relative difference (llm-analysis - gpumem) / gpumem per part.
    diffs = {}
    for label, lk, gk in PARTS:
        d = [(float(l[lk]) - g["per_gpu"][gk]) / g["per_gpu"][gk] for l, g in zip(llma, cli) if g["per_gpu"][gk] > 0]
        diffs[label] = {"n": len(d), "median": statistics.median(d),
                        "median_abs": statistics.median(abs(x) for x in d)}
    params = {}
    for m in MODELS:
        i = next(i for i, c in enumerate(configs) if c["model"] == m)
        params[m] = {"llm_analysis": llma[i]["num_params_total"], "gpumem": cli[i]["params"]["total"]}

    result = {
        "configs": n, "repeat": args.repeat, "llm_analysis_commit": commit_of(src),
        "llm_analysis_import_s": llma_import, "gpumem_import_s": gpumem_import,
        "times": [{"tool": name, "total_s": t, "per_config_us": t / n * 1e6, "llm_analysis_over_this": llma_t / t}
                  for name, t in rows],
        "cli_median_per_call_ms": statistics.median(cli_per) * 1e3,
        "true_median_per_call_ms": statistics.median(true_per) * 1e3,
        "memory_rel_diff": diffs, "params": params,
    }
    if args.save:
        with open(args.save, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{n} training configurations ({len(MODELS)} models x {len(BATCHES)} micro-batches x "
          f"{len(SEQS)} sequence lengths x {len(LAYOUTS)} layouts on {GPUS} GPUs), median of {args.repeat} passes")
    print(f"llm-analysis commit {result['llm_analysis_commit']}; import {llma_import * 1e3:.0f} ms"
          + (f", gpumem import {gpumem_import * 1e3:.0f} ms" if gpumem_import is not None else ""))
    print()
    print(f"{'tool':<48} {'total':>10} {'per config':>12} {'llm-analysis / this':>20}")
    for r in result["times"]:
        print(f"{r['tool']:<48} {r['total_s'] * 1e3:>8.1f} ms {r['per_config_us']:>9.1f} us {r['llm_analysis_over_this']:>19.2f}x")
    print(f"(gpumem CLI: median {result['cli_median_per_call_ms']:.2f} ms per process; "
          f"`true` started the same way: {result['true_median_per_call_ms']:.2f} ms)")
    print()
    print("memory per GPU, (llm-analysis - gpumem) / gpumem over the grid:")
    print(f"{'part':<18} {'median':>9} {'median |diff|':>14}")
    for label, d in diffs.items():
        print(f"{label:<18} {d['median'] * 100:>+8.1f}% {d['median_abs'] * 100:>13.1f}%")
    print()
    print("parameters: " + ", ".join(f"{m} llm-analysis {p['llm_analysis'] / 1e9:.2f}B / gpumem {p['gpumem'] / 1e9:.2f}B"
                                     for m, p in params.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
