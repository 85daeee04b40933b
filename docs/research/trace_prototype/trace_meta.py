#!/usr/bin/python3
"""Trace a tiny GPT-2-style model on the meta device and compare the bytes autograd saves with a
real CPU run (saved_tensors_hooks, dedup by storage data_ptr).

    /usr/bin/python3 trace_meta.py            # GPT-2 table + comparisons for GPT/CNN/ViT
    /usr/bin/python3 trace_meta.py --quiet    # comparisons only
"""
import sys
import warnings

import torch

warnings.filterwarnings("ignore")
torch.set_num_threads(1)

import gtrace  # noqa: E402
from models import TinyCNN, TinyGPT, TinyViT  # noqa: E402


def fmt_shape(t):
    return "%s %s" % ("x".join(map(str, t["shape"])) or "scalar", t["dtype"])


def print_table(tr):
    print("%-4s %-22s %-34s %-26s %s" % ("#", "module", "aten op", "output", "storage"))
    for op in tr.aten_ops:
        for j, (tid, kind) in enumerate(zip(op["outputs"], op["kinds"])):
            t = tr.tensors[tid]
            extra = ""
            if kind in ("view", "inplace"):
                extra = " of t%d" % t["base"]
            if op["schema_alias"][j] != (kind != "new"):
                extra += "  (schema alias_info says %s)" % ("alias" if op["schema_alias"][j] else "new")
            print("%-4s %-22s %-34s %-26s %s%s" % (op["index"] if j == 0 else "", (op["module"] or "<root>")[:22] if j == 0 else "",
                                                   op["op"] if j == 0 else "", "t%d %s" % (tid, fmt_shape(t)), kind, extra))


def print_saved(tr):
    excl = {t["storage"] for t in tr.tensors if t["kind"] in ("param", "buffer")}
    seen = set()
    print("\nsaved for backward, by torch-level call (new storages only; params/buffers excluded):")
    for fo in tr.fn_ops:
        rows = []
        for tid in fo["saved"]:
            t = tr.tensors[tid]
            if t["storage"] in excl or t["storage"] in seen:
                continue
            seen.add(t["storage"])
            rows.append("t%d[%s]=%dB" % (t["base"], fmt_shape(tr.tensors[t["base"]]), t["storage_nbytes"]))
        if rows:
            print("  %-22s %-28s %s%s" % ((fo["module"] or "<root>")[:22], fo["fn"][:28], ", ".join(rows),
                                          "  [" + fo["rewritten"] + "]" if "rewritten" in fo else ""))


def compare(name, factory, make_inputs, cuda_semantics):
    torch.manual_seed(0)
    inputs = make_inputs()
    tr = gtrace.trace(factory, inputs, cuda_semantics=cuda_semantics)
    meta_b, meta_n = gtrace.saved_bytes(tr)
    torch.manual_seed(0)
    model = factory()
    cpu_b, cpu_n, loss = gtrace.cpu_saved_bytes(model, inputs, cuda_semantics=cuda_semantics)
    ok = meta_b == cpu_b and meta_n == cpu_n
    print("%-8s cuda_dropout=%-5s meta: %7d B in %3d storages   cpu: %7d B in %3d storages   %s   (aten ops %d, params %d)"
          % (name, cuda_semantics, meta_b, meta_n, cpu_b, cpu_n, "EQUAL" if ok else "DIFFERENT",
             len(tr.aten_ops), sum(1 for _ in tr.params)))
    return ok, tr


def main():
    quiet = "--quiet" in sys.argv
    B, S, V = 2, 16, 64
    gpt_inputs = lambda: (torch.randint(0, V, (B, S)), torch.randint(0, V, (B, S)))  # noqa: E731
    if not quiet:
        print("torch", torch.__version__)
        tr = gtrace.trace(lambda: TinyGPT(vocab=V), gpt_inputs())
        print_table(tr)
        print_saved(tr)
        print("\nparameters:", ", ".join("%s%s" % (p["name"], p["shape"]) for p in tr.params))
        print("buffers:", ", ".join("%s%s" % (b["name"], b["shape"]) for b in tr.buffers))
        print()
    all_ok = True
    cases = [
        ("gpt2", lambda: TinyGPT(vocab=V), gpt_inputs),
        ("gpt2-p0", lambda: TinyGPT(vocab=V, pdrop=0.0, tie=False), gpt_inputs),
        ("cnn", TinyCNN, lambda: (torch.randn(B, 3, 16, 16), torch.randint(0, 10, (B,)))),
        ("vit", TinyViT, lambda: (torch.randn(B, 3, 16, 16), torch.randint(0, 10, (B,)))),
    ]
    for cuda in (True, False):
        for name, f, mk in cases:
            ok, _ = compare(name, f, mk, cuda)
            all_ok &= ok
    # a built module (not a factory): .to('meta') must keep the tied lm_head/wte weight
    m = TinyGPT(vocab=V)
    tr = gtrace.trace(m, gpt_inputs())
    print("module path (.to('meta') + re-tie): params %d (factory: %d), saved %d B"
          % (len(tr.params), len(list(TinyGPT(vocab=V).parameters())), gtrace.saved_bytes(tr)[0]))
    print("ALL EQUAL" if all_ok else "MISMATCH")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
