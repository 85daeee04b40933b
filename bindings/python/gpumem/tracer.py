"""gpumem.trace: a PyTorch model -> a gpumem model graph file, on the meta device.

The model is built and run on PyTorch's meta device (shapes and dtypes only: no
weights, no memory, no GPU). One training-mode forward pass (and the loss) is
recorded at five (batch, sequence) points:

* every aten op with its outputs (new storage, view or in-place: storage
  identity, ``torch._C._storage_id``), through a ``TorchDispatchMode``, which
  sits below autograd and so sees the ops that own autograd nodes;
* the torch-level call each aten op belongs to (``TorchFunctionMode``: linear,
  softmax, cross_entropy, ...), used to name ops and find the loss;
* the tensors autograd saves for backward: ``saved_tensors_hooks`` packs, each
  attributed to the op whose node saved it by reading every node's ``_saved_*``
  attributes after the forward (the oracle's method, oracle/activations_oracle.py);
* parameters and buffers (tied weights once) and module boundaries (forward hooks).

The five traces give each storage's size exactly as ``b*(c0 + c1*s + c2*s^2)``
(or, for tensors that do not grow with the batch, ``c0 + c1*s + c2*s^2``):
three points solve it in exact rationals and two more check it. Repeated layers
(children of one ModuleList/Sequential with identical op signatures) fold into
one block run ``repeat`` times. The result is gpumem's model graph
(docs/model-graph.md, format ``gpumem-model-graph`` version 1), which every
gpumem command takes as MODEL.

CUDA semantics on meta: ``nn.Dropout``/``F.dropout`` take the fused
``native_dropout`` kernel on CUDA and save a 1-byte mask (ATen
native/Dropout.cpp ``is_fused_kernel_acceptable``: is_cuda/is_xpu/is_lazy);
on CPU and meta they save a float noise tensor. The trace rewrites them to
``torch.native_dropout``. Dtype *roles* (how each activation's dtype follows
the precision gpumem is asked for) come from an emulation of autocast's op
lists (aten/src/ATen/autocast_mode.cpp): matmul/conv outputs are "lowered",
softmax/log_softmax/layer_norm outputs "upcast", explicit fp32 copies and norm
statistics "float32", int64 "index64", bool "mask8", the rest the parameter
dtype ("stream").

Needs torch >= 1.13 (TorchDispatchMode, TorchFunctionMode, meta kernels);
tested on Debian's 1.13 and written against APIs that 2.x keeps. Runs as a
module too: ``python3 -m gpumem.trace script.py:make_model --input b,s:int64
--out model.json`` (which is what ``gpumem trace`` runs).
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import json
import os
import re
import sys
import warnings
from fractions import Fraction
from typing import Any, Dict, List, Optional, Sequence, Tuple

FORMAT = "gpumem-model-graph"
VERSION = 1
MIN_TORCH = (1, 13)
# Fit points (batch, seq): three solve each extent, the others check it. Batch
# >= 2 throughout: x[..., 1:].contiguous() of a [1, s] tensor is already
# contiguous and makes no copy, so batch 1 has a different tensor list.
FIT_SEQ = (8, 16, 32)
FIT_BATCH = (2, 3, 4)


class TraceError(ValueError):
    """The model cannot be traced; the message says why and what to do."""


def _torch():
    try:
        import torch  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise TraceError("gpumem.trace needs PyTorch (import torch failed: %s); install torch >= 1.13 "
                         "(Debian: apt-get install python3-torch) or describe the model as a config.json "
                         "or layer list" % e) from None
    # torch >= 2.0: modules a model factory imports (torchvision imports torch._dynamo) run
    # tensor code at import time; imported under the trace's meta device or modes, the
    # torch._dynamo package is left half initialised and every later `import torch._dynamo`
    # (an optimizer's constructor, for one) fails with a circular-import error. Seen with
    # Debian trixie's torch 2.6 and torchvision 0.21. Import it first, outside them.
    try:
        import torch._dynamo  # noqa: F401
    except Exception:  # torch 1.13 has none; a broken install is not the trace's concern
        pass
    return sys.modules["torch"]


def torch_version(torch) -> Tuple[int, int]:
    parts = []
    for p in torch.__version__.split("+")[0].split(".")[:2]:
        num = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(num) if num else 0)
    return tuple(parts)  # type: ignore[return-value]


def check_torch(torch) -> None:
    if torch_version(torch) < MIN_TORCH:
        raise TraceError("gpumem.trace needs torch >= 1.13 (found %s): it relies on TorchDispatchMode, "
                         "TorchFunctionMode and meta-device kernels that older releases lack; upgrade torch "
                         "or describe the model as a layer list / config.json" % torch.__version__)


# ----------------------------------------------------------------------------
# storage identity: meta tensors have data_ptr 0 + offset, so data_ptr is no use
# ----------------------------------------------------------------------------
def _storage_key(torch, t) -> int:
    if hasattr(torch._C, "_storage_id"):  # 1.13 and 2.x: the StorageImpl address
        return torch._C._storage_id(t)
    if hasattr(t, "untyped_storage"):
        return t.untyped_storage()._cdata
    return t.storage()._cdata


def _storage_nbytes(t) -> int:
    if hasattr(t, "untyped_storage"):  # 2.x
        return int(t.untyped_storage().nbytes())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return int(t.storage().nbytes())  # 1.13: TypedStorage.nbytes()


def _dtype_name(dt) -> str:
    return str(dt).replace("torch.", "")


# ----------------------------------------------------------------------------
# building the model on meta
# ----------------------------------------------------------------------------
_FACTORY_NAMES = ("empty", "zeros", "ones", "full", "rand", "randn", "randint", "arange", "tensor", "eye",
                  "linspace", "logspace", "empty_strided", "as_tensor", "randperm", "scalar_tensor", "range",
                  "tril_indices", "triu_indices")


def _meta_context(torch):
    if torch_version(torch) >= (2, 0):
        return torch.device("meta")  # 2.x: a context manager (torch/utils/_device.py)
    from torch.overrides import TorchFunctionMode
    factories = {getattr(torch, n) for n in _FACTORY_NAMES if hasattr(torch, n)}

    class DefaultDevice(TorchFunctionMode):
        """1.13's stand-in for `with torch.device('meta')`: the same idea as 2.x's
        DeviceContext, a TorchFunctionMode that adds device= to factory calls."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if func in factories and kwargs.get("device") is None:
                kwargs["device"] = torch.device("meta")
            return func(*args, **kwargs)

    return DefaultDevice()


def _model_on_meta(torch, model_or_factory):
    """A factory runs under the meta device (no weight memory, ties kept). A built
    module is moved with .to('meta'), which replaces every Parameter and so breaks
    weight tying in 1.13: the ties are restored by walking _parameters."""
    nn = torch.nn
    if not isinstance(model_or_factory, nn.Module):
        if not callable(model_or_factory):
            raise TraceError("gpumem.trace: the model must be a torch.nn.Module or a function returning one")
        with _meta_context(torch):
            m = model_or_factory()
        if not isinstance(m, nn.Module):
            raise TraceError("gpumem.trace: the factory returned %s, not a torch.nn.Module" % type(m).__name__)
        return m
    m = model_or_factory
    groups: Dict[int, List[str]] = {}
    for mod_name, mod in m.named_modules(remove_duplicate=False):
        for k, p in mod._parameters.items():
            if p is not None:
                groups.setdefault(id(p), []).append(mod_name + "." + k if mod_name else k)
    m = m.to("meta")
    for names in groups.values():
        src = m.get_parameter(names[0])
        for n in names[1:]:
            path, _, leaf = n.rpartition(".")
            setattr(m.get_submodule(path) if path else m, leaf, src)
    return m


@contextlib.contextmanager
def _cuda_dropout(torch):
    """F.dropout/torch.dropout -> torch.native_dropout (CUDA's fused kernel, a bool
    mask). Patched rather than intercepted, so that dropouts nested in other
    functionals (F.multi_head_attention_forward) are rewritten too. In-place
    dropout never takes the fused kernel (Dropout.cpp: dropout_ -> _dropout<true>)."""
    F = torch.nn.functional
    orig_f, orig_t = F.dropout, torch.dropout

    def f_dropout(input, p=0.5, training=True, inplace=False):
        if training and not inplace and 0.0 < p < 1.0 and input.numel() > 0:
            return torch.native_dropout(input, p, True)[0]
        return orig_f(input, p, training, inplace)

    def t_dropout(input, p, train):
        if train and 0.0 < p < 1.0 and input.numel() > 0:
            return torch.native_dropout(input, p, True)[0]
        return orig_t(input, p, train)

    F.dropout, torch.dropout = f_dropout, t_dropout
    try:
        yield
    finally:
        F.dropout, torch.dropout = orig_f, orig_t


