#!/usr/bin/python3
"""Prototype: meta traces -> a gpumem model-graph JSON draft (blocks / tensors with symbolic
extents / ops with OpKind and SavedRef / params with Component), then a check that the JSON,
evaluated at a new (b, s), gives the same saved bytes as a direct meta trace at that shape.

    /usr/bin/python3 convert.py [gpt2|cnn|vit|oracle-llama] [out.json]
"""
import json
import os
import re
import sys
import warnings
from fractions import Fraction

import torch

warnings.filterwarnings("ignore")
torch.set_num_threads(1)

import gtrace  # noqa: E402
from fit_extents import CHECK, FIT, solve3  # noqa: E402

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4, "bool": 1,
               "uint8": 1, "int8": 1}

VIEW_OPS = {"view", "_reshape_alias", "_unsafe_view", "t", "transpose", "permute", "slice", "select", "split",
            "expand", "unsqueeze", "squeeze", "detach", "alias", "as_strided", "unbind", "chunk", "narrow",
            "diagonal", "unfold", "view_as", "reshape", "flatten", "split_with_sizes"}
ACTS = {"gelu", "silu", "relu", "relu_", "tanh", "sigmoid", "gelu_", "silu_", "hardtanh", "leaky_relu", "elu"}
LOSS_FNS = {"cross_entropy", "nll_loss", "mse_loss", "l1_loss", "binary_cross_entropy_with_logits", "smooth_l1_loss"}


def aten_name(op):
    return op.split(".")[1]  # "aten.mm.default" -> "mm"


def op_kind(tr, op, param_in):
    n = aten_name(op["op"])
    fn = tr.fn_ops[op["fn"]]["fn"].split(".")[-1] if op["fn"] is not None else ""
    if fn in LOSS_FNS:
        return "Loss"
    if n in ("mm", "addmm", "linear", "matmul", "bmm", "baddbmm"):
        return "Linear" if param_in else "Matmul"
    if n == "embedding":
        return "Embedding"
    if n in ("_softmax", "softmax", "_log_softmax"):
        return "Softmax"
    if n == "native_layer_norm":
        return "LayerNorm"
    if n in ("native_dropout",):
        return "Dropout"
    if n in ACTS:
        return "Activation"
    if n in ("add", "add_"):
        return "Add"
    if n in ("mul", "mul_"):
        return "Mul"
    if n in ("_to_copy",):
        return "Cast"
    if n in VIEW_OPS:
        return "View"
    if n == "convolution":
        return "Conv2d"
    if n in ("native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional"):
        return "BatchNorm2d"
    if n == "max_pool2d_with_indices":
        return "MaxPool2d"
    if n == "avg_pool2d":
        return "AvgPool2d"
    if n in ("_adaptive_avg_pool2d",) or fn == "adaptive_avg_pool2d":
        return "AdaptiveAvgPool2d"
    return "Elementwise"


def component(pname, module_type):
    p = pname.lower()
    if module_type in ("Embedding",) or "embed" in p or p.startswith("wte") or p.startswith("wpe"):
        return "Embeddings"
    if "norm" in module_type.lower() or re.search(r"(^|\.)(ln|norm|layernorm)[_\w]*\.", p):
        return "Norms"
    if "lm_head" in p or p.startswith("head"):
        return "Head"
    if re.search(r"attn|attention|q_proj|k_proj|v_proj|o_proj", p):
        return "Attention"
    if re.search(r"mlp|ffn|fc|feed_forward|gate_proj|up_proj|down_proj", p):
        return "Mlp"
    return "Other"


def find_layers(tr):
    """The ModuleList whose children run one after another: (prefix, count)."""
    best = None
    for p in {m for m in tr.layer_inputs}:
        m = re.match(r"^(.*)\.(\d+)$", p)
        if not m:
            continue
        prefix = m.group(1)
        idx = {int(mm.group(1)) for q in tr.layer_inputs for mm in [re.match(re.escape(prefix) + r"\.(\d+)$", q)] if mm}
        if len(idx) >= 2 and (best is None or len(idx) > best[1]):
            best = (prefix, len(idx))
    return best


def in_layer(module, prefix, k):
    lp = "%s.%d" % (prefix, k)
    return module == lp or module.startswith(lp + ".")


