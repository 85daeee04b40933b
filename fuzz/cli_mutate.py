#!/usr/bin/env python3
"""Mutation driver for the gpumem command line (issue 15: hostile and absurd input).

Generates command lines from the CLI's examples and mutates them: flag values
replaced by absurd ones (1e30, -1, 2^63, NaN, huge lists, long text), flags
added from each command's --help, model/file arguments replaced by mutated
input files (configs, layer lists, model graphs, snapshots, Megatron args,
OOM text from fuzz/corpus/) or by special files (a FIFO, /dev/zero, a folder,
a symlink loop, /dev/null, a missing file). Each case runs build/gpumem with
a time limit (--timeout, default 10 s) and an address-space limit of 1 GiB
(RLIMIT_AS), and must:
  * exit 0 or 2, never 3 (internal error) and never by a signal or the limit;
  * on exit 2, print exactly one error line ("gpumem: error: ...") on stderr
    (warning lines aside);
  * never print a negative byte count.
The cases depend only on --seed and --count (and the binary's --help), so a
run is repeatable; --max-time bounds the wall time (cases not started by then
are skipped and counted).

A failing case is written to fuzz/regressions/cli/<name>/ (case.json plus its
input files) with --save; --replay DIR reruns every saved case under DIR.

Usage: python3 fuzz/cli_mutate.py [--gpumem build/gpumem] [--seed 1]
           [--count 300] [--max-time 90] [--jobs 2] [--save]
       python3 fuzz/cli_mutate.py --replay fuzz/regressions/cli
"""
import argparse
import concurrent.futures
import hashlib
import json
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fuzz" / "corpus"
AS_LIMIT = 1 << 30  # bytes of address space per run

BASES = [
    "estimate llama-3-8b --batch 4 --seq 4096 --gpu H100-80GB",
    "estimate mixtral-8x7b --gpus 64 --tp 2 --pp 4 --ep 8 --distributed-optimizer",
    "estimate llama-3-8b --mode infer --batch 16 --seq 8192 --gen-len 512 --format json",
    "estimate gpt2 --batch 2 --seq 512 --format csv",
    "estimate {model} --batch 2 --seq 128",
    "params {model}",
    "fit {model} --gpu L4",
    "serving llama-3.1-8b --gpu H100-80GB --max-model-len 32768",
    "fit llama-3-8b --seq 4096 --gpu A100-80GB",
    "fit gpt2 --mode infer --gpu L4",
    "advise llama-2-13b --gpu RTX-4090-24GB --format markdown",
    "plan llama-3-70b --gpus 64 --gpu H100-80GB --seq 8192",
    "sweep gpt2 --batches 1,2,4 --seqs 512,1024",
    "doctor {oom} llama-3-8b --batch 8",
    "doctor {oom}",
    "params llama-3-8b --format csv",
    "snapshot {snapshot}",
    "compat deepspeed --params 2.78B --stage 3 --gpus-per-node 8",
    "compat deepspeed llama-3-8b --stage 2",
    "compat megatron {megatron}",
    "calibrate bert-large-uncased --gpu V100-16GB --seq 512 --batch 4 --attention eager --precision fp32 --measured-total 14949MiB",
    "timeline gpt2 --batch 1 --seq 256 --timeline {out}.csv",
]

ABSURD = [
    "1e30", "-1", "0", "-0", "9223372036854775807", "9223372036854775808", "18446744073709551616",
    "99999999999999999999999999", "NaN", "nan", "inf", "-inf", "1e-320", "1e308", "0x10", "", " ", "2^63",
    "1.5", "-5GiB", "1e308GiB", "999999999TiB", "1e30%", "-1%", "100%", "nanGiB", "7e18B", "1,2,,3",
    "-1,-2", "0,0,0", "a" * 5000, "é∂", "../../../etc/passwd", "--", "1e9", "2147483648", "4294967296",
    "1" * 400, "0.0000001", "1e30B", "1e30M", ",", "9.3e18", "-9223372036854775808",
]

SPECIALS = ["fifo", "zero", "folder", "loop", "null", "missing", "selfloop"]

FILE_KINDS = {  # placeholder -> corpus folders its mutated files come from
    "model": ["hf_config", "layer_list", "graph_json"],
    "snapshot": ["snapshot_pickle", "snapshot_json"],
    "megatron": ["megatron"],
    "oom": ["doctor"],
}