# ----------------------------------------------------------------------------
# one trace
# ----------------------------------------------------------------------------
class _Trace:
    def __init__(self, torch):
        self.torch = torch
        self.tensors: List[Dict[str, Any]] = []
        self.aten_ops: List[Dict[str, Any]] = []
        self.fn_ops: List[Dict[str, Any]] = []
        self.params: List[Dict[str, Any]] = []
        self.buffers: List[Dict[str, Any]] = []
        self.inputs: List[int] = []
        self.saved: List[int] = []
        self.packed: List[int] = []
        self._keep: List[Any] = []
        self._keep_packed: List[Any] = []
        self._tid: Dict[int, int] = {}
        self._root: Dict[int, int] = {}
        self.module_stack = [""]
        self.cur_fn: Optional[int] = None
        self._pending: List[Tuple[int, List[Any]]] = []
        self.node_op: Dict[int, int] = {}
        self._nodes: List[Any] = []
        self.layer_inputs: Dict[str, int] = {}
        self.module_order: List[str] = []
        self._unpacked: List[int] = []
        self.output: List[int] = []
        self.dropped_storages: set = set()
        self.loss_in_forward = False
        self.mute = False
        self.sdpa_saved: Dict[int, List[int]] = {}

    def tid_of(self, t, kind=None, name=None, producer=None) -> int:
        k = id(t)
        if k in self._tid:
            return self._tid[k]
        sk = _storage_key(self.torch, t)
        root = self._root.get(sk)
        tid = len(self.tensors)
        self.tensors.append({
            "shape": list(t.shape), "dtype": _dtype_name(t.dtype), "storage": sk, "nbytes": _storage_nbytes(t),
            "kind": kind or ("view" if root is not None else "new"), "base": root if root is not None else tid,
            "producer": producer, "name": name, "module": self.module_stack[-1],
        })
        if root is None:
            self._root[sk] = tid
        self._tid[k] = tid
        self._keep.append(t)  # ids and storages must not be reused during the trace
        return tid

    def resolve_nodes(self) -> None:
        # autograd sets an output's grad_fn after the kernel returns: read it at the next event
        for idx, outs in self._pending:
            for t in outs:
                n = t.grad_fn
                if n is not None and id(n) not in self.node_op:
                    self.node_op[id(n)] = idx
                    self._nodes.append(n)
        self._pending = []

    def attribute_saved(self) -> None:
        for op in self.aten_ops:
            op["saved"] = []
        for n in self._nodes:
            idx = self.node_op[id(n)]
            for attr in dir(n):
                if not attr.startswith("_saved_"):
                    continue
                self._unpacked = []
                try:
                    getattr(n, attr)
                except Exception:  # noqa: BLE001 - attributes of freed or non-tensor saves
                    continue
                for pi in self._unpacked:
                    tid = self.packed[pi]
                    if tid not in self.aten_ops[idx]["saved"]:
                        self.aten_ops[idx]["saved"].append(tid)


def _flat(torch, x) -> List[Any]:
    from torch.utils._pytree import tree_flatten
    return [t for t in tree_flatten(x)[0] if isinstance(t, torch.Tensor)]


