#!/usr/bin/env python3
"""For a GPU machine with torch (any version >= 1.13): meta trace (gtrace, CUDA dropout semantics)
vs the bytes a real CUDA forward saves (saved_tensors_hooks, dedup by untyped storage data_ptr).
Needs gtrace.py and models.py beside it. Prints one line per model; exit 0 if all equal
(the SDPA model is reported, not required to match: meta runs the math backend)."""
import sys, warnings
warnings.filterwarnings("ignore")
import torch
import gtrace
from models import TinyCNN, TinyGPT, TinyViT
print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.version.cuda)
dev = "cuda" if torch.cuda.is_available() else "cpu"
B, S, V = 2, 16, 64
cases = [("gpt2", lambda: TinyGPT(vocab=V), lambda: (torch.randint(0, V, (B, S)),) * 2),
         ("cnn", TinyCNN, lambda: (torch.randn(B, 3, 16, 16), torch.randint(0, 10, (B,)))),
         ("vit", TinyViT, lambda: (torch.randn(B, 3, 16, 16), torch.randint(0, 10, (B,))))]
if hasattr(torch.nn.functional, "scaled_dot_product_attention"):
    cases.append(("gpt2-sdpa", lambda: TinyGPT(vocab=V, sdpa=True), lambda: (torch.randint(0, V, (B, S)),) * 2))
ok = True
for name, mk, mi in cases:
    inputs = mi()
    meta_b, meta_n = gtrace.saved_bytes(gtrace.trace(mk, inputs, cuda_semantics=True))
    model = mk().to(dev)
    real_b, real_n, _ = gtrace.cpu_saved_bytes(model, tuple(x.to(dev) for x in inputs), cuda_semantics=(dev == "cpu"))
    same = (meta_b, meta_n) == (real_b, real_n)
    if not name.endswith("sdpa"):
        ok &= same
    print("%-10s meta %8d B / %3d storages   %s %8d B / %3d storages   %s" % (name, meta_b, meta_n, dev, real_b, real_n,
                                                                          "EQUAL" if same else "DIFFERENT"))
    if name.endswith("sdpa") and dev == "cuda":
        tr = gtrace.trace(model, tuple(x.to(dev) for x in inputs), device=None, cuda_semantics=False)
        print("  cuda aten ops:", sorted({op["op"] for op in tr.aten_ops if "attention" in op["op"]}))
sys.exit(0 if ok else 1)