def limit_resources():
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def help_flags(gpumem, command):
    """The --flags a command's --help lists."""
    out = subprocess.run([gpumem] + command.split() + ["--help"], capture_output=True, text=True, timeout=30)
    flags = sorted(set(re.findall(r"(?<![\w-])--([a-z][a-z0-9-]+)", out.stdout)) - {"help", "version"})
    return flags


def seeds(kind):
    files = []
    for folder in FILE_KINDS[kind]:
        files += sorted((CORPUS / folder).glob("*"))
    return files


JSON_NUMBERS = ["1e30", "-1", "0", "9223372036854775808", "18446744073709551615", "1e308", "-1e308", "2.5",
                "1000000000", "4611686018427387904", "null", "\"12\"", "[]", "true"]


def mutate_bytes(rng, data):
    """One structural or byte-level change to an input file."""
    how = rng.randrange(8)
    text = data
    if how == 0 and text:  # replace a number by an absurd one
        nums = list(re.finditer(rb"-?\d+(\.\d+)?([eE][-+]?\d+)?", text))
        if nums:
            m = rng.choice(nums)
            return text[:m.start()] + rng.choice(JSON_NUMBERS).encode() + text[m.end():], "number"
    if how == 1 and text:  # truncate
        return text[:rng.randrange(len(text))], "truncate"
    if how == 2 and text:  # flip bytes
        b = bytearray(text)
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        return bytes(b), "flip"
    if how == 3:  # nest deeply
        n = rng.choice([100, 10000, 200000])
        return b"[" * n + text + b"]" * n, "nest%d" % n
    if how == 4 and text:  # delete a range
        a = rng.randrange(len(text))
        return text[:a] + text[a + rng.randint(1, 200):], "delete"
    if how == 5:  # repeat a chunk many times
        a = rng.randrange(max(1, len(text)))
        chunk = text[a:a + rng.randint(1, 64)] or b"1"
        return text[:a] + chunk * rng.choice([1000, 100000]) + text[a:], "repeat"
    if how == 6:  # every number absurd
        v = rng.choice(JSON_NUMBERS).encode()
        return re.sub(rb"\b\d+\b", v, text), "all-numbers"
    return text, "same"


def make_special(kind, d):
    p = d / ("special-" + kind)
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "zero":
        return "/dev/zero"
    elif kind == "null":
        return "/dev/null"
    elif kind == "folder":
        p.mkdir()
    elif kind == "loop":
        os.symlink(d / "special-loop-b", p)
        os.symlink(p, d / "special-loop-b")
    elif kind == "selfloop":
        os.symlink(p, p)
    elif kind == "missing":
        pass
    return str(p)