def _run_trace(torch, model, args, kwargs, loss_fn, cuda_semantics, modern_saves) -> _Trace:
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode
    tr = _Trace(torch)

    class SdpaFn(torch.autograd.Function):
        """F.scaled_dot_product_attention as a fused kernel runs it on a GPU (flash /
        memory-efficient): it keeps q, k, v, the output and a fp32 logsumexp per
        query row, never the [s, s] scores. On meta the real call would take the math
        path (aten _fused_sdp_choice_meta) and save the probabilities."""

        @staticmethod
        def forward(ctx, q, k, v):
            # The output takes the query's memory layout, as the CUDA flash kernel lays it out
            # (aten/src/ATen/native/transformers/cuda/attention.cu
            # _scaled_dot_product_flash_attention_cuda: q_t = query.transpose(1, 2), flash_api.cpp
            # mha_fwd: out = at::empty_like(q_padded), returned as output.transpose(1, 2)). So the
            # `attn.transpose(1, 2).contiguous()` / `.permute(2, 0, 1, 3).contiguous()` callers make
            # copies only where the query was not already laid out that way (torch 2.6's CPU flash
            # kernel does the same for nn.MultiheadAttention: its out_proj input is the output).
            if q.dim() == 4 and v.shape[-1] == q.shape[-1]:
                out = torch.empty_like(q.transpose(1, 2)).transpose(1, 2)
            else:
                out = q.new_empty(tuple(q.shape[:-1]) + (v.shape[-1],))
            lse = torch.empty(tuple(q.shape[:-1]), dtype=torch.float32, device=q.device)
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.mark_non_differentiable(lse)
            return out, lse

        @staticmethod
        def backward(ctx, g, _glse):  # pragma: no cover - never run on meta traces
            q, k, v, _, _ = ctx.saved_tensors
            return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)

    def sdpa(name, a, kw):
        q, k, v = (list(a) + [kw.get("query"), kw.get("key"), kw.get("value")])[:3] if len(a) >= 3 else \
            (kw.get("query"), kw.get("key"), kw.get("value"))
        idx = len(tr.fn_ops)
        tr.fn_ops.append({"fn": name, "module": tr.module_stack[-1], "aten": []})
        ins = [tr.tid_of(t) for t in (q, k, v)]
        tr.mute = True  # the stand-in's own allocations are not ops of the model
        try:
            out, lse = SdpaFn.apply(q, k, v)
        finally:
            tr.mute = False
        op_idx = len(tr.aten_ops)
        outs = [tr.tid_of(out, producer=op_idx), tr.tid_of(lse, producer=op_idx)]
        b_h_l = _prod(q.shape[:-1])
        tr.aten_ops.append({"op": "gpumem.sdpa.default", "module": tr.module_stack[-1], "fn": idx, "inputs": ins,
                            "outputs": outs, "kinds": ["new", "new"],
                            "flops": 2 * b_h_l * k.shape[-2] * (q.shape[-1] + v.shape[-1])})
        tr.fn_ops[idx]["aten"].append(op_idx)
        tr.sdpa_saved[op_idx] = ins + outs
        return out

    @contextlib.contextmanager
    def patched_sdpa():
        """F.scaled_dot_product_attention patched as well as intercepted: a torch function
        mode is off inside its own handler, so the SDPA call nested in
        F.multi_head_attention_forward (torch >= 2.0, need_weights=False: nn.MultiheadAttention,
        torchvision's ViT) reaches no handler; the module attribute is what that code calls."""
        F = torch.nn.functional
        orig = getattr(F, "scaled_dot_product_attention", None)
        if orig is None:  # torch 1.13
            yield
            return

        def patched(*a, **kw):
            return sdpa("scaled_dot_product_attention", a, kw)

        F.scaled_dot_product_attention = patched
        try:
            yield
        finally:
            F.scaled_dot_product_attention = orig

    class FnMode(TorchFunctionMode):
        def __torch_function__(self, func, types, a=(), kw=None):
            kw = kw or {}
            name = getattr(func, "__qualname__", None) or getattr(func, "__name__", str(func))
            if name.endswith("scaled_dot_product_attention"):
                return sdpa(name, a, kw)
            if name.endswith("__get__") or name in ("Tensor.size", "Tensor.dim", "Tensor.numel", "Tensor.stride",
                                                     "Tensor.is_contiguous", "Tensor.__len__", "Tensor.data_ptr"):
                return func(*a, **kw)
            idx = len(tr.fn_ops)
            tr.fn_ops.append({"fn": name, "module": tr.module_stack[-1], "aten": []})
            prev, tr.cur_fn = tr.cur_fn, idx
            try:
                return func(*a, **kw)
            finally:
                tr.cur_fn = prev

    class AtenMode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, a=(), kw=None):
            kw = kw or {}
            if tr.mute:
                return func(*a, **kw)
            tr.resolve_nodes()
            out = func(*a, **kw)
            ins = _flat(torch, (a, kw))
            in_ids = [tr.tid_of(t) for t in ins]
            in_objs = {id(t) for t in ins}
            idx = len(tr.aten_ops)
            outs, kinds = [], []
            flat_out = _flat(torch, out)
            for t in flat_out:
                if id(t) in in_objs:
                    outs.append(tr._tid[id(t)])
                    kinds.append("inplace")
                else:
                    tid = tr.tid_of(t, producer=idx)
                    outs.append(tid)
                    kinds.append(tr.tensors[tid]["kind"])
            rec = {"op": str(func), "module": tr.module_stack[-1], "fn": tr.cur_fn, "inputs": in_ids,
                   "outputs": outs, "kinds": kinds, "args": a}
            rec["flops"] = _flops(torch, rec, [t for t in flat_out if id(t) not in in_objs])
            del rec["args"]
            if _aten_name(rec["op"]) == "_to_copy" and "dtype" in kw:
                rec["to_dtype"] = _dtype_name(kw["dtype"])
            tr.aten_ops.append(rec)
            if tr.cur_fn is not None:
                tr.fn_ops[tr.cur_fn]["aten"].append(idx)
            tr._pending.append((idx, flat_out))
            return out

    names = {m: n for n, m in model.named_modules()}
    handles = []

    def pre(mod, inp):
        tr.module_stack.append(names.get(mod, "?"))
        ts = _flat(torch, inp)
        p = names.get(mod, "?")
        if p not in tr.layer_inputs:
            tr.module_order.append(p)
            if ts:
                tr.layer_inputs[p] = tr.tid_of(ts[0])

    def post(mod, inp, out):
        tr.module_stack.pop()

    for m in model.modules():
        handles.append(m.register_forward_pre_hook(pre))
        handles.append(m.register_forward_hook(post))

    seen_p = set()
    for n, p in model.named_parameters():
        if id(p) in seen_p:
            continue
        seen_p.add(id(p))
        owner = model.get_submodule(n.rpartition(".")[0]) if "." in n else model
        tr.params.append({"name": n, "shape": list(p.shape), "dtype": _dtype_name(p.dtype),
                          "tensor": tr.tid_of(p, kind="param", name=n), "requires_grad": bool(p.requires_grad),
                          "module_type": type(owner).__name__})
    for n, b in model.named_buffers():
        tr.buffers.append({"name": n, "shape": list(b.shape), "dtype": _dtype_name(b.dtype),
                           "tensor": tr.tid_of(b, kind="buffer", name=n)})
    sig_names = []
    try:
        sig_names = list(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        pass
    for i, x in enumerate(args):
        if isinstance(x, torch.Tensor):
            tr.inputs.append(tr.tid_of(x, kind="input", name=sig_names[i] if i < len(sig_names) else "input%d" % i))
    for k, x in kwargs.items():
        if isinstance(x, torch.Tensor):
            tr.inputs.append(tr.tid_of(x, kind="input", name=k))

    def pack(t):
        tr._keep_packed.append(t)
        tid = tr.tid_of(t)
        tr.saved.append(tid)
        tr.packed.append(tid)
        return len(tr.packed) - 1

    def unpack(i):
        tr._unpacked.append(i)
        return tr._keep_packed[i]

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack), \
                (_cuda_dropout(torch) if cuda_semantics else contextlib.nullcontext()), patched_sdpa(), \
                FnMode(), AtenMode():
            out = model(*args, **kwargs)
            loss = loss_fn(out)
            # the forward returned the loss itself: the loop binds nothing else
            tr.loss_in_forward = any(loss is t for t in _flat(torch, out))
    except (NotImplementedError, RuntimeError) as e:
        # torch 1.13: NotImplementedError "Could not run 'aten::x' with arguments from the 'Meta'
        # backend"; torch 2.x: RuntimeError "Tensor.item() cannot be called on meta tensors" (its
        # meta registration of aten::_local_scalar_dense raises) for the same data dependence.
        msg = str(e).splitlines()[0] if str(e) else repr(e)
        if "on meta tensors" in msg and "'" not in msg:
            msg = "'aten::_local_scalar_dense' " + msg
        if ("Meta" in msg and isinstance(e, NotImplementedError)) or "on meta tensors" in msg:
            op = msg.split("'")[1] if "'" in msg else "an operator"
            last = tr.aten_ops[-1]["op"] if tr.aten_ops else "no op"
            hint = ""
            if op in ("aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::unique",
                      "aten::_unique2", "aten::bincount"):
                hint = (" It needs tensor values (.item(), bool(tensor), nonzero, boolean-mask indexing), which a "
                        "meta trace does not have: make that branch independent of the data (e.g. pass "
                        "attention_mask=None) or give gpumem the model another way.")
            raise TraceError("gpumem.trace: %s has no meta kernel in torch %s (in module %s, after %s).%s"
                             % (op, torch.__version__, tr.module_stack[-1] or "<root>", last, hint)) from None
        raise
    finally:
        for h in handles:
            h.remove()
    tr.resolve_nodes()
    if not isinstance(loss, torch.Tensor) or loss.grad_fn is None:
        raise TraceError("gpumem.trace: the loss is not a tensor that requires grad (got %s); give loss_fn / "
                         "--loss, or check that the parameters require grad" % type(loss).__name__)
    tr.output = [tr.tid_of(loss)]
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        tr.attribute_saved()
    for i, saved in tr.sdpa_saved.items():  # a Function's saves are not _saved_* attributes
        tr.aten_ops[i]["saved"] = list(saved)
    if modern_saves and torch_version(torch) < (2, 0):
        # torch 1.13's mean.dim saves its whole input (MeanBackward1.self); torch >= 2.0's
        # derivatives.yaml keeps only sizes (oracle/README.md). Traces answer for 2.x.
        kept = set()
        for op in tr.aten_ops:
            if op["op"] == "aten.mean.dim":
                dropped = [t for t in op["saved"] if t in op["inputs"]]
                op["saved"] = [t for t in op["saved"] if t not in dropped]
                tr.dropped_storages |= {tr.tensors[t]["storage"] for t in dropped}
            else:
                kept |= {tr.tensors[t]["storage"] for t in op["saved"]}
        tr.dropped_storages -= kept
    return tr


def _prod(xs) -> int:
    n = 1
    for d in xs:
        n *= int(d)
    return n


def _flops(torch, op, outs) -> int:
    """Forward FLOPs of the matmul-like aten ops (2 per multiply-add)."""
    name = _aten_name(op["op"])
    ts = [x for x in op["args"] if isinstance(x, torch.Tensor)]
    try:
        if name == "mm" and len(ts) >= 2:
            return 2 * ts[0].shape[0] * ts[0].shape[1] * ts[1].shape[1]
        if name == "addmm" and len(ts) >= 3:
            return 2 * ts[1].shape[0] * ts[1].shape[1] * ts[2].shape[1]
        if name in ("bmm", "baddbmm") and len(ts) >= 2:
            a, b = ts[-2], ts[-1]
            return 2 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2]
        if name == "convolution" and len(ts) >= 2 and outs:
            # each output element: C_in/groups * prod(kernel) multiply-adds (weight [C_out, C_in/g, k...])
            return 2 * _prod(ts[1].shape[1:]) * outs[0].numel()
    except (IndexError, TypeError, AttributeError):
        return 0
    return 0


def _aten_name(op: str) -> str:
    parts = op.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


# ----------------------------------------------------------------------------
# exact extents from several traces
# ----------------------------------------------------------------------------
def _solve3(pts) -> List[Fraction]:
    """The quadratic through three (x, y) points, in exact rationals: [c0, c1, c2]."""
    (x0, y0), (x1, y1), (x2, y2) = [(Fraction(x), Fraction(y)) for x, y in pts]
    c = [Fraction(0)] * 3
    for xi, yi, xj, xk in ((x0, y0, x1, x2), (x1, y1, x0, x2), (x2, y2, x0, x1)):
        den = (xi - xj) * (xi - xk)
        c[2] += yi / den
        c[1] += -yi * (xj + xk) / den
        c[0] += yi * xj * xk / den
    return c