def segment(tr):
    """aten op ranges: embeddings, layer k (k = 0..L-1), head. Root-level ops between two layers
    would break the folding: refuse."""
    lay = find_layers(tr)
    if lay is None:
        return None, [("model", list(range(len(tr.aten_ops))))]
    prefix, L = lay
    owner = []
    for op in tr.aten_ops:
        k = next((k for k in range(L) if in_layer(op["module"], prefix, k)), None)
        owner.append(k)
    first = owner.index(0)
    last = len(owner) - 1 - owner[::-1].index(L - 1)
    for i in range(first, last + 1):
        if owner[i] is None:
            raise RuntimeError("op %d (%s, module %r) runs between layers of %s: cannot fold them into one block"
                               % (i, tr.aten_ops[i]["op"], tr.aten_ops[i]["module"], prefix))
    layers = [[i for i in range(first, last + 1) if owner[i] == k] for k in range(L)]
    return (prefix, L), [("embeddings", list(range(0, first)))] + [("layer%d" % k, layers[k]) for k in range(L)] + \
        [("head", list(range(last + 1, len(owner))))]


def layer_signature(tr, ops, prefix, k):
    sig = []
    for i in ops:
        op = tr.aten_ops[i]
        mod = op["module"].replace("%s.%d" % (prefix, k), "L", 1)
        sig.append((op["op"], mod, tuple(tuple(tr.tensors[t]["shape"]) for t in op["outputs"])))
    return sig


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def fit_tensor(traces, tid, use_storage):
    vals = {}
    for k, tr in traces.items():
        t = tr.tensors[tid]
        vals[k] = t["storage_nbytes"] // DTYPE_BYTES[t["dtype"]] if use_storage else numel(t["shape"])
    per_b = solve3([(s, Fraction(vals[(b, s)], b)) for b, s in FIT])
    if all(c.denominator == 1 for c in per_b) and all(
            b * (per_b[0] + per_b[1] * s + per_b[2] * s * s) == vals[(b, s)] for b, s in CHECK):
        return [int(c) for c in per_b], True
    flat = solve3([(s, vals[(b, s)]) for b, s in FIT])
    if all(c.denominator == 1 for c in flat) and all(flat[0] + flat[1] * s + flat[2] * s * s == vals[(b, s)] for b, s in CHECK):
        return [int(c) for c in flat], False
    raise RuntimeError("tensor t%d: element count is not b*(c0+c1*s+c2*s^2) nor c0+c1*s+c2*s^2: %s" % (tid, vals))


# derivatives.yaml: which saved activation inputs exist only for a parameter's gradient
def only_for_param_grad(kind, aten, tid_is_param_input):
    return kind in ("Linear", "Conv2d", "Embedding") and not tid_is_param_input