def build_case(rng, gpumem, flags_of, index):
    """A case: argv with placeholders, files to write, specials, stdin."""
    base = rng.choice(BASES)
    words = base.split()
    command = " ".join(words[:2]) if words[0] == "compat" else words[0]
    files, specials, notes = {}, {}, []
    stdin = None

    def file_for(kind):
        name = "input%d" % len(files)
        if rng.random() < 0.3:
            sp = rng.choice(SPECIALS)
            specials[name] = sp
            notes.append("%s=%s" % (kind, sp))
            return "{%s}" % name
        src = rng.choice(seeds(kind))
        data = src.read_bytes()
        for _ in range(rng.randint(0, 3)):
            data, how = mutate_bytes(rng, data)
            notes.append("%s:%s" % (src.name, how))
        ext = ".json" if kind in ("model", "megatron") else src.suffix or ".txt"
        if kind == "snapshot" and data[:1] != b"\x80":
            ext = src.suffix
        files[name + ext] = data
        return "{%s}" % (name + ext)

    argv = []
    for w in words:
        if w == "{model}":
            argv.append(file_for("model"))
        elif w == "{snapshot}":
            argv.append(file_for("snapshot"))
        elif w == "{megatron}":
            argv.append(file_for("megatron"))
        elif w == "{oom}":
            if rng.random() < 0.3:
                argv.append("-")
                stdin = rng.choice(["zero", "null", "file"])
                if stdin == "file":
                    src = rng.choice(seeds("oom"))
                    data, how = mutate_bytes(rng, src.read_bytes())
                    files["stdin.txt"] = data
                    stdin = "{stdin.txt}"
                notes.append("stdin=%s" % stdin)
            else:
                src = rng.choice(seeds("oom"))
                data, how = mutate_bytes(rng, src.read_bytes())
                # One argument is at most 128 KiB (MAX_ARG_STRLEN).
                argv.append(data[:100000].replace(b"\0", b" ").decode("utf-8", "replace"))
                notes.append("oom:%s" % how)
        elif w.startswith("{out}"):
            argv.append("{dir}/out" + w[5:])
        else:
            argv.append(w)

    flags = flags_of.get(command, [])
    # No flag change in a third of the cases, so that mutated files reach
    # their loaders rather than stopping at a flag's error.
    for _ in range(rng.choice([0, 0, 1, 1, 2, 3])):
        how = rng.randrange(5)
        value_positions = [i for i in range(1, len(argv)) if argv[i - 1].startswith("--") and not argv[i].startswith("--")]
        if how == 0 and value_positions:  # absurd value for an existing flag
            i = rng.choice(value_positions)
            argv[i] = rng.choice(ABSURD)
            notes.append("%s=absurd" % argv[i - 1])
        elif how in (1, 2) and flags:  # a flag from --help with an absurd value
            f = rng.choice(flags)
            v = rng.choice(ABSURD)
            if f in ("config", "calibration", "snapshot") and rng.random() < 0.7:
                v = file_for("model" if f == "config" else "snapshot" if f == "snapshot" else "model")
            if f in ("out", "plot", "timeline"):
                v = rng.choice(["{dir}/o.json", "{dir}/o.svg", "{dir}/o.csv", "{fifo}", "{dir}", "/dev/full"])
                if v == "{fifo}":
                    specials["fifo"] = "fifo"
            argv += ["--" + f, v]
            notes.append("--%s" % f)
        elif how == 3 and value_positions:  # a huge list
            i = rng.choice(value_positions)
            argv[i] = ",".join([rng.choice(["1", "4096", "-1", "1e30"])] * rng.choice([1000, 20000]))
            notes.append("%s=huge-list" % argv[i - 1])
        elif how == 4 and flags:  # the same flag many times
            f = rng.choice(flags)
            argv += ["--" + f, rng.choice(ABSURD)] * rng.choice([2, 50])
            notes.append("--%s repeated" % f)
    return {"argv": argv, "files": files, "specials": specials, "stdin": stdin, "notes": notes, "index": index}


def materialize(case, d):
    """Writes the case's files into d; returns (argv, stdin file object or None)."""
    subst = {"dir": str(d)}
    for name, data in case["files"].items():
        (d / name).write_bytes(data)
        subst[name] = str(d / name)
    for name, kind in case["specials"].items():
        subst[name] = make_special(kind, d)

    def sub(s):
        return re.sub(r"\{([\w.]+)\}", lambda m: subst.get(m.group(1), m.group(0)), s)

    argv = [sub(a) for a in case["argv"]]
    stdin = case.get("stdin")
    if stdin is None:
        return argv, subprocess.DEVNULL
    if stdin == "zero":
        return argv, open("/dev/zero", "rb")
    if stdin == "null":
        return argv, open("/dev/null", "rb")
    return argv, open(sub(stdin), "rb")


NEG_BYTES = re.compile(r"(?<![\w.])-\d[\d,]*(\.\d+)?\s*(B|bytes|KiB|MiB|GiB|TiB|PiB|KB|MB|GB|TB)\b")
NEG_JSON = re.compile(r'"[a-z_]*bytes[a-z_]*"\s*:\s*-\d')


def check(rc, out, err, timed_out):
    """The contract; returns the problem or None."""
    if timed_out:
        return "hang (no exit within the time limit)"
    if rc < 0:
        return "killed by signal %d" % -rc
    if rc == 3:
        return "internal error (exit 3)"
    if rc not in (0, 2):
        return "exit %d" % rc
    lines = [l for l in err.splitlines() if l.strip() and not l.startswith("gpumem: warning:")]
    if rc == 2:
        if len(lines) != 1 or not lines[0].startswith("gpumem: error:"):
            return "exit 2 without exactly one error line (%d lines)" % len(lines)
    m = NEG_BYTES.search(out) or NEG_JSON.search(out)
    if m:
        return "negative byte count printed: %r" % out[max(0, m.start() - 60):m.end() + 20]
    return None


