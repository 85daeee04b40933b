"""Prototype of gpumem.trace(): run a PyTorch model once on the meta device and record
every aten op, its outputs (shape, dtype, new storage / view / in-place), the tensors autograd
saves for backward, parameters/buffers and module boundaries.

Works on torch 1.13 (Debian python3-torch) and is written against APIs that still exist in 2.x.
Research prototype; not part of gpumem.
"""
import contextlib
import warnings

import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

MIN_TORCH = (1, 13)


def torch_version():
    v = torch.__version__.split("+")[0]
    parts = []
    for p in v.split(".")[:2]:
        num = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(num) if num else 0)
    return tuple(parts)


def check_torch():
    if torch_version() < MIN_TORCH:
        raise RuntimeError(
            "gpumem.trace needs torch >= 1.13 (found %s): it relies on "
            "torch.utils._python_dispatch.TorchDispatchMode, torch.overrides.TorchFunctionMode and "
            "meta-device kernels that older releases lack; upgrade torch or describe the model "
            "as a layer list / config.json" % torch.__version__)


# --------------------------------------------------------------------------------------
# storage identity (meta tensors have data_ptr 0 + offset, so data_ptr cannot be used)
# --------------------------------------------------------------------------------------
def storage_key(t):
    if hasattr(torch._C, "_storage_id"):          # 1.13 and 2.x: the StorageImpl address
        return torch._C._storage_id(t)
    if hasattr(t, "untyped_storage"):
        return t.untyped_storage()._cdata
    return t.storage()._cdata


def storage_nbytes(t):
    if hasattr(t, "untyped_storage"):               # 2.x
        return int(t.untyped_storage().nbytes())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return int(t.storage().nbytes())          # 1.13: TypedStorage.nbytes()


# --------------------------------------------------------------------------------------
# building a model on meta
# --------------------------------------------------------------------------------------
_FACTORY_NAMES = ["empty", "zeros", "ones", "full", "rand", "randn", "randint", "arange", "tensor", "eye",
                  "linspace", "logspace", "empty_strided", "as_tensor", "randperm", "scalar_tensor", "range",
                  "tril_indices", "triu_indices", "bartlett_window", "hann_window"]
_FACTORIES = {getattr(torch, n) for n in _FACTORY_NAMES if hasattr(torch, n)}


class _DefaultDevice(TorchFunctionMode):
    """torch 1.13 stand-in for `with torch.device('meta'):` (2.x implements that context with
    the same idea: torch/utils/_device.py DeviceContext, a TorchFunctionMode over factories)."""

    def __init__(self, device):
        super().__init__()
        self.device = torch.device(device)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in _FACTORIES and kwargs.get("device") is None:
            kwargs["device"] = self.device
        return func(*args, **kwargs)


def meta_device_context():
    if torch_version() >= (2, 0):
        return torch.device("meta")               # 2.x: a context manager
    return _DefaultDevice("meta")


def module_on_meta(module_or_factory):
    """A factory is called under the meta device (no weight memory, ties kept). A module is moved
    with .to('meta'), which in 1.13 replaces each Parameter and so breaks weight tying: re-tie."""
    if isinstance(module_or_factory, nn.Module):
        m = module_or_factory
        groups = {}
        # named_parameters(remove_duplicate=False) is 2.x only; walk _parameters
        for mod_name, mod in m.named_modules(remove_duplicate=False):
            for k, p in mod._parameters.items():
                if p is not None:
                    groups.setdefault(id(p), []).append(mod_name + "." + k if mod_name else k)
        m = m.to("meta")
        for names in groups.values():
            if len(names) > 1:
                src = m.get_parameter(names[0])
                for n in names[1:]:
                    mod_path, _, leaf = n.rpartition(".")
                    setattr(m.get_submodule(mod_path) if mod_path else m, leaf, src)
        return m
    with meta_device_context():
        return module_or_factory()


def to_meta(x):
    if isinstance(x, torch.Tensor):
        return x.to("meta") if x.device.type != "meta" else x
    if isinstance(x, (list, tuple)):
        return type(x)(to_meta(v) for v in x)
    if isinstance(x, dict):
        return {k: to_meta(v) for k, v in x.items()}
    return x