def build_graph(make_model, make_inputs, name):
    traces = {k: gtrace.trace(make_model, make_inputs(*k)) for k in FIT + CHECK}
    tr = traces[FIT[0]]
    sig0 = [op["op"] for op in tr.aten_ops]
    for k, t in traces.items():
        if [op["op"] for op in t.aten_ops] != sig0 or len(t.tensors) != len(tr.tensors):
            raise RuntimeError("the op sequence at b,s=%s differs from b,s=%s: shape-dependent control flow" % (k, FIT[0]))
    lay, segs = segment(tr)
    if lay:
        prefix, L = lay
        s0 = layer_signature(tr, segs[1][1], prefix, 0)
        if any(layer_signature(tr, segs[1 + k][1], prefix, k) != s0 for k in range(1, L)):
            lay = None  # children differ (nn.Sequential of mixed layers): one block, no folding
    if lay:
        blocks_src = [(segs[0][0], segs[0][1], 1, "")] + [("layers", segs[1][1], L, "%s.0" % prefix)] + \
            [(segs[-1][0], segs[-1][1], 1, "")]
    else:
        blocks_src = [("model", list(range(len(tr.aten_ops))), 1, "")]

    param_of = {}  # tid -> param name
    for p in tr.params:
        param_of[p["tensor"]] = p
    nonact = {t["id"] for t in tr.tensors if t["kind"] in ("param", "buffer")}
    nonact_storage = {tr.tensors[t]["storage"] for t in nonact}
    produced_in = {}
    for bi, (_, ops, _, _) in enumerate(blocks_src):
        for i in ops:
            for t in tr.aten_ops[i]["outputs"]:
                produced_in.setdefault(t, bi)
    if lay:  # every layer's tensors belong to the layers block
        for k in range(1, L):
            for i in segs[1 + k][1]:
                for t in tr.aten_ops[i]["outputs"]:
                    produced_in.setdefault(t, 1)

    graph = {"format": "gpumem-model-graph", "version": 1, "name": name, "family": "traced", "source": "trace",
             "torch": torch.__version__, "trace_points": [list(k) for k in FIT + CHECK], "blocks": [], "notes": []}
    used_params = set()
    for bi, (bname, ops, repeat, strip) in enumerate(blocks_src):
        local, tensors = {}, []

        def rel(mod):
            if strip and (mod == strip or mod.startswith(strip + ".")):
                return mod[len(strip) + 1:]
            return mod

        def add_tensor(tid, shared=None):
            if tid in local:
                return local[tid]
            t = tr.tensors[tid]
            root = t["base"]
            alias = -1
            if root != tid:
                if root in nonact:
                    return None
                alias = add_tensor(root)
            ext, per_batch = fit_tensor(traces, tid if root == tid else tid, use_storage=(root == tid))
            info = {"name": "%s:t%d" % (rel(t["module"]) or "<root>", tid), "extent": ext, "dtype": t["dtype"],
                    "alias_of": alias}
            if not per_batch:
                info["per_batch"] = False
            if shared:
                info["shared_key"] = shared
            local[tid] = len(tensors)
            tensors.append(info)
            return local[tid]

        # tensor 0: the block input
        if bname == "layers":
            add_tensor(tr.layer_inputs[strip])
        elif bi > 0:
            prev = set()
            for _, o2, _, _ in blocks_src[:bi]:
                for i in o2:
                    prev.update(tr.aten_ops[i]["outputs"])
            if lay:
                for k in range(1, L):
                    for i in segs[1 + k][1]:
                        prev.update(tr.aten_ops[i]["outputs"])
            cand = [t for i in ops for t in tr.aten_ops[i]["inputs"] if t in prev and t not in nonact]
            if cand:
                add_tensor(cand[-1] if bname == "head" else cand[0])
        block_ops, params = [], []
        pidx = {}
        for i in ops:
            op = tr.aten_ops[i]
            ins = op["inputs"]
            param_in = [t for t in ins if tr.tensors[t]["base"] in param_of]
            kind = op_kind(tr, op, bool(param_in))
            rec = {"kind": kind, "name": rel(op["module"]), "aten": aten_name(op["op"]), "inputs": [], "outputs": [],
                   "saved": [], "params": []}
            for t in ins:
                if t in nonact or tr.tensors[t]["base"] in nonact:
                    continue
                shared = None
                owner = produced_in.get(tr.tensors[t]["base"])
                if t not in local and tr.tensors[t]["base"] not in local and owner is not None and owner != bi:
                    shared = "trace:t%d" % tr.tensors[t]["base"]   # made once elsewhere, read by every instance
                lid = add_tensor(t, shared)
                if lid is not None:
                    rec["inputs"].append(lid)
            for t in op["outputs"]:
                lid = add_tensor(t)
                if lid is not None:
                    rec["outputs"].append(lid)
            for t in op["saved"]:
                if tr.tensors[t]["storage"] in nonact_storage:
                    continue
                lid = add_tensor(t)
                rec["saved"].append({"tensor": lid, "only_for_param_grad": only_for_param_grad(kind, rec["aten"], False)})
            for t in param_in:
                p = param_of[tr.tensors[t]["base"]]
                if p["name"] in used_params and p["name"] not in pidx:
                    rec.setdefault("tied", []).append(p["name"])   # a weight held by another block
                    continue
                if p["name"] not in pidx:
                    mt = p["module_type"]
                    pidx[p["name"]] = len(params)
                    params.append({"name": rel(p["name"].rpartition(".")[0]) + "." + p["name"].rpartition(".")[2]
                                   if strip else p["name"], "shape": p["shape"], "dtype": p["dtype"],
                                   "component": component(p["name"], mt), "trainable": True,
                                   "linear_weight": False,
                                   "module": p["name"].rsplit(".", 2)[-2] if "." in p["name"] else ""})
                    used_params.add(p["name"])
                rec["params"].append(pidx[p["name"]])
                if kind == "Linear" and len(p["shape"]) == 2:
                    params[pidx[p["name"]]]["linear_weight"] = True
                    # the operand as mm/addmm reads it is [in, out] (W.t() for nn.Linear, W itself for HF Conv1D)
                    shp = tr.tensors[t]["shape"]
                    rec["in_features"], rec["out_features"] = shp[0], shp[1]
            if kind == "Linear" and "tied" in rec:
                shp = tr.tensors[param_in[0]]["shape"]
                rec["in_features"], rec["out_features"] = shp[0], shp[1]
            block_ops.append(rec)
        # params read by no op (rare): leave out; the layers block lists layer 0's params only
        out = 0
        if bi + 1 < len(blocks_src):
            nxt = blocks_src[bi + 1]
            if nxt[0] == "layers":
                out_tid = tr.layer_inputs[nxt[3]]
            else:
                out_tid = None
            if bname == "layers":
                out_tid = tr.layer_inputs.get("%s.1" % lay[0]) if L > 1 else None
            if out_tid is not None and out_tid in local:
                out = local[out_tid]
        graph["blocks"].append({"name": bname, "repeat": repeat, "checkpointable": bname == "layers",
                                "params": params, "tensors": tensors, "ops": block_ops, "output": out})
    if any(t.get("per_batch") is False for b in graph["blocks"] for t in b["tensors"]):
        graph["notes"].append("tensors with per_batch=false do not grow with the batch (position ids, mask slices, "
                              "scalars, per-channel statistics): gpumem's Extent needs that flag")
    return graph, traces