class _Fitter:
    def __init__(self, points, fit, check, has_seq):
        self.points, self.fit, self.check, self.has_seq = points, fit, check, has_seq

    def extent(self, vals: Dict[Tuple[int, int], int], what: str) -> Tuple[List[int], bool]:
        """vals[(b, s)] -> ([c0, c1, c2], per_batch)."""
        if not self.has_seq:
            b0 = self.fit[0][0]
            per = Fraction(vals[self.fit[0]], b0)
            if per.denominator == 1 and all(b * per == vals[(b, s)] for b, s in self.points):
                return [int(per), 0, 0], True
            if all(vals[p] == vals[self.fit[0]] for p in self.points):
                return [vals[self.fit[0]], 0, 0], False
            raise TraceError("gpumem.trace: %s does not scale with the batch as b*c or stay constant: %s" % (what, _pts(vals)))
        per_b = _solve3([(s, Fraction(vals[(b, s)], b)) for b, s in self.fit])
        if all(c.denominator == 1 for c in per_b) and per_b[1] >= 0 and per_b[2] >= 0 and all(
                b * (per_b[0] + per_b[1] * s + per_b[2] * s * s) == vals[(b, s)] for b, s in self.check):
            return [int(c) for c in per_b], True
        flat = _solve3([(s, vals[(b, s)]) for b, s in self.fit])
        if all(c.denominator == 1 for c in flat) and flat[1] >= 0 and flat[2] >= 0 and all(
                flat[0] + flat[1] * s + flat[2] * s * s == vals[(b, s)] for b, s in self.check):
            return [int(c) for c in flat], False
        raise TraceError("gpumem.trace: the size of %s is not b*(c0 + c1*s + c2*s^2) nor c0 + c1*s + c2*s^2 in the "
                         "batch b and sequence s (%s): the model's shapes depend on the input in a way gpumem "
                         "cannot extrapolate (pass seq_dim=None for fixed-shape inputs)" % (what, _pts(vals)))


def _pts(vals) -> str:
    return ", ".join("b=%d s=%d: %d" % (b, s, v) for (b, s), v in sorted(vals.items()))


# ----------------------------------------------------------------------------
# op kinds, roles, components
# ----------------------------------------------------------------------------
_VIEW_OPS = {"view", "_reshape_alias", "_unsafe_view", "t", "transpose", "permute", "slice", "select", "split",
             "expand", "unsqueeze", "squeeze", "detach", "alias", "as_strided", "unbind", "chunk", "narrow",
             "diagonal", "unfold", "view_as", "reshape", "flatten", "split_with_sizes", "_unsafe_split",
             "lift_fresh", "numpy_T", "movedim", "unflatten"}
_ACTS = {"gelu", "silu", "relu", "relu_", "tanh", "sigmoid", "gelu_", "silu_", "hardtanh", "hardtanh_",
         "leaky_relu", "leaky_relu_", "elu", "elu_", "mish", "hardswish", "hardsigmoid", "softplus", "threshold",
         "threshold_"}
_LOSS_FNS = {"cross_entropy", "nll_loss", "mse_loss", "l1_loss", "binary_cross_entropy_with_logits",
             "binary_cross_entropy", "smooth_l1_loss", "huber_loss", "kl_div"}
_MATMULS = {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "convolution", "_convolution", "addmv", "mv"}


def _kind(name: str, param_in: bool, is_loss_root: bool) -> str:
    if is_loss_root:
        return "loss"
    if name == "sdpa":
        return "attention"
    if name in ("mm", "addmm", "bmm", "baddbmm", "linear", "matmul", "addmv", "mv"):
        return "linear" if param_in else "matmul"
    if name == "embedding":
        return "embedding"
    if name in ("_softmax", "softmax", "_log_softmax", "log_softmax"):
        return "softmax"
    if name == "native_layer_norm":
        return "layernorm"
    if name == "native_dropout":
        return "dropout"
    if name in _ACTS:
        return "activation"
    if name in ("add", "add_"):
        return "add"
    if name in ("mul", "mul_"):
        return "mul"
    if name == "_to_copy":
        return "cast"
    if name in _VIEW_OPS:
        return "view"
    if name in ("convolution", "_convolution"):
        return "conv2d"
    if name in ("native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional"):
        return "batchnorm2d"
    if name == "max_pool2d_with_indices":
        return "maxpool2d"
    if name == "avg_pool2d":
        return "avgpool2d"
    if name == "_adaptive_avg_pool2d":
        return "adaptive_avgpool2d"
    return "elementwise"


def _component(pname: str, module_type: str) -> str:
    p = pname.lower()
    mt = module_type.lower()
    if mt == "embedding" or "embed" in p or p.startswith("wte") or p.startswith("wpe") or ".wte." in p or ".wpe." in p:
        return "embeddings"
    if "norm" in mt or re.search(r"(^|\.)(ln|norm|layernorm|bn)[_\w]*\.", p):
        return "norms"
    if "lm_head" in p or p.startswith("head") or ".head." in p:
        return "head"
    if "attention" in mt or re.search(r"attn|attention|q_proj|k_proj|v_proj|o_proj|qkv", p):
        return "attention"
    if re.search(r"mlp|ffn|fc|feed_forward|gate_proj|up_proj|down_proj", p):
        return "mlp"
    return "other"


_ROLE_RANK = {"float32": 4, "float32_unless_fp16": 4, "stream": 3, "upcast": 2, "lowered": 1}


_INT = ("int64", "int32", "int16")
_BYTE = ("bool", "uint8", "int8")


def _roles(tr: _Trace) -> Dict[int, str]:
    """Role of every storage root. The structure traces run the model in bfloat16, so
    every cast the model makes is a real op and every dtype tells: fp32 tensors are
    explicit upcasts ("float32": RMSNorm's hidden_states.to(float32), softmax(dtype=
    float32)), 16-bit ones follow the precision ("stream"). On top, autocast's op lists
    (aten/src/ATen/autocast_mode.cpp) are emulated: matmul/conv outputs are "lowered"
    and so is what follows only them; softmax/log_softmax/layer_norm outputs run in
    fp32 under autocast ("upcast")."""
    role: Dict[int, str] = {}
    for p in tr.params + tr.buffers:
        role[tr.tensors[p["tensor"]]["base"]] = "stream"

    def of(tid):
        t = tr.tensors[tid]
        if t["dtype"] in _INT:
            return "index64"
        if t["dtype"] in _BYTE:
            return "mask8"
        if t["dtype"] == "float32":
            return "float32"
        return role.get(t["base"], "stream")

    for tid in tr.inputs:
        role[tr.tensors[tid]["base"]] = of(tid) if tr.tensors[tid]["dtype"] in _INT + _BYTE else "stream"
    for op in tr.aten_ops:
        name = _aten_name(op["op"])
        half_in = [of(t) for t in op["inputs"] if of(t) in ("stream", "upcast", "lowered")]
        for i, (t, kind) in enumerate(zip(op["outputs"], op["kinds"])):
            tt = tr.tensors[t]
            if kind != "new":
                continue
            if tt["dtype"] in _INT:
                r = "index64"
            elif tt["dtype"] in _BYTE:
                r = "mask8"
            elif tt["dtype"] == "float32":
                r = "float32"
            elif name in _MATMULS:
                r = "lowered"
            elif name in ("_softmax", "_log_softmax") or (name == "native_layer_norm" and i == 0):
                r = "upcast"
            elif name == "_to_copy":
                r = "stream"  # a cast back to the model's dtype
            elif half_in:
                r = max(half_in, key=lambda x: _ROLE_RANK[x])
            else:
                r = "stream"
            role[tt["base"]] = r
    # softmax(x, dtype=float32) copies x to fp32 inside the one call, but for CUDA fp16, where
    # the fused half_to_float kernel reads x itself (aten/src/ATen/native/SoftMax.cpp
    # softmax(input, dim, dtype)); a separate x.float() copies in every dtype
    for op in tr.aten_ops:
        if _aten_name(op["op"]) in ("_softmax", "_log_softmax") and op["inputs"] and op["fn"] is not None:
            src = tr.tensors[op["inputs"][0]]["base"]
            p = tr.tensors[src]["producer"]
            if p is not None and _aten_name(tr.aten_ops[p]["op"]) == "_to_copy" and tr.aten_ops[p]["fn"] == op["fn"] \
                    and role.get(src) == "float32":
                role[src] = "float32_unless_fp16"
    return role


