#!/usr/bin/env python3
"""Regenerates the README's generated blocks from the real binary so the docs
cannot drift: the example output, the accuracy table, the published-throughput
comparison (scripts/update-throughput.py) and the benchmark table.

Usage: python3 scripts/update-readme.py [--build build] [--no-bench] [--check]

The benchmark table and issue 16's targets come from bench/results/gpumem_bench.json,
which a run without --no-bench rewrites (build/bench/gpumem_bench, medians of 3);
the llm-analysis paragraph comes from bench/results/llm_analysis.json, which
`bench/llm_analysis_compare.py --save` writes (it needs a checkout of llm-analysis).
--check only compares those two blocks with what the two files give (no binary
is run) and names each block that differs (exit 1): numbers edited by hand, or
results rewritten without the README.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMELINE = ["estimate", "llama-3.2-1b", "--batch", "4", "--seq", "2048", "--gpu", "A100-40GB"]
EXAMPLE = ["estimate", "llama-3-8b", "--mode", "train", "--batch", "4", "--seq", "4096", "--gpu", "A100-80GB"]


def block_span(text, name):
    b, e = f"<!-- {name}:begin -->\n", f"<!-- {name}:end -->"
    return text.index(b) + len(b), text.index(e)


def replace_block(text, name, body):
    i, j = block_span(text, name)
    return text[:i] + body + text[j:]

BENCH_RESULTS = os.path.join(ROOT, "bench/results/gpumem_bench.json")
LLMA_RESULTS = os.path.join(ROOT, "bench/results/llm_analysis.json")
# Google Benchmark's own fields; every other key of a result is a counter.
BENCH_FIELDS = {"name", "family_index", "per_family_instance_index", "run_name", "run_type", "repetitions",
                "repetition_index", "threads", "aggregate_name", "aggregate_unit", "iterations", "real_time",
                "cpu_time", "time_unit", "label", "error_occurred", "error_message"}
UNIT_S = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def run_bench(binary):
    """Runs every benchmark (medians of 3) and keeps what the README shows in BENCH_RESULTS:
    names, real time (what the console's first column shows) and counters, no machine paths."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bench.json")
        subprocess.run([binary, "--benchmark_repetitions=3", "--benchmark_report_aggregates_only=true",
                        "--benchmark_out=" + out, "--benchmark_out_format=json"], capture_output=True, text=True, check=True)
        raw = json.load(open(out))
    rows = []
    for b in raw["benchmarks"]:
        if b.get("aggregate_name") != "median":
            continue
        name = re.sub(r"/(iterations:\d+|real_time)", "", b["run_name"])
        rows.append({"name": name, "time": b["real_time"], "unit": b["time_unit"],
                     "counters": {k: v for k, v in b.items() if k not in BENCH_FIELDS}})
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    # Only what the benchmark binary is built from counts (not, say, this README).
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "src", "include", "apps", "bench",
                            "CMakeLists.txt", "cmake", ":!bench/results", ":!bench/*.py"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    os.makedirs(os.path.dirname(BENCH_RESULTS), exist_ok=True)
    with open(BENCH_RESULTS, "w") as f:
        json.dump({"written_by": "scripts/update-readme.py", "built_from": commit + (" with uncommitted changes" if dirty else ""),
                   "statistic": "median of 3 repetitions, real time", "benchmarks": rows}, f, indent=1)
        f.write("\n")


def fmt_time(v):
    # As Google Benchmark's console prints a time: 3 significant digits (none after the point from 100 on).
    return f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 100 else f"{v:.0f}"


def fmt_counter(k, v):
    # As the console prints a counter: 6 significant digits with k/M/G/T (base 1000); rates with /s.
    prefix = ""
    for p in ("k", "M", "G", "T"):
        if abs(v) < 1000:
            break
        v /= 1000
        prefix = p
    rate = k.endswith("_per_second") or k.endswith("_per_s")
    return f"{k}={v:.6g}{prefix}" + ("/s" if rate else "")


def bench_seconds(by, name):
    b = by[name]
    return b["time"] * UNIT_S[b["unit"]]


# Issue 16's targets: (what, how it is read from the run, limit, <= or >=, unit shown).
TARGETS = [
    ("one CLI call, `gpumem estimate llama-3-8b --analytic`, within 2x of `/bin/true`",
     lambda by: by["BM_CliStartup"]["counters"]["analytic_x"], 2.0, "<=", "x"),
    ("one CLI call, `gpumem estimate llama-3-8b` (simulated step), within 4x of `/bin/true`",
     lambda by: by["BM_CliStartup"]["counters"]["simulated_x"], 4.0, "<=", "x"),
    ("estimate, Llama-3-70B, in process", lambda by: bench_seconds(by, "BM_Estimate70BTrain") * 1e6, 5.0, "<=", "us"),
    ("estimate, Llama-3.1-405B on 16,384 GPUs, in process",
     lambda by: bench_seconds(by, "BM_Estimate405B16kGpus") * 1e6, 20.0, "<=", "us"),
    ("the planner's analytic scorer, layouts per second on one core",
     lambda by: by["BM_ScorerLayouts"]["counters"]["items_per_second"] / 1e6, 5.0, ">=", "M/s"),
    ("`plan llama-3-70b --gpus 64`, simulator confirmation included",
     lambda by: bench_seconds(by, "BM_PlanCli70B64Gpus"), 0.2, "<=", "s"),
    ("`plan llama-3.1-405b --gpus 16384`, simulator confirmation included",
     lambda by: bench_seconds(by, "BM_Plan405B16kGpus"), 1.0, "<=", "s"),
    ("10M-event snapshot, pickle: time", lambda by: bench_seconds(by, "BM_Snapshot10MPickle"), 2.0, "<=", "s"),
    ("10M-event snapshot, pickle: peak RSS",
     lambda by: by["BM_Snapshot10MPickle"]["counters"]["max_rss"] / 2**30, 1.0, "<=", "GiB"),
    ("10M-event snapshot, JSON: time", lambda by: bench_seconds(by, "BM_Snapshot10MJson"), 2.0, "<=", "s"),
    ("10M-event snapshot, JSON: peak RSS",
     lambda by: by["BM_Snapshot10MJson"]["counters"]["max_rss"] / 2**30, 1.0, "<=", "GiB"),
    ("simulation flat in repeated layers: 160 / 32 layers",
     lambda by: bench_seconds(by, "BM_SimLayers/160") / bench_seconds(by, "BM_SimLayers/32"), 1.2, "<=", "x"),
    ("simulation flat in grad-accum, one GPU: 256 / 1 micro-batches",
     lambda by: bench_seconds(by, "BM_SimGradAccum/256") / bench_seconds(by, "BM_SimGradAccum/1"), 1.2, "<=", "x"),
    ("simulation flat in grad-accum, pp 4: 256 / 4 micro-batches",
     lambda by: bench_seconds(by, "BM_SimGradAccumPp4/256") / bench_seconds(by, "BM_SimGradAccumPp4/4"), 1.2, "<=", "x"),
    ("simulation flat in decode length: 8,192 / 128 tokens",
     lambda by: bench_seconds(by, "BM_SimDecode/8192") / bench_seconds(by, "BM_SimDecode/128"), 1.2, "<=", "x"),
]


def render_bench(data):
    by = {b["name"]: b for b in data["benchmarks"]}
    rows = ["| benchmark | median time | counters |", "|---|---:|---|"]
    for b in data["benchmarks"]:
        counters = " ".join(fmt_counter(k, v) for k, v in sorted(b["counters"].items()))
        rows.append(f"| {b['name']} | {fmt_time(b['time'])} {b['unit']} | {counters} |")
    targets = ["| target (issue 16) | limit | this run | met |", "|---|---:|---:|---|"]
    for what, get, limit, op, unit in TARGETS:
        try:
            v = get(by)
        except KeyError:
            targets.append(f"| {what} | {op} {limit:g} {unit} | not in this run | |")
            continue
        met = v <= limit if op == "<=" else v >= limit
        shown, limit_shown = (f"{v:.2f}x", f"{limit:g}x") if unit == "x" else (f"{v:.3g} {unit}", f"{limit:g} {unit}")
        targets.append(f"| {what} | {op} {limit_shown} | {shown} | {'yes' if met else '**no**'} |")
    return ("Measured with `build/bench/gpumem_bench` (Google Benchmark, Release build, 2-core development machine, one run "
            f"of the build from `{data['built_from']}`, {data['statistic']}; counters ending in _x are ratios to `/bin/true` "
            "started the same way; the numbers are kept in `bench/results/gpumem_bench.json`, which "
            "`scripts/update-readme.py` rewrites). Earlier targets: a 70B step simulated under 5 ms (`BM_SimulateStep70B`), "
            "1,000,000 allocator events replayed under 1 s (`BM_Replay1M*`). `BM_PlanSearch` reports exact layout estimates "
            "per second on one thread. The CLI ratios move by up to 20% from one run to the next with how fast `/bin/true` "
            "starts in that run and how the binary's file sits in the page cache (same bytes, same page faults): compare two "
            "builds side by side (`farm-bench --vs`), not across tables.\n\n" + "\n".join(rows) + "\n\n"
            "Issue 16's targets, read from the same run (a simulation is counted flat when the long case takes at most "
            "1.2x the short one; the service's target is the load test's, above):\n\n" + "\n".join(targets) + "\n")


# Why llm-analysis's parts differ from gpumem's (the sign of each difference,
# found by reading llm_analysis/analysis.py at the commit the results name).
LLMA_CAUSES = {
    "weights": "llm-analysis counts the output layer as tied to the embedding",
    "optimizer states": "the same untied output layer",
    "gradients": "llm-analysis keeps them in the master weights' fp32; DeepSpeed's bf16 run keeps bf16 gradients",
    "peak": "llm-analysis's peak is weights + optimizer states + max(activations, gradients) + a prefetch/loss term, "
            "without the logits, temporaries and buffers that gpumem's phases count",
}


def render_llm_analysis(r):
    t = {x["tool"]: x for x in r["times"]}
    llma = t["llm-analysis (in process)"]
    cli = t["gpumem CLI, one process per config, --analytic"]
    py = t.get("gpumem Python estimate() per config, analytic")
    sweep = t.get("gpumem Python sweep() per model x layout, analytic")
    sim = t.get("gpumem Python estimate(), simulated step (1 pass)")
    parts = []
    for label, d in r["memory_rel_diff"].items():
        cause = LLMA_CAUSES.get(label)
        parts.append(f"{label} {d['median'] * 100:+.1f}%" + (f" ({cause})" if cause else ""))
    text = (f"Side by side with [llm-analysis](https://github.com/cli99/llm-analysis) (Python, commit `{r['llm_analysis_commit']}`) on "
            f"{r['configs']} training configurations: Llama-2 7B/13B/70B and Llama-3-8B, micro-batches 1 to 8, sequences of 1,024 "
            "to 4,096 tokens, DeepSpeed ZeRO-1/2/3 over 8 H100s and tensor parallel 4 with ZeRO-1 (`bench/llm_analysis_compare.py`; "
            f"medians of {r['repeat']} passes on the 2-core machine, all in one run; the numbers are kept in "
            "`bench/results/llm_analysis.json`). "
            f"llm-analysis took {llma['total_s'] * 1e3:.0f} ms in process ({llma['per_config_us']:.0f} us per configuration).")
    if py:
        text += (f" gpumem's analytic estimate took {py['total_s'] * 1e3:.0f} ms through `gpumem.estimate()` "
                 f"({py['per_config_us']:.0f} us a call, {py['llm_analysis_over_this']:.1f}x llm-analysis's speed: each call parses "
                 "the request and builds the full answer as Python objects)")
        if sweep:
            text += (f", {sweep['total_s'] * 1e3:.1f} ms through `gpumem.sweep()`, one call per model and layout "
                     f"({sweep['llm_analysis_over_this']:.1f}x)")
        text += ", and"
    else:
        text += " gpumem's analytic estimate took"
    text += (f" {cli['total_s'] * 1e3:.0f} ms as one `gpumem estimate --analytic` process per configuration "
             f"({cli['llm_analysis_over_this']:.2f}x; {r['cli_median_per_call_ms']:.1f} ms a process, where starting `true` "
             f"the same way takes {r['true_median_per_call_ms']:.1f} ms).")
    if sim:
        text += (" The step simulation, which llm-analysis has no counterpart for, took "
                 f"{sim['per_config_us'] / 1e3:.1f} ms per configuration.")
    text += (" Memory answers, (llm-analysis - gpumem) / gpumem, median over the grid: " + "; ".join(parts) + ". "
             "Reproduce with a checkout of llm-analysis in DIR (imported from there, nothing installed; its command-line-only "
             "`fire` import gets a stand-in where fire is missing): "
             "`python3 bench/llm_analysis_compare.py --gpumem build/gpumem --llm-analysis-src DIR` (or `LLM_ANALYSIS_SRC=DIR`; "
             "`--save bench/results/llm_analysis.json` keeps the results for the README); without DIR it prints `skipped: ...`.")
    # Wrapped as the README's prose is (lines of at most 120 characters).
    lines, line = [], ""
    for w in text.split(" "):
        if line and len(line) + 1 + len(w) > 120:
            lines.append(line)
            line = w
        else:
            line = f"{line} {w}" if line else w
    lines.append(line)
    return "\n".join(lines) + "\n"


RESULT_BLOCKS = [("bench", BENCH_RESULTS, render_bench), ("llm-analysis", LLMA_RESULTS, render_llm_analysis)]


def check():
    text = open(os.path.join(ROOT, "README.md")).read()
    stale = 0
    for name, path, render in RESULT_BLOCKS:
        i, j = block_span(text, name)
        if text[i:j] != render(json.load(open(path))):
            print(f"README.md: the {name} block is not what {os.path.relpath(path, ROOT)} gives: "
                  "run python3 scripts/update-readme.py --no-bench")
            stale += 1
    return 1 if stale else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    if a.check:
        return check()
    gpumem = os.path.join(a.build, "gpumem")
    path = os.path.join(ROOT, "README.md")
    text = open(path).read()
    out = subprocess.run([gpumem, *EXAMPLE], capture_output=True, text=True, check=True).stdout
    subprocess.run([gpumem, *TIMELINE, "--timeline", os.path.join(ROOT, "docs/timeline-example.svg")],
                   capture_output=True, text=True, check=True)
    text = replace_block(text, "example", "```\n$ gpumem " + " ".join(EXAMPLE) + "\n" + out + "```\n\n"
                         "The simulated memory timeline of `gpumem " + " ".join(TIMELINE) +
                         " --timeline docs/timeline-example.svg`:\n\n![memory timeline](docs/timeline-example.svg)\n")
    acc = subprocess.run(["python3", os.path.join(ROOT, "scripts/accuracy.py"), "--gpumem", gpumem, "--section", "classic"],
                         capture_output=True, text=True, check=True).stdout
    text = replace_block(text, "accuracy", acc)
    if "<!-- serving-accuracy:begin -->\n" in text and "<!-- serving-accuracy:end -->" in text:
        sv = subprocess.run(["python3", os.path.join(ROOT, "scripts/serving_accuracy.py"), "--gpumem", gpumem],
                            capture_output=True, text=True, check=True).stdout
        text = replace_block(text, "serving-accuracy", sv + "\nPer-log results and commands: `python3 scripts/serving_accuracy.py --rows`.\n")
    if "<!-- framework-accuracy:begin -->\n" in text and "<!-- framework-accuracy:end -->" in text:
        fw = subprocess.run(["python3", os.path.join(ROOT, "scripts/accuracy.py"), "--gpumem", gpumem, "--section",
                             "frameworks"], capture_output=True, text=True, check=True).stdout
        body = fw.split("\n", 2)[2] if fw.startswith("## ") else fw
        # The summary table only; the per-row table is the script's own output.
        summary = body.split("\n| measurement |", 1)[0].rstrip("\n") + "\n"
        text = replace_block(text, "framework-accuracy", summary + "\nPer-row results, commands and causes: `python3 scripts/accuracy.py --section frameworks`.\n")
    open(path, "w").write(text)
    subprocess.run(["python3", os.path.join(ROOT, "scripts/update-throughput.py"), "--build", a.build], check=True,
                   capture_output=True, text=True)
    text = open(path).read()
    if not a.no_bench:
        run_bench(os.path.join(a.build, "bench/gpumem_bench"))
    for name, results, render in RESULT_BLOCKS:
        text = replace_block(text, name, render(json.load(open(results))))
    open(path, "w").write(text)


if __name__ == "__main__":
    sys.exit(main())
