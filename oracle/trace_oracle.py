#!/usr/bin/python3
"""Traced model graphs and their CPU ground truth (issue 14).

For each model below this script
  1. traces it on the meta device with gpumem.trace (bindings/python/gpumem/tracer.py)
     and writes the model graph to tests/fixtures/traced/<name>.json;
  2. runs the real model on the CPU (torch 1.13, fp32) at a few (batch, seq) points and
     records, independently of the tracer:
       * saved_bytes: every tensor autograd packs (saved_tensors_hooks), deduplicated by
         storage, parameters and buffers left out (the activations oracle's rule);
       * two training steps under the profiler (step_oracle.py's method: [memory] events
         in time order, AdamW with foreach=False): peak live bytes, after forward and
         after backward; and the peak without the scratch buffers CPU convolution kernels
         make and free inside one convolution call, forward or backward (a GPU runs cuDNN
         there);
       * parameter counts (trainable, all) and buffer bytes.
     into tests/fixtures/traced/oracle.json.
Dropout runs CUDA's fused kernel semantics (torch.native_dropout, a bool mask) in both the
trace and the CPU run, as the other oracles do.

The models: the GPT-2 and LLaMA replicas of activations_oracle.py (HF's code, eager
attention, the transformers >= 4.46 "pad" loss), torchvision's resnet18 and
VisionTransformer (small shapes), a small CNN with BatchNorm and Dropout, and a small UNet
(conv blocks, max-pool down, transposed-conv up, skip concatenation).

Regenerate (needs Debian's python3-torch and python3-torchvision; ~1 min on 2 cores):
    /usr/bin/python3 oracle/trace_oracle.py                       # torch 1.13 (bookworm)
    python3 oracle/trace_oracle.py --out tests/fixtures/traced-torch2  # torch 2.x (Debian trixie: 2.6)
Both sets are committed and tests/trace_test.cpp checks each. torch 1.13 keeps the input
of mean.dim (RMSNorm's x^2), torch >= 2.0 does not (derivatives.yaml mean.dim: self_sym_sizes
only); saved_bytes_1_13_only is those bytes where the run kept them, 0 on torch 2.x.
Deterministic output (sorted keys).
"""
import argparse
import importlib.util
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import activations_oracle as A  # noqa: E402
import step_oracle as S  # noqa: E402

_spec = importlib.util.spec_from_file_location("gpumem_trace", os.path.join(ROOT, "bindings", "python", "gpumem", "tracer.py"))
T = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(T)

OUT_DIR = os.path.join(ROOT, "tests", "fixtures", "traced")
TORCH_1 = int(torch.__version__.split(".")[0]) < 2  # torch 1.x keeps mean.dim's input