# --------------------------------------------------------------------------------------
# CUDA semantics on meta/CPU: nn.Dropout / F.dropout take the fused native_dropout kernel on
# CUDA (aten/src/ATen/native/Dropout.cpp, is_fused_kernel_acceptable: is_cuda() || is_xpu() ||
# is_lazy()) and save a bool mask; on CPU and meta they decompose to bernoulli_/div_/mul and save
# a float noise tensor. Rewrite so that a meta trace reports what a GPU run keeps.
# --------------------------------------------------------------------------------------
# F.dropout is patched (not intercepted by a TorchFunctionMode) so that calls nested inside other
# functionals (F.multi_head_attention_forward's attention dropout) are rewritten too: a
# TorchFunctionMode only sees the outermost call.
@contextlib.contextmanager
def cuda_dropout():
    import torch.nn.functional as F
    orig_F, orig_t = F.dropout, torch.dropout

    # in-place dropout (nn.Dropout(inplace=True)) is aten::dropout_, which never takes the fused
    # kernel, on CUDA either (Dropout.cpp: dropout_ -> _dropout<true>): left as it is.
    def F_dropout(input, p=0.5, training=True, inplace=False):
        if training and not inplace and 0.0 < p < 1.0 and input.numel() > 0:
            return torch.native_dropout(input, p, True)[0]
        return orig_F(input, p, training, inplace)

    def t_dropout(input, p, train):
        if train and 0.0 < p < 1.0 and input.numel() > 0:
            return torch.native_dropout(input, p, True)[0]
        return orig_t(input, p, train)

    F.dropout, torch.dropout = F_dropout, t_dropout
    try:
        yield
    finally:
        F.dropout, torch.dropout = orig_F, orig_t


# --------------------------------------------------------------------------------------
# the tracer
# --------------------------------------------------------------------------------------
class Trace:
    def __init__(self):
        self.tensors = []      # dict per tensor
        self.aten_ops = []
        self.fn_ops = []
        self.saved = []        # (tid, fn op index)
        self.params = []       # name, shape, dtype, tid
        self.buffers = []
        self._tid = {}         # id(tensor) -> tid
        self._keep = []        # strong refs: ids and storages must not be reused during the trace
        self._storage_root = {}  # storage key -> tid of the tensor that created it
        self.module_stack = [""]
        self.cur_fn = None
        self._pending = []
        self.node_op = {}      # id(autograd node) -> aten op index
        self._nodes = []
        self.packed = []       # pack index -> tid
        self.layer_inputs = {}  # module path -> tid of its first tensor argument

    def resolve_nodes(self):
        for idx, outs in self._pending:
            for t in outs:
                n = t.grad_fn
                if n is not None and id(n) not in self.node_op:
                    self.node_op[id(n)] = idx
                    self._nodes.append(n)
        self._pending = []

    def attribute_saved(self):
        """Per aten op: the tensors its autograd node saved (read back through the unpack hook)."""
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
                except Exception:
                    continue
                for pi in self._unpacked:
                    tid = self.packed[pi]
                    if tid not in self.aten_ops[idx]["saved"]:
                        self.aten_ops[idx]["saved"].append(tid)

    # -- tensors
    def tid_of(self, t, kind=None, name=None, producer=None):
        k = id(t)
        if k in self._tid:
            return self._tid[k]
        sk = storage_key(t)
        root = self._storage_root.get(sk)
        if kind is None:
            kind = "view" if root is not None else "new"
        tid = len(self.tensors)
        self.tensors.append({
            "id": tid, "shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
            "storage": sk, "storage_nbytes": storage_nbytes(t), "kind": kind,
            "base": root if root is not None else tid, "producer": producer, "name": name,
            "module": self.module_stack[-1],
        })
        if root is None:
            self._storage_root[sk] = tid
        self._tid[k] = tid
        self._keep.append(t)
        return tid


