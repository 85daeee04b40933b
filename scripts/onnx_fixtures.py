#!/usr/bin/python3
"""ONNX fixtures for gpumem's ONNX reader (tests/onnx_test.cpp) and their torch ground truth.

Regenerate (needs Debian's python3-torch 1.13 + python3-torchvision 0.14; no `onnx` package):

    /usr/bin/python3 scripts/onnx_fixtures.py            # writes tests/fixtures/onnx/*.onnx + expected.json

For every model it exports a training-mode graph (`<name>_train.onnx`: TrainingMode.TRAINING,
do_constant_folding=False: BatchNormalization training_mode=1, Dropout kept) and an eval graph
(`<name>_eval.onnx`: TrainingMode.PRESERVE on model.eval(), no constant folding, so no Conv-BN
fusion and every parameter keeps its name), with a symbolic batch (and sequence for the LMs) via
dynamic_axes. Float initializers larger than 256 bytes are then marked EXTERNAL and their data
dropped (a plain protobuf wire rewrite, below), so the files stay a few KB and the reader is
exercised on external data it must never open.

expected.json, per model:
  trainable / buffers: element counts of model.parameters() / model.buffers() (torch dedups tied weights);
  points: (batch, seq) and, per loss (sum, mean, cross-entropy), the CPU oracle's saved-tensor bytes of
  one fp32 training forward + that loss, measured as oracle/activations_oracle.py does: every tensor
  packed by saved_tensors_hooks, deduplicated by storage, parameter and buffer storages left out, nn.Dropout
  run as torch.native_dropout (CUDA's bool mask), and the storages that only MeanBackward1 keeps left out
  (a torch 1.13-only save; torch >= 2.0 keeps sizes only: `saved_bytes_modern_torch` there);
  eval: per point, the bytes of every module output of an eval no_grad forward (sum) and of the largest one:
  bounds for the inference working set.
llama_bf16_train.onnx: the LLaMA exported in bfloat16 (its fp32 upcasts are Cast nodes there).
<name>.traced.json: the same model traced by gpumem.trace (bindings/python/gpumem/tracer.py) with
  loss="sum", so that the ONNX path can be compared with the traced path (tests/onnx_test.cpp).
The output is deterministic (seeded weights, sorted keys).
"""
import json
import os
import sys
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "oracle"))
import activations_oracle as oracle  # noqa: E402  (the GPT-2 / LLaMA replicas and the storage helpers)

warnings.filterwarnings("ignore")
torch.set_num_threads(2)
OUT = os.path.join(ROOT, "tests", "fixtures", "onnx")
OPSET = 17


# ---------------------------------------------------------------------------------------------
# models
# ---------------------------------------------------------------------------------------------

class GPT2Logits(oracle.GPT2LMHeadModel):
    """GPT2LMHeadModel up to lm_logits (the loss is --loss's): the oracle replica's own logits()."""

    def forward(self, input_ids):
        return self.logits(input_ids)


class LlamaLogits(oracle.LlamaForCausalLM):
    """LlamaForCausalLM up to the logits: the oracle replica's own logits()."""

    def forward(self, input_ids):
        return self.logits(input_ids)


class TinyCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(16)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.drop = nn.Dropout(0.5)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.bn1(self.conv1(x))))
        x = F.relu(self.bn2(self.conv2(x)))
        x = torch.flatten(self.gap(x), 1)
        return self.fc(self.drop(x))


class ViTBlock(nn.Module):
    def __init__(self, d, heads, p):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.attn_drop = nn.Dropout(p)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * d, d)
        self.drop = nn.Dropout(p)

    def forward(self, x):
        b, n, d = x.shape
        qkv = self.qkv(self.ln1(x)).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        att = (q @ k.transpose(-2, -1)) * (d // self.heads) ** -0.5
        att = self.attn_drop(att.softmax(dim=-1))
        y = (att @ v).transpose(1, 2).reshape(b, n, d)
        x = x + self.proj(y)
        return x + self.drop(self.fc2(self.act(self.fc1(self.ln2(x)))))


class TinyViT(nn.Module):
    def __init__(self, img=16, patch=4, d=32, depth=2, heads=2, classes=10, p=0.1):
        super().__init__()
        self.patch = nn.Conv2d(3, d, patch, stride=patch)
        n = (img // patch) ** 2
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(torch.zeros(1, n + 1, d))
        self.blocks = nn.ModuleList([ViTBlock(d, heads, p) for _ in range(depth)])
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x)[:, 0])