def run_case(gpumem, case, timeout):
    with tempfile.TemporaryDirectory(prefix="gpumem-cli-") as tmp:
        d = Path(tmp)
        argv, stdin = materialize(case, d)
        env = dict(os.environ, HF_HUB_CACHE=str(d / "hub"), HOME=str(d))
        try:
            p = subprocess.Popen([gpumem] + argv, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 cwd=d, env=env, preexec_fn=limit_resources, start_new_session=True)
            timed_out = False
            try:
                out, err = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
                out, err = p.communicate()
                timed_out = True
        finally:
            if stdin not in (None, subprocess.DEVNULL):
                stdin.close()
        out = out.decode("utf-8", "replace")
        err = err.decode("utf-8", "replace")
        return check(p.returncode, out, err, timed_out), p.returncode, err.strip()[-400:]


def case_name(case):
    h = hashlib.sha1(json.dumps(case["argv"]).encode() + b"".join(case["files"].values())).hexdigest()[:10]
    return "case-%04d-%s" % (case["index"], h)


def save_case(case, problem, folder):
    d = folder / case_name(case)
    d.mkdir(parents=True, exist_ok=True)
    for name, data in case["files"].items():
        (d / name).write_bytes(data)
    meta = {k: case[k] for k in ("argv", "specials", "stdin", "notes")}
    meta["files"] = sorted(case["files"])
    meta["problem"] = problem
    (d / "case.json").write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n")
    return d


def load_case(d):
    meta = json.loads((d / "case.json").read_text())
    meta["files"] = {name: (d / name).read_bytes() for name in meta["files"]}
    meta["index"] = 0
    meta["notes"] = [d.name] + meta.get("notes", [])
    return meta


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpumem", default=str(ROOT / "build" / "gpumem"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=300)
    ap.add_argument("--max-time", type=float, default=90.0, help="seconds; cases not started by then are skipped")
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds per run")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--save", action="store_true", help="write failing cases to fuzz/regressions/cli/")
    ap.add_argument("--replay", type=Path, help="rerun the saved cases under this folder")
    args = ap.parse_args()
    gpumem = os.path.abspath(args.gpumem)
    if not os.access(gpumem, os.X_OK):
        print("cli_mutate: %s is not an executable (build gpumem first)" % gpumem, file=sys.stderr)
        return 1

    if args.replay:
        cases = [load_case(p.parent) for p in sorted(args.replay.glob("*/case.json"))]
    else:
        rng = random.Random(args.seed)
        commands = sorted({(" ".join(b.split()[:2]) if b.startswith("compat") else b.split()[0]) for b in BASES})
        flags_of = {c: help_flags(gpumem, c) for c in commands}
        cases = [build_case(rng, gpumem, flags_of, i) for i in range(args.count)]

    start = time.monotonic()
    failures, ran, skipped = [], 0, 0

    def one(case):
        if not args.replay and time.monotonic() - start > args.max_time:
            return case, "skipped", None, None
        return (case,) + run_case(gpumem, case, args.timeout)

    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for case, problem, rc, err in pool.map(one, cases):
            if problem == "skipped":
                skipped += 1
                continue
            ran += 1
            if problem:
                failures.append((case, problem, rc, err))
    for case, problem, rc, err in failures:
        where = ""
        if args.save and not args.replay:
            where = " -> %s" % save_case(case, problem, ROOT / "fuzz" / "regressions" / "cli").relative_to(ROOT)
        shown = " ".join(a if len(a) < 80 else a[:40] + "...(%d chars)" % len(a) for a in case["argv"])
        print("cli_mutate: FINDING %s: gpumem %s [%s] rc=%s%s\n    %s" %
              (problem, shown, "; ".join(case["notes"]), rc, where, err.replace("\n", "\n    ")), file=sys.stderr)
    print("cli_mutate: %d cases run, %d skipped (time limit), %d findings (%.0f s)" %
          (ran, skipped, len(failures), time.monotonic() - start), file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