def saved_bytes_from_graph(g, b, s):
    total, shared = 0, {}
    for blk in g["blocks"]:
        ts = blk["tensors"]

        def root(i):
            while ts[i]["alias_of"] >= 0:
                i = ts[i]["alias_of"]
            return i
        seen = set()
        per = 0
        for op in blk["ops"]:
            for sv in op["saved"]:
                r = root(sv["tensor"])
                if r in seen:
                    continue
                seen.add(r)
                t = ts[r]
                c0, c1, c2 = t["extent"]
                n = (c0 + c1 * s + c2 * s * s) * (b if t.get("per_batch", True) else 1)
                nb = n * DTYPE_BYTES[t["dtype"]]
                if "shared_key" in t:
                    shared[t["shared_key"]] = nb
                else:
                    per += nb
        total += per * blk["repeat"]
    return total + sum(shared.values())


def main():
    which = sys.argv[1] if len(sys.argv) > 1 else "gpt2"
    if which == "gpt2":
        from models import TinyGPT
        V = 64
        mk, mi = (lambda: TinyGPT(vocab=V)), (lambda b, s: (torch.randint(0, V, (b, s)), torch.randint(0, V, (b, s))))
        nparams = sum(p.numel() for p in TinyGPT(vocab=V).parameters())
    elif which == "oracle-llama" or which == "oracle-gpt2":
        import importlib.util
        spec = importlib.util.spec_from_file_location("ao", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "oracle", "activations_oracle.py"))
        ao = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(ao)
        torch.set_num_threads(1)
        if which == "oracle-llama":
            cfg, cls = ao.llama_config(64, 3, 1000, 2, 172), ao.LlamaForCausalLM
        else:
            cfg, cls = ao.gpt2_config(64, 3, 1000), ao.GPT2LMHeadModel
        mk = lambda: cls(cfg)  # noqa: E731
        mi = lambda b, s: (torch.randint(0, cfg["vocab"], (b, s)),) * 2  # noqa: E731
        nparams = sum(p.numel() for p in cls(cfg).parameters())
    elif which == "cnn":
        from models import TinyCNN
        mk, mi = TinyCNN, (lambda b, s: (torch.randn(b, 3, 16, 16), torch.randint(0, 10, (b,))))
        nparams = sum(p.numel() for p in TinyCNN().parameters())
    else:
        from models import TinyViT
        mk, mi = (lambda: TinyViT(layers=2)), (lambda b, s: (torch.randn(b, 3, 16, 16), torch.randint(0, 10, (b,))))
        nparams = sum(p.numel() for p in TinyViT(layers=2).parameters())
    g, _ = build_graph(mk, mi, which)
    if len(sys.argv) > 2:
        with open(sys.argv[2], "w") as f:
            json.dump(g, f, indent=1)
    gp = sum(numel(p["shape"]) * blk["repeat"] for blk in g["blocks"] for p in blk["params"])
    print("%s: blocks %s; params in graph %d, in model %d %s" % (
        which, [(b["name"], b["repeat"], len(b["ops"]), len(b["tensors"])) for b in g["blocks"]], gp, nparams,
        "EQUAL" if gp == nparams else "DIFF"))
    ok = gp == nparams
    for b, s in [(5, 20), (2, 40), (7, 9)]:
        direct = gtrace.saved_bytes(gtrace.trace(mk, mi(b, s)))[0]
        from_g = saved_bytes_from_graph(g, b, s)
        ok &= direct == from_g
        print("  b=%d s=%-3d saved: graph JSON %9d B   direct meta trace %9d B   %s" % (
            b, s, from_g, direct, "EQUAL" if direct == from_g else "DIFF"))
    kinds = {}
    for blk in g["blocks"]:
        for op in blk["ops"]:
            kinds[op["kind"]] = kinds.get(op["kind"], 0) + 1
    print("  op kinds:", dict(sorted(kinds.items())))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