def conv_block(i, o):
    return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(),
                         nn.Conv2d(o, o, 3, padding=1), nn.ReLU())


class TinyUNet(nn.Module):
    def __init__(self, c=8):
        super().__init__()
        self.enc1 = conv_block(3, c)
        self.enc2 = conv_block(c, 2 * c)
        self.mid = conv_block(2 * c, 4 * c)
        self.up2 = nn.ConvTranspose2d(4 * c, 2 * c, 2, stride=2)
        self.dec2 = conv_block(4 * c, 2 * c)
        self.red1 = nn.Conv2d(2 * c, c, 1)
        self.dec1 = conv_block(2 * c, c)
        self.out = nn.Conv2d(c, 2, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(F.max_pool2d(e1, 2))
        m = self.mid(F.max_pool2d(e2, 2))
        d2 = self.dec2(torch.cat([self.up2(m), e2], dim=1))
        u1 = F.interpolate(self.red1(d2), scale_factor=2.0, mode="nearest")
        d1 = self.dec1(torch.cat([u1, e1], dim=1))
        return self.out(d1)


def lm_cfgs():
    g = oracle.gpt2_config(64, 2, 512, heads=4, pdrop=0.1)
    g["n_positions"] = 64
    ll = oracle.llama_config(64, 2, 512, kv_heads=2, intermediate=172, heads=4)
    return g, ll


def make_models():
    """name -> (constructor, example-input maker(b, s), dynamic axes, has_seq, points, label maker)."""
    g, ll = lm_cfgs()
    ids = lambda vocab: (lambda b, s: torch.randint(0, vocab, (b, s), dtype=torch.long))  # noqa: E731
    img = lambda c, hw: (lambda b, s: torch.randn(b, c, hw, hw))  # noqa: E731
    lm_axes = {"input_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}}
    im_axes = {"input": {0: "batch"}, "logits": {0: "batch"}}
    lm_points = [(1, 16), (2, 32), (4, 24)]
    im_points = [(2, 0), (3, 0), (4, 0)]
    tv = __import__("torchvision")
    return {
        "gpt2": (lambda: GPT2Logits(dict(g)), ids(512), "input_ids", lm_axes, True, lm_points),
        "llama": (lambda: LlamaLogits(dict(ll)), ids(512), "input_ids", lm_axes, True, lm_points),
        "resnet18": (lambda: tv.models.resnet18(num_classes=10), img(3, 32), "input", im_axes, False, im_points),
        "cnn": (TinyCNN, img(3, 16), "input", im_axes, False, im_points),
        "vit": (TinyViT, img(3, 16), "input", im_axes, False, im_points),
        "unet": (TinyUNet, img(3, 16), "input", im_axes, False, im_points),
    }


def seeded(ctor):
    torch.manual_seed(oracle.SEED)
    m = ctor()
    # Distinct values everywhere: eval exports deduplicate initializers by value
    # (torch/onnx/utils.py), which would alias BatchNorm's ones/zeros.
    with torch.no_grad():
        for t in list(m.parameters()) + [b for b in m.buffers() if b.is_floating_point()]:
            t.uniform_(0.5, 1.5) if t.dim() <= 1 else t.normal_(0.0, 0.05)
    return m


# ---------------------------------------------------------------------------------------------
# oracle
# ---------------------------------------------------------------------------------------------

def native_dropout_patch():
    """nn.Dropout as CUDA runs it: torch.native_dropout (bool mask) for 0 < p < 1."""
    orig = F.dropout

    def drop(x, p=0.5, training=True, inplace=False):
        if training and 0.0 < p < 1.0 and x.numel() > 0:
            return torch.native_dropout(x, p, True)[0]
        return orig(x, p, training, inplace)
    return orig, drop


def saved_bytes(model, x, loss_kind, has_seq):
    """oracle.measure's count for an arbitrary model and loss (modern torch: MeanBackward1-only storages out)."""
    param_ptrs = {oracle.storage_key(p) for p in model.parameters()}
    buffer_ptrs = {oracle.storage_key(bf) for bf in model.buffers()}
    state = {"packed": [], "last_unpacked": []}

    def pack(t):
        state["packed"].append((t, ""))
        return len(state["packed"]) - 1

    def unpack(i):
        state["last_unpacked"].append(i)
        return state["packed"][i][0]

    orig, drop = native_dropout_patch()
    F.dropout = drop
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            out = model(x)
            if loss_kind == "sum":
                loss = out.sum()
            elif loss_kind == "mean":
                loss = out.mean()
            else:
                labels = torch.randint(0, out.shape[-1], out.shape[:-1], dtype=torch.long)
                loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), labels.reshape(-1))
    finally:
        F.dropout = orig
    seen = {}
    for t, _ in state["packed"]:
        seen.setdefault(oracle.storage_key(t), oracle.storage_nbytes(t))
    total = sum(nb for k, nb in seen.items() if k not in param_ptrs and k not in buffer_ptrs)
    savers, visited, stack, alive = {}, set(), [loss.grad_fn], []
    while stack:
        n = stack.pop()
        if n is None or id(n) in visited:
            continue
        visited.add(id(n))
        alive.append(n)  # node wrappers are made on access: keep them so that no id is reused
        for attr, t, _ in oracle._node_saved_tensors(n, state):
            savers.setdefault(oracle.storage_key(t), set()).add((type(n).__name__, attr))
        stack.extend(nx for nx, _ in n.next_functions)
    mean_only = sum(seen[k] for k, sv in savers.items()
                    if sv == {("MeanBackward1", "self")} and k in seen and k not in param_ptrs and k not in buffer_ptrs)
    return total - mean_only