# ----------------------------------------------------------------------------
# layers: children of one container with identical op signatures fold into a block
# ----------------------------------------------------------------------------
def _layer_candidates(tr: _Trace) -> List[Tuple[str, List[str]]]:
    """(stem, [child paths in call order]) for every container whose children are
    named stem + index (h.0, layers.12, encoder.layers.encoder_layer_3)."""
    groups: Dict[str, Dict[int, str]] = {}
    first: Dict[str, int] = {}
    paths: List[str] = []
    seen = set()
    for op in tr.aten_ops:  # every module path ops ran in, and its prefixes (ModuleDicts are never called)
        parts = op["module"].split(".") if op["module"] else []
        for k in range(1, len(parts) + 1):
            q = ".".join(parts[:k])
            if q not in seen:
                seen.add(q)
                paths.append(q)
    for order, p in enumerate(paths):
        m = re.match(r"^(.*?)(\d+)$", p)
        if not m or (m.group(1) and not m.group(1).endswith(".") and not re.search(r"[._a-zA-Z]$", m.group(1))):
            continue
        groups.setdefault(m.group(1), {})[int(m.group(2))] = p
        first.setdefault(m.group(1), order)
    out = []
    for stem, kids in groups.items():
        idx = sorted(kids)
        if len(idx) >= 2 and idx == list(range(idx[0], idx[0] + len(idx))):
            out.append((stem, [kids[i] for i in idx]))
    out.sort(key=lambda c: (-len(c[1]), first[c[0]]))
    return out


def _in_module(module: str, path: str) -> bool:
    return module == path or module.startswith(path + ".")


def _segment(tr: _Trace, children: List[str]):
    """aten op index lists: before the layers, each layer, after; None when other
    ops run between the layers or the layers differ."""
    owner = []
    for op in tr.aten_ops:
        owner.append(next((k for k, c in enumerate(children) if _in_module(op["module"], c)), None))
    if 0 not in owner or (len(children) - 1) not in owner:
        return None
    first = owner.index(0)
    last = len(owner) - 1 - owner[::-1].index(len(children) - 1)
    layers: List[List[int]] = [[] for _ in children]
    expect = 0
    for i in range(first, last + 1):
        k = owner[i]
        if k is None or k < expect:
            return None
        expect = k
        layers[k].append(i)
    sigs = []
    for k, ops in enumerate(layers):
        sig = []
        for i in ops:
            op = tr.aten_ops[i]
            sig.append((op["op"], op["module"].replace(children[k], "L", 1),
                        tuple(tuple(tr.tensors[t]["shape"]) for t in op["outputs"])))
        sigs.append(sig)
    if any(s != sigs[0] for s in sigs[1:]) or not sigs[0]:
        return None
    return list(range(0, first)), layers, list(range(last + 1, len(tr.aten_ops)))


# ----------------------------------------------------------------------------
# the graph
# ----------------------------------------------------------------------------
def _numel(shape) -> int:
    return _prod(shape)


_DTYPE_SIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4, "int16": 2,
               "bool": 1, "uint8": 1, "int8": 1, "complex64": 8}