class _FnMode(TorchFunctionMode):
    """Top-level torch function calls (F.linear, torch.matmul, Tensor.softmax, ...): the
    granularity of gpumem ops. Nested calls are not seen (the mode is off inside the handler)."""

    def __init__(self, tr, cuda_semantics):
        super().__init__()
        self.tr = tr
        self.cuda_semantics = cuda_semantics

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tr = self.tr
        name = getattr(func, "__qualname__", None) or getattr(func, "__name__", str(func))
        if name.endswith("__get__") or name in ("Tensor.size", "Tensor.dim", "Tensor.numel", "Tensor.stride",
                                                 "Tensor.is_contiguous", "Tensor.__len__", "Tensor.data_ptr"):
            return func(*args, **kwargs)
        idx = len(tr.fn_ops)
        rec = {"index": idx, "fn": name, "module": tr.module_stack[-1], "aten": [], "saved": []}
        tr.fn_ops.append(rec)
        prev, tr.cur_fn = tr.cur_fn, idx
        try:
            out = func(*args, **kwargs)
        finally:
            tr.cur_fn = prev
        rec["outputs"] = [tr.tid_of(t) for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if not rec["aten"] and not rec["saved"]:
            tr.fn_ops.pop() if tr.fn_ops[-1] is rec else None
        return out


class _AtenMode(TorchDispatchMode):
    def __init__(self, tr):
        super().__init__()
        self.tr = tr

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.tr.resolve_nodes()
        out = func(*args, **kwargs)
        tr = self.tr
        ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        in_ids = [tr.tid_of(t) for t in ins]
        in_objs = {id(t) for t in ins}
        idx = len(tr.aten_ops)
        outs = []
        rets = func._schema.returns
        for i, t in enumerate(t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)):
            if id(t) in in_objs:
                kind = "inplace"
                tid = tr._tid[id(t)]
            else:
                known = storage_key(t) in tr._storage_root
                tid = tr.tid_of(t, kind="view" if known else "new", producer=idx)
                kind = tr.tensors[tid]["kind"]
            schema_alias = i < len(rets) and rets[i].alias_info is not None
            outs.append((tid, kind, schema_alias))
        tr.aten_ops.append({
            "index": idx, "op": str(func), "module": tr.module_stack[-1], "fn": tr.cur_fn,
            "inputs": in_ids, "outputs": [o[0] for o in outs], "kinds": [o[1] for o in outs],
            "schema_alias": [o[2] for o in outs],
        })
        if tr.cur_fn is not None:
            tr.fn_ops[tr.cur_fn]["aten"].append(idx)
        # autograd sets the outputs' grad_fn after this returns: read it at the next event
        tr._pending.append((idx, [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]))
        return out