def eval_bounds(model, x):
    outs = []

    def hook(mod, inp, out):
        if isinstance(out, torch.Tensor) and not list(mod.children()):
            outs.append(out.numel() * out.element_size())
    hooks = [m.register_forward_hook(hook) for m in model.modules()]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return {"sum_module_outputs": int(sum(outs)), "largest_module_output": int(max(outs)),
            "input": int(x.numel() * x.element_size())}


# ---------------------------------------------------------------------------------------------
# export + external-data rewrite
# ---------------------------------------------------------------------------------------------

def _varint(buf, i):
    v, shift = 0, 0
    while True:
        c = buf[i]
        i += 1
        v |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return v, i


def _enc_varint(v):
    out = bytearray()
    while True:
        c = v & 0x7F
        v >>= 7
        out.append(c | (0x80 if v else 0))
        if not v:
            return bytes(out)


def _fields(buf):
    i = 0
    while i < len(buf):
        start = i
        key, i = _varint(buf, i)
        wt = key & 7
        if wt == 0:
            _, i = _varint(buf, i)
        elif wt == 1:
            i += 8
        elif wt == 5:
            i += 4
        elif wt == 2:
            n, i = _varint(buf, i)
            i += n
        else:
            raise ValueError("wire type %d" % wt)
        yield key >> 3, wt, buf[start:i]


def _payload(raw):
    _, i = _varint(raw, 0)
    n, i = _varint(raw, i)
    return raw[i:i + n]


def _len_field(num, data):
    return _enc_varint(num << 3 | 2) + _enc_varint(len(data)) + data


FLOAT_TYPES = {1, 10, 11, 16}  # FLOAT, FLOAT16, DOUBLE, BFLOAT16 (onnx.proto TensorProto.DataType)