def _build(traces: Dict[Tuple[int, int], _Trace], fitter: _Fitter, name: str, has_seq: bool, torch_ver: str,
           loss_note: Optional[str]) -> Dict[str, Any]:
    ref_key = fitter.fit[0]
    tr = traces[ref_key]
    sig0 = [op["op"] for op in tr.aten_ops]
    for k, t in traces.items():
        if [op["op"] for op in t.aten_ops] != sig0 or len(t.tensors) != len(tr.tensors):
            raise TraceError("gpumem.trace: the model runs different operators at batch %d, seq %d than at batch %d, "
                             "seq %d (shape-dependent control flow): gpumem cannot extrapolate it" % (k + ref_key))
    notes: List[str] = []
    if loss_note:
        notes.append(loss_note)
    role = _roles(tr)
    # blocks
    blocks_src: List[Tuple[str, List[int], int, str]] = []
    layer_paths: List[str] = []
    for stem, children in _layer_candidates(tr):
        seg = _segment(tr, children)
        if seg is None:
            continue
        pre, layers, post = seg
        layer_paths = children
        blocks_src = [("embeddings", pre, 1, ""), ("layers", layers[0], len(children), children[0]),
                      ("head", post, 1, "")]
        break
    if not blocks_src:
        blocks_src = [("model", list(range(len(tr.aten_ops))), 1, "")]
    fold_ops = {}  # op index in layer k > 0 -> the layers block
    layer_ops: List[List[int]] = []
    if layer_paths:
        layer_ops = _segment(tr, layer_paths)[1]
        for k in range(1, len(layer_paths)):
            for i in layer_ops[k]:
                fold_ops[i] = 1
    produced_in: Dict[int, int] = {}
    for bi, (_, ops, _, _) in enumerate(blocks_src):
        for i in ops:
            for t in tr.aten_ops[i]["outputs"]:
                produced_in.setdefault(tr.tensors[t]["base"], bi)
    for i in fold_ops:
        for t in tr.aten_ops[i]["outputs"]:
            produced_in.setdefault(tr.tensors[t]["base"], 1)
    param_of = {p["tensor"]: p for p in tr.params}
    nonact = {i for i, t in enumerate(tr.tensors) if t["kind"] in ("param", "buffer")}
    # a float-to-float cast's output: one storage with its source when both resolve to one
    # dtype (the model graph's alias_of rule), as `.to()` returns its input then
    cast_src: Dict[int, int] = {}
    for op in tr.aten_ops:
        if _aten_name(op["op"]) == "_to_copy" and op["inputs"] and op["kinds"] == ["new"]:
            src, dst = op["inputs"][0], op["outputs"][0]
            if tr.tensors[src]["dtype"] not in _INT + _BYTE and tr.tensors[dst]["dtype"] not in _INT + _BYTE:
                cast_src[dst] = src
    nonact_storage = {tr.tensors[i]["storage"] for i in nonact}
    input_tids = set(tr.inputs)
    loss_root = None
    for i in reversed(range(len(tr.aten_ops))):
        op = tr.aten_ops[i]
        if any(tr.tensors[t]["base"] == tr.tensors[tr.output[0]]["base"] for t in op["outputs"]):
            loss_root = i
            break
    # the Linear whose output reaches the loss through views/casts/softmax: the output head
    head_ops = set()
    if loss_root is not None:
        frontier = {tr.tensors[t]["base"] for t in tr.aten_ops[loss_root]["inputs"]}
        for i in reversed(range(loss_root)):
            op = tr.aten_ops[i]
            if not any(tr.tensors[t]["base"] in frontier for t in op["outputs"]):
                continue
            n = _aten_name(op["op"])
            if n in ("mm", "addmm", "bmm", "linear", "matmul") and any(tr.tensors[t]["base"] in param_of for t in op["inputs"]):
                head_ops.add(i)
                break
            frontier |= {tr.tensors[t]["base"] for t in op["inputs"] if t not in nonact}

    def layer_input(k):
        """Layer k's first tensor argument (forward pre-hook), or the first activation its first op reads."""
        if layer_paths[k] in tr.layer_inputs:
            return tr.layer_inputs[layer_paths[k]]
        i0 = layer_ops[k][0]
        return next(t for t in tr.aten_ops[i0]["inputs"] if t not in nonact and tr.tensors[t]["base"] not in nonact)

    def vals_of(tid, use_storage):
        out = {}
        for k, t in traces.items():
            x = t.tensors[tid]
            out[k] = x["nbytes"] // _DTYPE_SIZE.get(x["dtype"], 4) if use_storage else _numel(x["shape"])
        return out

    graph: Dict[str, Any] = {
        "format": FORMAT, "version": VERSION, "name": name, "family": "traced",
        "source": "gpumem.trace (torch %s, meta device)" % torch_ver, "has_sequence": has_seq,
        "loss_in_forward": tr.loss_in_forward,
        "trace": {"torch": torch_ver, "points": [list(p) for p in fitter.points]},
        "blocks": [], "notes": notes, "transformer": None,
    }
    used_params: Dict[str, Tuple[int, int]] = {}
    for bi, (bname, ops, repeat, strip) in enumerate(blocks_src):
        local: Dict[int, int] = {}
        tensors: List[Dict[str, Any]] = []
        block_ops: List[Dict[str, Any]] = []
        params: List[Dict[str, Any]] = []
        pidx: Dict[str, int] = {}

        def rel(mod, strip=strip):
            if strip and _in_module(mod, strip):
                return mod[len(strip) + 1:]
            return mod

        def add_tensor(tid, shared=None, _local=local, _tensors=tensors, _rel=rel):
            if tid in _local:
                return _local[tid]
            t = tr.tensors[tid]
            root = t["base"]
            alias = -1
            if root in nonact:
                return None
            if root == tid and tid in cast_src and tr.tensors[cast_src[tid]]["base"] not in nonact and not shared:
                alias = add_tensor(cast_src[tid])
                if alias is None:
                    alias = -1
            if root != tid:
                alias = add_tensor(root, shared)
                if alias is None:
                    return None
            ext, per_batch = fitter.extent(vals_of(tid, root == tid), "tensor t%d (%s, made in module %r)" % (
                tid, t["dtype"], t["module"] or "<root>"))
            label = t["name"] or "%s:%s" % (_rel(t["module"]) or "<root>", _aten_name(tr.aten_ops[t["producer"]]["op"])
                                            if t["producer"] is not None else "t%d" % tid)
            info = {"name": label, "extent": ext, "role": role.get(root, "stream"), "alias_of": alias}
            if not per_batch:
                info["per_batch"] = False
            if shared and alias < 0:
                info["shared_key"] = shared
            _local[tid] = len(_tensors)
            _tensors.append(info)
            return _local[tid]

        # tensors[0]: the block input
        if bname == "layers":
            add_tensor(layer_input(0))
        elif bi > 0:
            cand = [t for i in ops for t in tr.aten_ops[i]["inputs"]
                    if t not in nonact and produced_in.get(tr.tensors[t]["base"], bi) < bi]
            if cand:
                add_tensor(cand[0])
        if not tensors:  # the first block: the model's inputs come from input ops, as the builders' data()
            tensors.append({"name": "(no input)", "extent": [0, 0, 0], "role": "stream", "alias_of": -1})
        for i in ops:
            op = tr.aten_ops[i]
            n = _aten_name(op["op"])
            param_in = [t for t in op["inputs"] if tr.tensors[t]["base"] in param_of]
            kind = _kind(n, bool(param_in), i == loss_root)
            if kind == "conv2d" and not param_in:
                kind = "elementwise"
            rec: Dict[str, Any] = {"kind": kind, "name": rel(op["module"]) or n, "inputs": [], "outputs": [],
                                   "saved": [], "params": []}
            for t in op["inputs"]:
                if t in nonact or tr.tensors[t]["base"] in nonact:
                    continue
                if t in input_tids and t not in local:
                    # a model input (ids, images, labels, masks): an input op makes it, shared so that a
                    # later block (or layer) reading the same input names the same storage
                    lid = add_tensor(t, "trace:input:%s" % (tr.tensors[t]["name"] or t))
                    block_ops.append({"kind": "input", "name": tr.tensors[t]["name"] or "input", "inputs": [],
                                      "outputs": [lid], "saved": [], "params": []})
                shared = None
                owner = produced_in.get(tr.tensors[t]["base"])
                root_local = tr.tensors[t]["base"] in local or t in local
                if not root_local and owner is not None and owner != bi and bname == "layers":
                    shared = "trace:t%d" % tr.tensors[t]["base"]  # made once elsewhere, read by every layer
                lid = add_tensor(t, shared)
                if lid is not None and lid not in rec["inputs"]:
                    rec["inputs"].append(lid)
            for t, okind in zip(op["outputs"], op["kinds"]):
                lid = add_tensor(t)
                if lid is None:
                    continue
                if okind == "inplace":
                    # a new version of the same storage (relu_, add_): an alias, so that no
                    # new memory is made; later reads and saves name this version
                    src = tensors[lid]
                    tensors.append({"name": src["name"] + " (in place)", "extent": src["extent"],
                                    "role": src["role"], "alias_of": lid})
                    if src.get("per_batch") is False:
                        tensors[-1]["per_batch"] = False
                    lid = len(tensors) - 1
                    local[t] = lid
                if lid not in rec["outputs"]:
                    rec["outputs"].append(lid)
            for t in op["saved"]:
                x = tr.tensors[t]
                if x["storage"] in nonact_storage:
                    continue
                if x["dtype"] == "float64" and not x["shape"]:
                    continue  # a Python number wrapped as a 0-dim CPU tensor: host memory on CUDA
                lid = add_tensor(t)
                if lid is None:
                    continue
                only_param = kind in ("linear", "conv2d", "embedding")
                autocast = kind in ("linear", "matmul", "conv2d") and tensors[lid]["role"] not in \
                    ("lowered", "index64", "mask8")
                rec["saved"].append({"tensor": lid, "only_for_param_grad": only_param, "autocast_cast": autocast})
            for t in param_in:
                p = param_of[tr.tensors[t]["base"]]
                if p["name"] in used_params and p["name"] not in pidx:
                    continue  # a tied weight owned by an earlier block (a tied lm_head)
                if p["name"] not in pidx:
                    pidx[p["name"]] = len(params)
                    pname = rel(p["name"].rpartition(".")[0])
                    pname = (pname + "." if pname else "") + p["name"].rpartition(".")[2]
                    params.append({"name": pname, "shape": p["shape"] or [1], "dtype": p["dtype"],
                                   "component": _component(p["name"], p["module_type"]),
                                   "trainable": p["requires_grad"], "linear_weight": False,
                                   "module": p["name"].rsplit(".", 2)[-2] if "." in p["name"] else ""})
                    used_params[p["name"]] = (bi, pidx[p["name"]])
                if pidx[p["name"]] not in rec["params"]:
                    rec["params"].append(pidx[p["name"]])
                if kind == "linear" and len(p["shape"]) == 2:
                    params[pidx[p["name"]]]["linear_weight"] = True
            if kind == "linear":
                shp = next((tr.tensors[t]["shape"] for t in param_in if len(tr.tensors[t]["shape"]) == 2), None)
                if shp is not None:  # the operand as mm/addmm reads it: [in, out] (W.t() for nn.Linear)
                    rec["in_features"], rec["out_features"] = shp[0], shp[1]
            if n in ("cat", "stack", "_cat"):
                rec["flags"] = 8  # backward: views of the output's gradient (cat_tensors_backward)
            if i in head_ops:
                rec["flags"] = rec.get("flags", 0) | 4
                for pi in rec["params"]:
                    params[pi]["output_head"] = True
            if any(tensors[o]["extent"][2] > 0 for o in rec["outputs"]) and kind in (
                    "matmul", "softmax", "dropout", "elementwise", "mul", "add"):
                rec["flags"] = rec.get("flags", 0) | 1  # attention scores and what follows them
            fl = {k: t.aten_ops[i]["flops"] for k, t in traces.items()}
            if any(fl.values()):
                try:
                    rec["flops"] = fitter.extent(fl, "the FLOPs of op %d" % i)[0]
                except TraceError:
                    notes.append("FLOPs of %s (%s) could not be fitted; counted as 0" % (rec["name"], n))
            if not rec["inputs"] and not rec["outputs"] and not rec["saved"]:
                continue  # an op on parameters or buffers only (a weight's .t(), a running-stat update)
            block_ops.append(rec)
        out = 0
        if bi + 1 < len(blocks_src):
            nxt = blocks_src[bi + 1]
            out_tid = layer_input(0) if nxt[0] == "layers" else None
            if bname == "layers":
                out_tid = layer_input(1) if len(layer_paths) > 1 else None
            if out_tid is not None and out_tid in local:
                out = local[out_tid]
            elif bname != "layers":
                cand = [t for i in blocks_src[bi + 1][1] for t in tr.aten_ops[i]["inputs"]
                        if tr.tensors[t]["base"] in local or t in local]
                if cand:
                    out = local.get(cand[0], local.get(tr.tensors[cand[0]]["base"], 0))
        graph["blocks"].append({"name": bname, "repeat": repeat, "checkpointable": bname == "layers",
                                "params": params, "tensors": tensors, "ops": block_ops, "output": out})
    unused = [p["name"] for p in tr.params if p["name"] not in used_params
              and not any(_in_module(p["name"].rpartition(".")[0], q) for q in layer_paths[1:])]
    if unused:
        # parameters no op read (an unused head, cls tokens added through a view op...): kept for the
        # model states, in the first block
        b0 = graph["blocks"][0]
        for pn in unused:
            p = next(q for q in tr.params if q["name"] == pn)
            b0["params"].append({"name": pn, "shape": p["shape"] or [1], "dtype": p["dtype"],
                                 "component": _component(pn, p["module_type"]), "trainable": p["requires_grad"],
                                 "module": pn.rsplit(".", 2)[-2] if "." in pn else ""})
        notes.append("%d parameter tensor(s) read by no traced op (kept in the model states): %s" % (
            len(unused), ", ".join(unused[:5]) + (" ..." if len(unused) > 5 else "")))
    return graph


