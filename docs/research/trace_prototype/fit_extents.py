#!/usr/bin/python3
"""Symbolic sizes from several meta traces: every storage's element count as
b*(c0 + c1*s + c2*s^2) (gpumem's Extent), or, for tensors that do not grow with the batch
(position ids [1, s], a causal-mask slice [1, 1, s, s], scalars), d0 + d1*s + d2*s^2.

Traces at (b, s) = (2, 8), (2, 16), (2, 32) give three equations per tensor; (3, 24) and (4, 12)
check them. The op sequence must be the same in every trace (shape-dependent control flow is
an error). b = 1 is avoided: x[..., 1:].contiguous() of a [1, s] tensor is already contiguous
and makes no copy, so the tensor list differs from b > 1.
"""
import sys
import warnings
from fractions import Fraction

import torch

warnings.filterwarnings("ignore")
torch.set_num_threads(1)

import gtrace  # noqa: E402
from models import TinyCNN, TinyGPT  # noqa: E402

FIT = [(2, 8), (2, 16), (2, 32)]
CHECK = [(3, 24), (4, 12)]


def solve3(pts):
    """Quadratic through three (x, y) points, exact rationals: (c0, c1, c2)."""
    (x0, y0), (x1, y1), (x2, y2) = [(Fraction(x), Fraction(y)) for x, y in pts]
    # Lagrange -> coefficients
    c = [Fraction(0)] * 3
    for xi, yi, xj, xk in ((x0, y0, x1, x2), (x1, y1, x0, x2), (x2, y2, x0, x1)):
        den = (xi - xj) * (xi - xk)
        c[2] += yi / den
        c[1] += -yi * (xj + xk) / den
        c[0] += yi * xj * xk / den
    return c


def numel(t):
    n = 1
    for d in t["shape"]:
        n *= d
    return n


def fit(make_model, make_inputs, has_seq=True):
    traces = {}
    for b, s in FIT + CHECK:
        traces[(b, s)] = gtrace.trace(make_model, make_inputs(b, s))
    ref = traces[FIT[0]]
    sig = [op["op"] for op in ref.aten_ops]
    for k, tr in traces.items():
        if [op["op"] for op in tr.aten_ops] != sig or len(tr.tensors) != len(ref.tensors):
            raise RuntimeError("op sequence differs at b,s=%s: shape-dependent control flow" % (k,))
    rows = []
    for tid, t in enumerate(ref.tensors):
        if t["kind"] in ("param", "buffer") or t["base"] != tid:
            continue  # only storage roots; views share their base's storage
        ns = {k: traces[k].tensors[tid]["storage_nbytes"] // max(1, torch.empty(0, dtype=getattr(torch, t["dtype"])).element_size())
              for k in traces}
        per_b = solve3([(s, Fraction(ns[(b, s)], b)) for b, s in FIT])
        kind = None
        if all(c.denominator == 1 for c in per_b) and all(
                b * (per_b[0] + per_b[1] * s + per_b[2] * s * s) == ns[(b, s)] for b, s in CHECK):
            kind, coef = "b*", per_b
        else:
            flat = solve3([(s, ns[(b, s)]) for b, s in FIT])
            if all(c.denominator == 1 for c in flat) and all(
                    flat[0] + flat[1] * s + flat[2] * s * s == ns[(b, s)] for b, s in CHECK):
                kind, coef = "1*", flat
        rows.append((tid, t, kind, coef if kind else None, ns))
    return ref, rows


def show(name, ref, rows):
    print("\n== %s: storage roots and their element counts ==" % name)
    saved_roots = {ref.tensors[tid]["base"] for tid, _ in ref.saved}
    for tid, t, kind, coef, ns in rows:
        if kind is None:
            expr = "NOT POLYNOMIAL " + str({k: v for k, v in ns.items()})
        else:
            terms = []
            for c, sym in zip(coef, ("", "s", "s^2")):
                if c:
                    terms.append("%d%s" % (c, ("*" + sym) if sym else ""))
            expr = ("b*(" if kind == "b*" else "(") + (" + ".join(terms) or "0") + ")"
        print("  t%-4d %-18s %-9s %-6s %s %s" % (tid, (t["module"] or "<root>")[:18], t["dtype"], t["kind"], expr,
                                             " SAVED" if tid in saved_roots else ""))


def main():
    V = 64
    ref, rows = fit(lambda: TinyGPT(vocab=V),
                    lambda b, s: (torch.randint(0, V, (b, s)), torch.randint(0, V, (b, s))))
    show("TinyGPT", ref, rows)
    bad = [r for r in rows if r[2] is None]
    ref2, rows2 = fit(TinyCNN, lambda b, s: (torch.randn(b, 3, 16, 16), torch.randint(0, 10, (b,))))
    show("TinyCNN (s unused: every extent must be c0 only)", ref2, rows2)
    print("\nnon-polynomial storages:", len(bad) + sum(1 for r in rows2 if r[2] is None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