@contextlib.contextmanager
def _module_hooks(model, tr):
    names = {m: n for n, m in model.named_modules()}
    handles = []
    for m in model.modules():
        def pre(mod, inp):
            tr.module_stack.append(names[mod])
            ts = [t for t in tree_flatten(inp)[0] if isinstance(t, torch.Tensor)]
            if ts and names[mod] not in tr.layer_inputs:
                tr.layer_inputs[names[mod]] = tr.tid_of(ts[0])
        handles.append(m.register_forward_pre_hook(pre))
        handles.append(m.register_forward_hook(lambda mod, inp, out: (tr.module_stack.pop(), None)[1]))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def trace(module_or_factory, example_inputs, loss_fn=None, cuda_semantics=True, device="meta", train=True):
    """Run `model(*example_inputs)` (then `loss_fn(output)` if given) once and record it.
    device='meta': no weights, no memory. device=None: run where the model already is (checks)."""
    check_torch()
    if device == "meta":
        model = module_on_meta(module_or_factory)
        inputs = to_meta(tuple(example_inputs))
    else:
        model = module_or_factory if isinstance(module_or_factory, nn.Module) else module_or_factory()
        inputs = tuple(example_inputs)
    model.train(train)
    tr = Trace()
    for n, p in model.named_parameters():
        tid = tr.tid_of(p, kind="param", name=n)
        tr.params.append({"name": n, "shape": list(p.shape), "dtype": str(p.dtype).replace("torch.", ""),
                          "tensor": tid, "requires_grad": p.requires_grad,
                          "module_type": type(model.get_submodule(n.rpartition(".")[0]) if "." in n else model).__name__})
    for n, b in model.named_buffers():
        tid = tr.tid_of(b, kind="buffer", name=n)
        tr.buffers.append({"name": n, "shape": list(b.shape), "dtype": str(b.dtype).replace("torch.", ""),
                           "tensor": tid})
    for i, x in enumerate(tree_flatten(inputs)[0]):
        if isinstance(x, torch.Tensor):
            tr.tid_of(x, kind="input", name="input%d" % i)

    def pack(t):
        tid = tr.tid_of(t)   # a tensor no mode has seen yet gets registered here
        tr.saved.append((tid, tr.cur_fn))
        if tr.cur_fn is not None:
            tr.fn_ops[tr.cur_fn]["saved"].append(tid)
        tr.packed.append(tid)
        return len(tr.packed) - 1

    def unpack(i):
        tr._unpacked.append(i)
        return tr._keep_packed[i]

    tr._keep_packed = []
    _pack = pack

    def pack(t):  # noqa: F811
        tr._keep_packed.append(t)
        return _pack(t)

    with _module_hooks(model, tr), torch.autograd.graph.saved_tensors_hooks(pack, unpack), \
            (cuda_dropout() if cuda_semantics else contextlib.nullcontext()), _FnMode(tr, cuda_semantics), _AtenMode(tr):
        try:
            out = model(*inputs)
            if loss_fn is not None:
                out = loss_fn(out)
        except NotImplementedError as e:
            msg = str(e).splitlines()[0]
            if device == "meta" and "'Meta' backend" in msg:
                op = msg.split("'")[1] if "'" in msg else "an operator"
                last = tr.aten_ops[-1] if tr.aten_ops else None
                where = tr.module_stack[-1] or "<root>"
                hint = ""
                if op in ("aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::unique",
                          "aten::_unique2", "aten::bincount"):
                    hint = (" It needs tensor values (.item(), bool(tensor), nonzero, boolean-mask indexing), which a "
                            "meta trace does not have: make that branch independent of the data (e.g. pass "
                            "attention_mask=None) or give gpumem the model another way.")
                raise RuntimeError("gpumem.trace: %s has no meta kernel in torch %s (in module %s, after %s).%s"
                                   % (op, torch.__version__, where, last["op"] if last else "no op", hint)) from None
            raise
    tr.resolve_nodes()
    tr.output = [tr.tid_of(t) for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        tr.attribute_saved()
    return tr


def saved_bytes(tr):
    """Bytes autograd keeps, deduplicated by storage, parameters and buffers left out."""
    excl = {tr.tensors[t]["storage"] for t in range(len(tr.tensors)) if tr.tensors[t]["kind"] in ("param", "buffer")}
    seen = {}
    for tid, _ in tr.saved:
        t = tr.tensors[tid]
        if t["storage"] in excl:
            continue
        seen.setdefault(t["storage"], t["storage_nbytes"])
    return sum(seen.values()), len(seen)


# --------------------------------------------------------------------------------------
# plain CPU measurement, oracle style (independent of the tracer)
# --------------------------------------------------------------------------------------
def cpu_saved_bytes(model, inputs, loss_fn=None, cuda_semantics=True):
    def skey(t):
        s = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
        return s.data_ptr()
    excl = {skey(p) for p in model.parameters()} | {skey(b) for b in model.buffers()}
    packed = []

    def pack(t):
        packed.append(t)
        return t

    model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            (cuda_dropout() if cuda_semantics else contextlib.nullcontext()):
        out = model(*inputs)
        if loss_fn is not None:
            out = loss_fn(out)
    seen = {}
    for t in packed:
        k = skey(t)
        if k in excl:
            continue
        seen.setdefault(k, storage_nbytes(t))
    return sum(seen.values()), len(seen), out