def strip_tensor(t):
    """TensorProto: drop raw_data (9) / float_data (4), mark data_location (14) EXTERNAL."""
    dtype, raw_len, kept = 0, 0, []
    for num, wt, raw in _fields(t):
        if num == 2:
            dtype = _varint(raw, 1)[0]
        if num in (4, 9):
            raw_len += len(_payload(raw)) if wt == 2 else 4
            continue
        kept.append(raw)
    if dtype not in FLOAT_TYPES or raw_len <= 256:
        return t
    entry = lambda k, v: _len_field(13, _len_field(1, k.encode()) + _len_field(2, v.encode()))  # noqa: E731
    return b"".join(kept) + entry("location", "weights.bin") + entry("length", str(raw_len)) + \
        _enc_varint(14 << 3) + _enc_varint(1)


def strip_model(buf):
    out = []
    for num, wt, raw in _fields(buf):
        if num == 7 and wt == 2:  # ModelProto.graph
            g = []
            for gnum, gwt, graw in _fields(_payload(raw)):
                g.append(_len_field(5, strip_tensor(_payload(graw))) if gnum == 5 and gwt == 2 else graw)
            out.append(_len_field(7, b"".join(g)))
        else:
            out.append(raw)
    return b"".join(out)


def export(model, x, input_name, axes, path, training):
    import io
    f = io.BytesIO()
    mode = torch.onnx.TrainingMode.TRAINING if training else torch.onnx.TrainingMode.PRESERVE
    torch.onnx.export(model, (x,), f, input_names=[input_name], output_names=["logits"], dynamic_axes=axes,
                      opset_version=OPSET, training=mode, do_constant_folding=False)
    data = strip_model(f.getvalue())
    with open(path, "wb") as fh:
        fh.write(data)
    return len(data)


def _load_tracer():
    import importlib.util
    spec = importlib.util.spec_from_file_location("gpumem_tracer", os.path.join(ROOT, "bindings", "python", "gpumem", "tracer.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


TRACER = _load_tracer()


def main():
    os.makedirs(OUT, exist_ok=True)
    expected = {"opset": OPSET, "torch": torch.__version__.split("+")[0], "models": {}}
    for name, (ctor, mk, input_name, axes, has_seq, points) in make_models().items():
        model = seeded(ctor)
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        buffers = sum(b.numel() for b in model.buffers())
        torch.manual_seed(7)
        x = mk(2, 8 if has_seq else 0)
        model.train()
        if name in ("gpt2", "llama"):
            model.cfg["dropout_impl"] = "cpu"  # exports as ONNX Dropout; the oracle runs native_dropout
        sizes = {"train": export(model, x, input_name, axes, os.path.join(OUT, name + "_train.onnx"), True)}
        if name == "llama":  # a bfloat16 export: the model's own fp32 upcasts (RMSNorm, softmax) are in the file
            sizes["train_bf16"] = export(seeded(ctor).to(torch.bfloat16).train(), x, input_name, axes,
                                         os.path.join(OUT, name + "_bf16_train.onnx"), True)
        model.eval()
        sizes["eval"] = export(model, x, input_name, axes, os.path.join(OUT, name + "_eval.onnx"), False)
        if name in ("gpt2", "llama"):
            model.cfg["dropout_impl"] = "native"
        pts = []
        for (b, s) in points:
            torch.manual_seed(11)
            xi = mk(b, s)
            model.train()
            losses = {lk: saved_bytes(model, xi, lk, has_seq) for lk in ("sum", "mean", "cross-entropy")}
            model.eval()
            pts.append({"batch": b, "seq": s, "saved_bytes": losses, "eval": eval_bounds(model, xi)})
        expected["models"][name] = {"trainable": trainable, "buffers": buffers, "has_seq": has_seq,
                                    "points": pts, "file_bytes": sizes}
        print(name, trainable, buffers, sizes, [p["saved_bytes"]["sum"] for p in pts])
        graph = TRACER.trace(ctor, lambda b, s, mk=mk: (mk(b, s),), loss="sum", name=name, has_sequence=has_seq)
        with open(os.path.join(OUT, name + ".traced.json"), "w") as fh:
            json.dump(graph, fh, indent=1)
            fh.write("\n")
    with open(os.path.join(OUT, "expected.json"), "w") as fh:
        json.dump(expected, fh, indent=1, sort_keys=True)
        fh.write("\n")


if __name__ == "__main__":
    main()