def saved_bytes_of_graph(graph: Dict[str, Any], batch: int, seq: int, dtype_bytes: int = 4) -> int:
    """The fp32 saved-activation bytes a graph file describes, by gpumem's rule
    (src/memory/activations.cpp): per block instance, saves deduplicated by storage
    root; a block output that the block saves and the next instance (or block)
    saves again as its input counted once; shared tensors once per model. The
    check trace() runs against a direct trace."""
    size = {"index64": 8, "mask8": 1}
    total, shared = 0, {}
    prev_saves_output = False
    for blk in graph["blocks"]:
        ts = blk["tensors"]

        def root(i, ts=ts):
            while ts[i]["alias_of"] >= 0:
                i = ts[i]["alias_of"]
            return i

        def nbytes(r, ts=ts):
            t = ts[r]
            c0, c1, c2 = t["extent"]
            n = max(0, c0 + c1 * seq + c2 * seq * seq) * (batch if t.get("per_batch", True) else 1)
            return n * size.get(t["role"], dtype_bytes)
        seen, per = set(), 0
        for op in blk["ops"]:
            for sv in op["saved"]:
                r = root(sv["tensor"])
                if r in seen:
                    continue
                seen.add(r)
                if ts[r].get("shared_key"):
                    shared[ts[r]["shared_key"]] = nbytes(r)
                else:
                    per += nbytes(r)
        r0, ro = root(0), root(blk.get("output", 0))
        saves_input = r0 in seen and not ts[r0].get("shared_key")
        saves_output = ro in seen and ro != r0
        total += per * blk["repeat"]
        if prev_saves_output and saves_input:
            total -= nbytes(r0)
        if saves_input and saves_output:
            total -= nbytes(r0) * (blk["repeat"] - 1)
        prev_saves_output = saves_output
    return total + sum(shared.values())


def _direct_saved_bytes(tr: _Trace) -> int:
    excl = {tr.tensors[p["tensor"]]["storage"] for p in tr.params + tr.buffers}
    seen: Dict[int, int] = {}
    for tid in tr.saved:
        t = tr.tensors[tid]
        if t["storage"] in excl or t["storage"] in tr.dropped_storages or (t["dtype"] == "float64" and not t["shape"]):
            continue
        seen.setdefault(t["storage"], t["nbytes"])
    return sum(seen.values())


# ----------------------------------------------------------------------------
# inputs and the loss
# ----------------------------------------------------------------------------
def _make_inputs(torch, example_inputs, batch_dim, seq_dim):
    """-> f(b, s) -> (args, kwargs) on meta."""
    if callable(example_inputs) and not isinstance(example_inputs, torch.Tensor):
        def f(b, s):
            x = example_inputs(b, s)
            return _split_args(torch, x)
        return f
    args, kwargs = _split_args(torch, example_inputs)

    def resize(x, b, s):
        if not isinstance(x, torch.Tensor):
            return x
        shape = list(x.shape)
        if x.dim() > batch_dim:
            shape[batch_dim] = b
        if seq_dim is not None and x.dim() > seq_dim:
            shape[seq_dim] = s
        return torch.empty(shape, dtype=x.dtype, device="meta")

    def f(b, s):
        return [resize(x, b, s) for x in args], {k: resize(v, b, s) for k, v in kwargs.items()}
    return f


def _split_args(torch, x):
    if isinstance(x, dict):
        return [], dict(x)
    if isinstance(x, torch.Tensor):
        return [x], {}
    if isinstance(x, (list, tuple)):
        return list(x), {}
    raise TraceError("gpumem.trace: example_inputs must be a tensor, a tuple/list of them, a dict of keyword "
                     "arguments, or a function (batch, seq) -> one of those (got %s)" % type(x).__name__)


def _loss_fn(torch, loss):
    """-> (callable(out) -> scalar, note or None)."""
    if callable(loss):
        return loss, None

    def first(out):
        if isinstance(out, torch.Tensor):
            return out
        if isinstance(out, dict) or hasattr(out, "keys"):
            if "loss" in out and isinstance(out["loss"], torch.Tensor):
                return out["loss"]
            vals = [v for v in out.values() if isinstance(v, torch.Tensor)]
        else:
            vals = _flat(torch, out)
        if not vals:
            raise TraceError("gpumem.trace: the model returned no tensor")
        return vals[0]

    if loss in (None, "auto"):
        def auto(out):
            t = first(out)
            return t if t.dim() == 0 else t.sum()
        return auto, None
    if loss == "sum":
        return (lambda out: first(out).sum()), "loss: the sum of the model's output (--loss sum)"
    if loss == "mean":
        return (lambda out: first(out).mean()), "loss: the mean of the model's output (--loss mean)"
    if loss in ("cross-entropy", "cross_entropy"):
        def ce(out):
            t = first(out)
            rows = t.reshape(-1, t.shape[-1])
            labels = torch.zeros(rows.shape[0], dtype=torch.long, device=t.device)
            return torch.nn.functional.cross_entropy(rows, labels)
        return ce, "loss: cross-entropy over the output's last dimension with int64 labels (--loss cross-entropy)"
    raise TraceError("gpumem.trace: loss must be sum, mean, cross-entropy or a function (got %r)" % (loss,))