class TinyCNN(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.drop = nn.Dropout(0.2)
        self.fc = nn.Linear(16, classes)

    def forward(self, x, y):
        return F.cross_entropy(self.fc(self.drop(torch.flatten(self.features(x), 1))), y)


def conv_block(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                         nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class TinyUNet(nn.Module):
    """Two levels down, one bottleneck, two up with skip concatenation; per-pixel classes."""

    def __init__(self, cin=3, classes=4, w=8):
        super().__init__()
        self.down1, self.down2 = conv_block(cin, w), conv_block(w, 2 * w)
        self.pool = nn.MaxPool2d(2)
        self.mid = conv_block(2 * w, 4 * w)
        self.up2, self.dec2 = nn.ConvTranspose2d(4 * w, 2 * w, 2, stride=2), conv_block(4 * w, 2 * w)
        self.up1, self.dec1 = nn.ConvTranspose2d(2 * w, w, 2, stride=2), conv_block(2 * w, w)
        self.out = nn.Conv2d(w, classes, 1)

    def forward(self, x, y):
        d1 = self.down1(x)
        d2 = self.down2(self.pool(d1))
        m = self.mid(self.pool(d2))
        u2 = self.dec2(torch.cat([self.up2(m), d2], dim=1))
        u1 = self.dec1(torch.cat([self.up1(u2), d1], dim=1))
        logits = self.out(u1)  # per-pixel classes; rows of [b*h*w, classes] (1.13 has no meta nll_loss2d)
        return F.cross_entropy(logits.permute(0, 2, 3, 1).reshape(-1, logits.shape[1]), y.reshape(-1))


class Classify(nn.Module):
    """A torchvision classifier with its loss: forward(images, labels) -> loss."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x, y):
        return F.cross_entropy(self.net(x), y)


def resnet18():
    import torchvision
    return Classify(torchvision.models.resnet18(num_classes=10))


# torch 2.x runs nn.MultiheadAttention through F.scaled_dot_product_attention, which the trace
# records as the fused kernel a GPU runs (flash / memory-efficient, dropout included). On the
# CPU, torch 2.6 takes its fused flash kernel only without dropout (math path otherwise, which
# keeps the [s, s] probabilities), so the torch 2.x oracle runs the ViT without attention
# dropout: the CPU then keeps what the GPU keeps. torch 1.13 has no SDPA (math path both sides).
VIT_ATTENTION_DROPOUT = 0.1 if TORCH_1 else 0.0


def vit():
    from torchvision.models.vision_transformer import VisionTransformer
    return Classify(VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32,
                                      mlp_dim=64, dropout=0.1, attention_dropout=VIT_ATTENTION_DROPOUT, num_classes=10))


GPT2_CFG = A.gpt2_config(64, 2, 1000, loss_impl="pad")
LLAMA_CFG = A.llama_config(64, 2, 1000, 2, 172, loss_impl="pad")


def lm_inputs(vocab):
    def make(b, s, device="meta"):
        ids = torch.randint(0, vocab, (b, s), dtype=torch.long, device=device) if device != "meta" else \
            torch.empty(b, s, dtype=torch.long, device="meta")
        return (ids, ids)  # HF convention: labels = input_ids (shifted inside the loss)
    return make


def image_inputs(c, hw, classes, per_pixel=False):
    def make(b, s=0, device="meta"):
        x = torch.randn(b, c, hw, hw, device=device) if device != "meta" else torch.empty(b, c, hw, hw, device="meta")
        shape = (b, hw, hw) if per_pixel else (b,)
        y = torch.randint(0, classes, shape, device=device) if device != "meta" else \
            torch.empty(shape, dtype=torch.long, device="meta")
        return (x, y)
    return make


# name, factory, inputs(b, s, device), has_seq, CPU points, notes
MODELS = [
    ("gpt2-replica", lambda: A.GPT2LMHeadModel(GPT2_CFG), lm_inputs(1000), True, [(2, 32), (4, 64), (3, 48)],
     "oracle/activations_oracle.py GPT2LMHeadModel, h64 L2 V1000, eager, pad loss", {"family": "gpt2", "config": GPT2_CFG}),
    ("llama-replica", lambda: A.LlamaForCausalLM(LLAMA_CFG), lm_inputs(1000), True, [(2, 32), (4, 64), (3, 48)],
     "oracle/activations_oracle.py LlamaForCausalLM, h64 kv2 L2 V1000, eager, pad loss", {"family": "llama", "config": LLAMA_CFG}),
    ("resnet18", resnet18, image_inputs(3, 32, 10), False, [(2, 0), (4, 0)], "torchvision resnet18, 10 classes, 3x32x32", None),
    ("tiny-cnn", TinyCNN, image_inputs(3, 16, 10), False, [(2, 0), (8, 0)], "Conv/BatchNorm/ReLU/MaxPool/Dropout/Linear, 3x16x16", None),
    ("vit-tiny", vit, image_inputs(3, 32, 10), False, [(2, 0), (4, 0)],
     "torchvision VisionTransformer, 32x32, patch 8, 2 layers, 2 heads, hidden 32, mlp 64, dropout 0.1, "
     "attention dropout %g" % VIT_ATTENTION_DROPOUT, None),
    ("unet-tiny", TinyUNet, image_inputs(3, 32, 4, per_pixel=True), False, [(2, 0), (4, 0)],
     "UNet: 2 levels, width 8, transposed-conv up, skip concat, per-pixel cross-entropy, 3x32x32", None),
]


def cpu_saved_bytes(model, args):
    excl = {A.storage_key(p) for p in model.parameters()} | {A.storage_key(x) for x in model.buffers()}
    packed = []

    def pack(t):
        packed.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), T._cuda_dropout(torch):
        loss = model(*args)
    seen = {}
    for t in packed:
        if t.dtype == torch.float64 and t.dim() == 0:
            continue  # a Python number wrapped as a CPU scalar: host memory on CUDA
        k = A.storage_key(t)
        if k not in excl:
            seen.setdefault(k, A.storage_nbytes(t))
    del loss
    return sum(seen.values())


def peak_without_cpu_conv_scratch(prof, start):
    """The step's peak live bytes without the scratch buffers CPU kernels allocate and
    free inside one aten::convolution(_backward) call (im2col columns, layout reorders)
    or one native_batch_norm_backward call (a second input-sized temporary): a GPU runs
    cuDNN there, which writes the gradient directly and whose workspace gpumem counts
    apart. Allocations are paired with their frees by address."""
    kr = prof.profiler.kineto_results
    ev = []

    def walk(e, conv):
        ef = e.extra_fields
        if isinstance(ef, torch._C._profiler._ExtraFields_Allocation):
            ev.append((e.start_time_ns, len(ev), int(ef.alloc_size), int(ef.ptr), conv))
            return
        if conv is None and e.name in ("aten::convolution", "aten::convolution_backward", "aten::native_batch_norm_backward"):
            conv = (e.start_time_ns, e.start_tid)
        for c in e.children:
            walk(c, conv)

    for root in kr.experimental_event_tree():
        walk(root, None)
    ev.sort()
    open_alloc, drop = {}, set()
    for i, (_, _, delta, ptr, conv) in enumerate(ev):
        if delta > 0:
            open_alloc[ptr] = i
        elif ptr in open_alloc:
            j = open_alloc.pop(ptr)
            if conv is not None and ev[j][4] == conv:
                drop.update((i, j))
    live = peak = start
    for i, (_, _, delta, _, _) in enumerate(ev):
        if i not in drop:
            live += delta
            peak = max(peak, live)
    return peak


def cpu_steps(model, args):
    """Two AdamW(foreach=False) steps under the profiler: live bytes from params + inputs."""
    params = S.unique_params(model)
    param_bytes = sum(A.storage_nbytes(p) for p in params)
    seen_inputs = {}
    for x in args:
        seen_inputs.setdefault(A.storage_key(x), A.storage_nbytes(x))
    input_bytes = sum(seen_inputs.values())
    opt = torch.optim.AdamW(model.parameters(), lr=S.LR, foreach=False)
    start = param_bytes + input_bytes
    steps = []
    for _ in (1, 2):
        with S.new_profile() as prof, T._cuda_dropout(torch):
            with S.Phase("forward"):
                loss = model(*args)
            with S.Phase("backward"):
                loss.backward()
            with S.Phase("optimizer"):
                opt.step()
            with S.Phase("zero_grad"):
                opt.zero_grad(set_to_none=True)
            with S.Phase("release"):
                del loss
        summ = S.summarize(S.alloc_events(prof), start)
        steps.append({k: summ[k] for k in ("peak_bytes", "peak_phase", "after_forward", "after_backward",
                                           "start_bytes", "after_release")})
        steps[-1]["peak_bytes_without_cpu_conv_scratch"] = peak_without_cpu_conv_scratch(prof, start)
        start = summ["after_release"]
    return param_bytes, input_bytes, steps


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="one model name")
    ap.add_argument("--out", default=OUT_DIR, help="output folder (default tests/fixtures/traced)")
    ns = ap.parse_args()
    out_dir = os.path.abspath(ns.out)
    rel_dir = os.path.relpath(out_dir, ROOT).replace(os.sep, "/")
    os.makedirs(out_dir, exist_ok=True)
    torch.set_num_threads(2)
    out = {"generator": "oracle/trace_oracle.py", "torch_version": torch.__version__, "models": []}
    for name, factory, inputs, has_seq, points, desc, hf in MODELS:
        if ns.only and name != ns.only:
            continue
        graph = T.trace(factory, inputs, name=name, has_sequence=has_seq)
        with open(os.path.join(out_dir, name + ".json"), "w") as f:
            json.dump(graph, f, indent=1)
            f.write("\n")
        torch.manual_seed(A.SEED)
        model = factory()
        model.train()
        trainable = sum(p.numel() for p in S.unique_params(model) if p.requires_grad)
        total = sum(p.numel() for p in S.unique_params(model))
        buffer_bytes = sum(A.storage_nbytes(x) for x in model.buffers())
        rec = {"name": name, "graph": "%s/%s.json" % (rel_dir, name), "description": desc,
               "has_sequence": has_seq, "trainable_params": trainable, "params": total, "buffer_bytes": buffer_bytes,
               "points": []}
        if hf:
            rec["hf_family"], rec["hf_config"] = hf["family"], hf["config"]
        for b, s in points:
            torch.manual_seed(A.SEED)
            model = factory()
            model.train()
            args = inputs(b, s, device="cpu")
            saved = cpu_saved_bytes(model, args)
            pb, ib, steps = cpu_steps(model, args)
            mean_saves = 0
            if hf and hf["family"] == "llama" and TORCH_1:
                c = hf["config"]  # torch 1.13's mean.dim input saves (RMSNorm), gone in torch >= 2.0
                mean_saves = (2 * c["layers"] + 1) * b * s * c["hidden"] * 4
            rec["points"].append({"batch": b, "seq": s, "saved_bytes": saved, "saved_bytes_1_13_only": mean_saves,
                                  "param_bytes": pb, "input_bytes": ib, "step1": steps[0], "step2": steps[1]})
        if hf and hf["family"] == "llama":
            # pure bfloat16 (model.to(bfloat16)): what a 16-bit run keeps, explicit fp32 upcasts included
            rec["bf16_points"] = []
            for b, s in [(2, 256), (2, 1024), (8, 1024)]:
                torch.manual_seed(A.SEED)
                model = factory().to(torch.bfloat16)
                model.train()
                args = inputs(b, s, device="cpu")
                pb, ib, steps = cpu_steps(model, args)
                c = hf["config"]  # 1.13's mean.dim input saves, of the fp32 upcast x^2 (RMSNorm computes in fp32)
                rec["bf16_points"].append({"batch": b, "seq": s, "saved_bytes_1_13_only": (2 * c["layers"] + 1) * b * s * c["hidden"] * 4 if TORCH_1 else 0,
                                           "param_bytes": pb, "input_bytes": ib, "step1": steps[0], "step2": steps[1]})
        out["models"].append(rec)
        print("%-14s %2d blocks, %9d params; CPU saved at %s: %s" % (
            name, len(graph["blocks"]), total, [(p["batch"], p["seq"]) for p in rec["points"]],
            [p["saved_bytes"] for p in rec["points"]]), file=sys.stderr)
    if not ns.only:
        with open(os.path.join(out_dir, "oracle.json"), "w") as f:
            json.dump(out, f, indent=1, sort_keys=True)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