# ----------------------------------------------------------------------------
# the entry point
# ----------------------------------------------------------------------------
def trace(model, example_inputs, *, loss: Any = None, out: Optional[str] = None, name: Optional[str] = None,
          batch_dim: int = 0, seq_dim: Optional[int] = None, seq_points: Sequence[int] = FIT_SEQ,
          has_sequence: Optional[bool] = None, cuda_semantics: bool = True,
          modern_saves: bool = True) -> Dict[str, Any]:
    """Trace ``model`` on the meta device and return gpumem's model graph (a dict;
    also written to ``out`` when given).

    model: an ``nn.Module`` or, better, a function returning one (it is then built
    on meta: no weight memory, tied weights stay tied).
    example_inputs: a tensor, tuple/list of tensors or dict of keyword tensors,
    remade at each trace point with ``batch_dim`` set to the batch and ``seq_dim``
    (if given) to the sequence; or a function ``(batch, seq) -> inputs``.
    loss: None (the output if it is a scalar, else its sum), "sum", "mean",
    "cross-entropy", or a function ``output -> scalar loss``.
    seq_dim: the inputs' sequence dimension; None for fixed-shape inputs (images):
    then only the batch varies and ``has_sequence`` is false.
    has_sequence: for a function of (batch, seq): whether seq changes the shapes
    (default: true when the function takes two arguments).
    cuda_semantics: dropout saves CUDA's 1-byte mask (native_dropout), not CPU's noise.
    modern_saves: on torch < 2.0, drop the saves torch >= 2.0 no longer makes
    (mean.dim's input), so that the graph answers for the torch a GPU job runs.
    """
    torch = _torch()
    check_torch(torch)
    is_fn = callable(example_inputs) and not isinstance(example_inputs, torch.Tensor)
    if has_sequence is not None:
        has_seq = bool(has_sequence)
    else:
        has_seq = seq_dim is not None or (is_fn and _takes_seq(example_inputs))
    if is_fn and not has_seq and not _takes_seq(example_inputs):
        one = example_inputs
        example_inputs = lambda b, s: one(b)  # noqa: E731
    a, b, c = (int(x) for x in seq_points)
    if not (0 < a < b < c):
        raise TraceError("gpumem.trace: seq_points must be three increasing positive lengths (got %r)" % (seq_points,))
    if has_seq:
        fit = [(2, a), (2, b), (2, c)]
        check = [(3, a + b), (4, a + c)]
    else:
        fit = [(2, 0), (3, 0)]
        check = [(4, 0), (5, 0)]
    points = fit + check
    make = _make_inputs(torch, example_inputs, batch_dim, seq_dim)
    loss_fn, loss_note = _loss_fn(torch, loss)
    def run(bs, dtype):
        m = _model_on_meta(torch, model)
        m.train()
        args, kwargs = make(*bs)

        def prep(x):
            if not isinstance(x, torch.Tensor):
                return x
            x = x.to("meta") if x.device.type != "meta" else x
            return x.to(dtype) if x.is_floating_point() and dtype != torch.float32 else x
        own = {n: _dtype_name(p.dtype) for n, p in m.named_parameters()}
        if dtype != torch.float32:
            m = m.to(dtype)
        tr = _run_trace(torch, m, [prep(x) for x in args], {k: prep(v) for k, v in kwargs.items()}, loss_fn,
                        cuda_semantics, modern_saves)
        for p in tr.params:  # the dtype the model's own parameters have
            p["dtype"] = own.get(p["name"], p["dtype"])
        return tr

    # The structure traces run in bfloat16: every cast the model makes (RMSNorm's
    # .to(float32), softmax(dtype=float32) and the cast back) is then a real op with
    # its own output, where in fp32 it would return its input. fp32 traces at two
    # points check the graph's fp32 reading against what an fp32 run keeps.
    traces: Dict[Tuple[int, int], _Trace] = {}
    fp32_checks: Dict[Tuple[int, int], _Trace] = {}
    notes_extra: List[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            for bs in points:
                traces[bs] = run(bs, torch.bfloat16)
        except (TraceError, RuntimeError, TypeError, NotImplementedError) as e:
            traces = {}
            notes_extra.append("traced in fp32 (a bfloat16 trace failed: %s): casts that are no-ops in fp32 "
                               "are not seen, so 16-bit precisions are approximate" % str(e).splitlines()[0][:200])
            for bs in points:
                traces[bs] = run(bs, torch.float32)
        for bs in check:
            fp32_checks[bs] = run(bs, torch.float32)
    fitter = _Fitter(points, fit, check, has_seq)
    if name is None:
        name = getattr(model, "__name__", None) or type(model).__name__
        if name == "<lambda>":
            name = "traced-model"
    graph = _build(traces, fitter, name, has_seq, torch.__version__, loss_note)
    graph["notes"].extend(notes_extra)
    # self-check: read in fp32, the file gives what fp32 runs keep
    for (bb, ss), t in fp32_checks.items():
        want = _direct_saved_bytes(t)
        got = saved_bytes_of_graph(graph, bb, ss)
        if got != want:
            raise TraceError("gpumem.trace: internal check failed: the graph gives %d saved bytes at batch %d, seq %d "
                             "where the trace kept %d; please report this model" % (got, bb, ss, want))
    if out is not None:
        with open(out, "w") as f:
            json.dump(graph, f, indent=1, sort_keys=False)
            f.write("\n")
    return graph


def _takes_seq(fn) -> bool:
    try:
        ps = [p for p in inspect.signature(fn).parameters.values()
              if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        return len(ps) >= 2
    except (TypeError, ValueError):
        return True


# ----------------------------------------------------------------------------
# command line: python3 -m gpumem.trace SCRIPT:FACTORY [--input SPEC]... --out FILE
# ----------------------------------------------------------------------------
_SPEC_HELP = ("--input SHAPE[:DTYPE[:HIGH]]: one positional input; SHAPE is comma-separated sizes where 'b' is the "
              "batch and 's' the sequence (b,s  b,3,224,224); DTYPE float32 (default), float16, bfloat16, int64, "
              "bool; e.g. --input b,s:int64 --input b,s:int64 for input_ids and labels")


def _parse_spec(torch, spec: str):
    parts = spec.split(":")
    dims = [d.strip() for d in parts[0].split(",") if d.strip()]
    if not dims:
        raise TraceError("gpumem trace: --input %r has no shape; %s" % (spec, _SPEC_HELP))
    for d in dims:
        if d not in ("b", "s") and not (d.isdigit() and int(d) > 0):
            raise TraceError("gpumem trace: --input %r: dimension %r is not b, s or a positive integer; %s"
                             % (spec, d, _SPEC_HELP))
    dt = parts[1] if len(parts) > 1 and parts[1] else "float32"
    if not hasattr(torch, dt) or not isinstance(getattr(torch, dt), torch.dtype):
        raise TraceError("gpumem trace: --input %r: %r is not a torch dtype; %s" % (spec, dt, _SPEC_HELP))
    return dims, getattr(torch, dt)


def _load_factory(target: str):
    path, sep, attr = target.rpartition(":")
    if not sep or not path or not attr:
        raise TraceError("gpumem trace: MODEL must be SCRIPT.py:FUNCTION (a function that returns the nn.Module), "
                         "got %r" % target)
    if not os.path.isfile(path):
        raise TraceError("gpumem trace: %s: no such file" % path)
    spec = importlib.util.spec_from_file_location("_gpumem_traced_script", path)
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        spec.loader.exec_module(mod)  # type: ignore[union-attr]
    finally:
        sys.path.pop(0)
    fn = getattr(mod, attr, None)
    if fn is None or not callable(fn):
        raise TraceError("gpumem trace: %s has no function %r" % (path, attr))
    return fn, mod


def main(argv: Optional[Sequence[str]] = None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="gpumem trace", description="Trace a PyTorch model on the meta device into a "
                                 "gpumem model graph file (any gpumem command takes it as MODEL).")
    ap.add_argument("model", help="SCRIPT.py:FUNCTION, a function returning the torch.nn.Module")
    ap.add_argument("--input", action="append", default=[], metavar="SPEC", help=_SPEC_HELP)
    ap.add_argument("--inputs", metavar="SCRIPT.py:FUNCTION", help="a function (batch, seq) -> the inputs "
                    "(tensor, tuple or dict), instead of --input")
    ap.add_argument("--loss", default=None, help="sum | mean | cross-entropy, for models whose output is not "
                    "a scalar loss (default: the output if scalar, else its sum)")
    ap.add_argument("--out", "-o", default=None, help="the graph file to write (default: stdout)")
    ap.add_argument("--name", default=None, help="the model's name in gpumem's answers")
    ap.add_argument("--seq-points", default="8,16,32", help="three sequence lengths to trace at (default 8,16,32)")
    ap.add_argument("--no-cuda-dropout", action="store_true", help="keep CPU dropout semantics (float noise)")
    ns = ap.parse_args(argv)
    try:
        torch = _torch()
        check_torch(torch)
        factory = _load_factory(ns.model)[0]
        if ns.inputs:
            example: Any = _load_factory(ns.inputs)[0]
            has_seq = True
        else:
            if not ns.input:
                raise TraceError("gpumem trace: give the model's inputs with --input (or --inputs); %s" % _SPEC_HELP)
            specs = [_parse_spec(torch, s) for s in ns.input]
            has_seq = any("s" in dims for dims, _ in specs)


            def example(b, s, specs=specs):
                out = []
                for dims, dt in specs:
                    shape = [b if d == "b" else s if d == "s" else int(d) for d in dims]
                    out.append(torch.empty(shape, dtype=dt, device="meta"))
                return tuple(out)
        try:
            pts = tuple(int(x) for x in ns.seq_points.split(","))
        except ValueError:
            raise TraceError("gpumem trace: --seq-points must be three integers, e.g. 8,16,32") from None
        if len(pts) != 3:
            raise TraceError("gpumem trace: --seq-points must be three integers, e.g. 8,16,32")
        stem = os.path.splitext(os.path.basename(ns.model.rpartition(":")[0]))[0]
        graph = trace(factory, example, loss=ns.loss, name=ns.name or stem, seq_points=pts,
                      cuda_semantics=not ns.no_cuda_dropout, has_sequence=None if ns.inputs else has_seq)
    except TraceError as e:
        msg = str(e)
        for prefix in ("gpumem trace: ", "gpumem.trace: "):
            msg = msg[len(prefix):] if msg.startswith(prefix) else msg
        print("gpumem: error: trace: %s" % msg, file=sys.stderr)  # the CLI's one-line error form
        return 2
    text = json.dumps(graph, indent=1) + "\n"
    if ns.out:
        with open(ns.out, "w") as f:
            f.write(text)
        nparams = sum(_prod(p["shape"]) * p.get("count", 1) * b["repeat"] for b in graph["blocks"] for p in b["params"])
        print("wrote %s: %s, %d blocks, %d parameters" % (ns.out, graph["name"], len(graph["blocks"]), nparams),
              file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
