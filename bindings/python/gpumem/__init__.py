"""gpumem: predict the GPU memory of deep-learning training and inference jobs.

Every function builds a JSON request with the CLI's flag names (Python
keywords such as ``grad_accum`` become ``grad-accum``), runs it through the
C++ library (the same code the ``gpumem`` CLI runs) and returns a typed result
whose ``to_dict()`` equals the CLI's ``--format json`` output. Byte counts are
ints. Bad input raises :class:`GpumemError` (a ``ValueError``) with the
message the CLI prints.

    >>> import gpumem
    >>> est = gpumem.estimate("llama-3-8b", batch=2, seq=4096, gpu="H100-80GB")
    >>> est.per_gpu.total_device, est.per_gpu.fits
"""

from __future__ import annotations

import copy
import difflib
import json
import os
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

from . import _gpumem

__all__ = [
    "GpumemError", "Result", "Node", "Estimate", "Params", "Fit", "Plan", "Sweep", "Advice", "Timeline",
    "Snapshot", "Doctor", "Models", "Gpus", "Serving", "estimate", "params", "fit", "plan", "sweep", "advise", "serving",
    "simulate", "snapshot", "doctor", "models", "gpus", "call", "fields", "trace", "calibrate",
]

#: The one exception every bad request raises (never a crash of the
#: interpreter): ``str(e)`` is the CLI's message, ``e.field`` the flag/field
#: it is about ("" if none) and ``e.code`` the error kind: "invalid_argument",
#: "parse_error" (also a body that is not JSON or nests deeper than 64 levels),
#: "not_found", "unsupported", "overflow", "io_error", "timeout" (work over
#: ``time_limit``), "out_of_memory" or "internal".
GpumemError = _gpumem.GpumemError

_GIB = float(1 << 30)


def _gib(n: Any) -> str:
    try:
        return f"{float(n) / _GIB:.2f} GiB"
    except (TypeError, ValueError):
        return "?"


def _wrap(v: Any) -> Any:
    if isinstance(v, dict):
        return Node(v)
    if isinstance(v, list):
        return [_wrap(x) for x in v]
    return v


class Node:
    """Read-only attribute view of one JSON object: ``node.key`` (and
    ``node["key"]``) give the value, nested objects as Nodes, lists as lists."""

    __slots__ = ("_data",)

    def __init__(self, data: Dict[str, Any]) -> None:
        object.__setattr__(self, "_data", data)

    def __getattr__(self, name: str) -> Any:
        data = object.__getattribute__(self, "_data")
        if name in data:
            return _wrap(data[name])
        dashed = name.replace("_", "-")
        if dashed in data:
            return _wrap(data[dashed])
        raise AttributeError(f"{type(self).__name__} has no field {name!r} (fields: {', '.join(data)})")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only")

    def __getitem__(self, key: str) -> Any:
        return _wrap(self._data[key])

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Node):
            return self._data == other._data
        if isinstance(other, dict):
            return self._data == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __dir__(self) -> List[str]:
        return sorted(set(self._data) | set(dir(type(self))))

    def keys(self) -> List[str]:
        """The field names."""
        return list(self._data)

    def get(self, key: str, default: Any = None) -> Any:
        """The field's value (wrapped), or ``default`` when absent."""
        return _wrap(self._data[key]) if key in self._data else default

    def to_dict(self) -> Dict[str, Any]:
        """A deep copy of the plain JSON data (dicts, lists, ints, floats, strings)."""
        return copy.deepcopy(self._data)

    def to_json(self, indent: Optional[int] = None) -> str:
        """The data as JSON text."""
        return json.dumps(self._data, indent=indent)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {', '.join(self._data)}>"


class Result(Node):
    """Base class of every command's result: a :class:`Node` over the JSON
    the CLI prints with ``--format json``."""

    __slots__ = ()

    def _model_name(self) -> str:
        m = self._data.get("model")
        if isinstance(m, dict):
            return str(m.get("name", "?"))
        return str(m) if m is not None else "?"

    def _summary(self) -> str:
        return ", ".join(self._data)

    def __repr__(self) -> str:
        try:
            s = self._summary()
        except Exception:  # a repr must never fail
            s = ", ".join(self._data)
        return f"<{type(self).__name__} {s}>"


class Estimate(Result):
    """Per-GPU memory of one job (``gpumem estimate``): ``per_gpu`` holds
    ``total_device``, ``capacity``, ``fits`` and each part in bytes."""

    __slots__ = ()

    def _summary(self) -> str:
        p = self._data["per_gpu"]
        mode = self._data.get("request", {}).get("mode", "?")
        fits = "fits" if p.get("fits") else "does not fit"
        return f"{self._model_name()} {mode}: {_gib(p['total_device'])} of {_gib(p['capacity'])}, {fits}"


class Params(Result):
    """Parameter counts by component and dtype (``gpumem params``)."""

    __slots__ = ()

    def _summary(self) -> str:
        p = self._data["params"]
        total = p.get("total") if isinstance(p, dict) else p
        return f"{self._model_name()}: {total:,} parameters"


class Fit(Result):
    """The largest micro-batch and longest sequence that fit (``gpumem fit``)."""

    __slots__ = ()

    def _summary(self) -> str:
        parts = []
        for k in ("batch", "seq"):
            v = self._data.get(k)
            if isinstance(v, dict):
                best = next((v[x] for x in ("max", "largest", "value", "best") if x in v), None)
                parts.append(f"{k} {best}" if best is not None else k)
            elif v is not None:
                parts.append(f"{k} {v}")
        return f"{self._model_name()}: " + ", ".join(parts)


class Serving(Result):
    """A model served by an engine (``gpumem serving``): ``per_gpu`` parts,
    ``kv_cache_tokens``, ``kv_cache_blocks``, ``max_concurrency``, ``error``."""

    __slots__ = ()

    def _summary(self) -> str:
        d = self._data
        state = "starts" if not d.get("error") else "does not start"
        return (f"{self._model_name()} on {d.get('gpu')} with {d.get('engine')}: {d.get('kv_cache_tokens', 0):,} KV tokens, "
                f"{d.get('max_concurrency', 0):.2f}x at {d.get('max_model_len')} tokens, {state}")


class Plan(Result):
    """The layouts that fit, fastest first (``gpumem plan``)."""

    __slots__ = ()

    def _summary(self) -> str:
        top = self._data.get("top") or []
        return f"{len(top)} best of {self._data.get('evaluated', '?')} layouts evaluated, {self._data.get('fitting', '?')} fit"


class Sweep(Result):
    """Memory (and time) over micro-batch sizes and sequence lengths (``gpumem sweep``)."""

    __slots__ = ()

    def _summary(self) -> str:
        return (f"{self._model_name()}: batches {self._data.get('batches')} x seqs {self._data.get('seqs')}, "
                f"{len(self._data.get('points') or [])} points")


class Advice(Result):
    """Each memory-saving technique's saving and cost, and the cheapest
    combination that fits (``gpumem advise``)."""

    __slots__ = ()

    def _summary(self) -> str:
        return f"{self._model_name()}: {len(self._data.get('techniques') or [])} techniques"


class Timeline(Result):
    """The simulated memory timeline of one step (``gpumem estimate --timeline x.json``)."""

    __slots__ = ()

    def _summary(self) -> str:
        pts = self._data.get("timeline") or []
        peak = max((x.get("reserved", 0) for x in pts), default=0)
        return f"{self._data.get('events', '?')} events, {len(pts)} points, peak reserved {_gib(peak)}"


class Snapshot(Result):
    """Summary and allocator replay of a PyTorch memory snapshot (``gpumem snapshot``)."""

    __slots__ = ()

    def _summary(self) -> str:
        src = self._data.get("source")
        name = os.path.basename(str(src.get("file", "?"))) if isinstance(src, dict) else str(src)
        return (f"{name}: peak allocated {_gib(self._data.get('peak_allocated'))}, "
                f"reserved {_gib(self._data.get('peak_reserved'))}")


class Doctor(Result):
    """Diagnosis of a CUDA out-of-memory message and ranked remedies (``gpumem doctor``)."""

    __slots__ = ()

    def _summary(self) -> str:
        text = str(self._data.get("explanation") or self._data.get("diagnosis") or "")
        return (text[:77] + "...") if len(text) > 80 else text


class _Listing(Result):
    __slots__ = ()
    _key = ""

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        return iter(_wrap(self._data[self._key]))

    def __len__(self) -> int:
        return len(self._data[self._key])

    def _summary(self) -> str:
        names = [str(x.get("name", "?")) for x in self._data[self._key] if isinstance(x, dict)]
        more = ", ..." if len(names) > 5 else ""
        return f"{len(names)}: " + ", ".join(names[:5]) + more


class Models(_Listing):
    """The built-in model presets (``gpumem models``); iterates over ``models``."""

    __slots__ = ()
    _key = "models"


class Gpus(_Listing):
    """The built-in GPU catalog (``gpumem gpus``); iterates over ``gpus``."""

    __slots__ = ()
    _key = "gpus"


# ---------------------------------------------------------------- requests
#
# The keyword arguments are the request field table's names (the same table
# drives the CLI's flags, the HTTP service and the page): ``grad_accum`` is
# ``--grad-accum``. ``gpumem.fields()`` lists them; the typed stubs
# (__init__.pyi) are generated from the table by scripts/gen-python-stubs.py.

_TABLE: Dict[str, Any] = json.loads(_gpumem.fields())
__version__ = _gpumem.version()


def fields(command: Optional[str] = None) -> List[Dict[str, Any]]:
    """The request fields (name, type, unit, default, values, help, group,
    commands, modes), all or those of one command."""
    fs = _TABLE["fields"]
    return [dict(f) for f in fs if command is None or command in f["commands"]]


def call(command: str, body: Optional[Dict[str, Any]] = None, time_limit: Optional[float] = None) -> Dict[str, Any]:
    """Run one command of the JSON API on a request body (keys are the field
    names) and return the plain JSON result. The typed functions below are
    thin wrappers over this. ``time_limit`` (seconds) cancels work that runs
    longer (GpumemError with code "timeout"). Every failure raises GpumemError."""
    try:
        text = json.dumps(body or {}, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as e:
        err = GpumemError(f"the request is not JSON data: {e}")
        err.code, err.field = "parse_error", ""
        raise err from None
    return _gpumem.call_value(command, text, float(time_limit or 0.0))


def _error(message: str, field: str) -> GpumemError:
    e = GpumemError(message)
    e.code, e.field = "invalid_argument", field
    return e


_KNOWN: Dict[str, Dict[str, Dict[str, Any]]] = {}


def _known(command: str) -> Dict[str, Dict[str, Any]]:
    """The keywords a command takes (keys and aliases) and their fields,
    built once per command from the field table."""
    known = _KNOWN.get(command)
    if known is None:
        known = {}
        for f in _TABLE["fields"]:
            if command in f["commands"] and not f["cli_only"]:
                known[f["key"]] = f
                for a in f["aliases"]:
                    known[a.replace("-", "_")] = f
        _KNOWN[command] = known
    return known


def _body(command: str, function: str, kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """Checks the keywords against the command's fields (did-you-mean on a
    typo) and builds the JSON body; None means "not given"."""
    known = _known(command)
    out: Dict[str, Any] = {}
    for k, v in kwargs.items():
        if v is None:
            continue
        key = k.replace("-", "_")
        if key not in known and key.startswith("no_") and key[3:] in known and known[key[3:]]["type"] == "bool":
            key, v = key[3:], not v
        if key not in known:
            near = difflib.get_close_matches(key, list(known), n=3, cutoff=0.6)
            hint = f"; did you mean {' or '.join(near)}?" if near else ""
            raise _error(f"{function}() got an unknown keyword argument {k!r}{hint}", k)
        if isinstance(v, tuple):
            v = list(v)
        if isinstance(v, os.PathLike):
            v = os.fspath(v)
        if isinstance(v, float) and v.is_integer() and known[key]["type"] in ("int", "count", "size"):
            v = int(v)
        out[known[key]["name"]] = v
    return out


def estimate(model: Optional[str] = None, **options: Any) -> Estimate:
    """Per-GPU memory of a training or inference job, part by part, and its
    step time (``gpumem estimate``). ``model`` is a preset, a Hugging Face id
    in the local cache, a config.json, a model folder or a layer-list JSON;
    ``params=`` (a count such as "7B") replaces it for model states only.
    Keywords: every field of ``gpumem.fields("estimate")``."""
    return Estimate(call("estimate", _body("estimate", "estimate", dict(options, model=model))))


def simulate(model: Optional[str] = None, **options: Any) -> Timeline:
    """The simulated allocator timeline of one step of the job (what
    ``gpumem estimate --timeline FILE.json`` writes). Same arguments as
    :func:`estimate`; needs a model graph (not ``params``, not ``analytic``)."""
    return Timeline(call("timeline", _body("timeline", "simulate", dict(options, model=model))))


def params(model: Optional[str] = None, **options: Any) -> Params:
    """Parameter counts by component and dtype (``gpumem params``). Give a
    model, or ``params`` (an int or a string such as "7B") for a count only."""
    return Params(call("params", _body("params", "params", dict(options, model=model))))


def fit(model: Optional[str] = None, **options: Any) -> Fit:
    """The largest micro-batch and the longest sequence that fit the GPU
    (``gpumem fit``). Keywords: the fields of ``gpumem.fields("fit")``."""
    return Fit(call("fit", _body("fit", "fit", dict(options, model=model))))


def serving(model: Optional[str] = None, **options: Any) -> Serving:
    """A model served by vLLM (``gpumem serving``): its KV-cache tokens and
    concurrency, per-GPU memory and whether it starts. ``command`` takes the
    engine's own command line as a list (``["vllm", "serve", MODEL, ...]``).
    Keywords: the fields of ``gpumem.fields("serving")``."""
    return Serving(call("serving", _body("serving", "serving", dict(options, model=model))))


def calibrate(model: Optional[str] = None, out: Optional[Union[str, "os.PathLike[str]"]] = None, **options: Any) -> Result:
    """Fit the unknowns (framework extras, fragmentation, CUDA context) to a job
    you ran (``gpumem calibrate``): the job's keywords as for :func:`estimate`
    plus ``measured_allocated`` / ``measured_reserved`` / ``measured_total``
    (sizes) or ``snapshot`` (a snapshot file). Returns the calibration document,
    written to ``out`` when given; pass it (or the file) to any function as
    ``calibration=``."""
    doc = call("calibrate", _body("calibrate", "calibrate", dict(options, model=model)))
    if out is not None:
        with open(out, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
    return Result(doc)


def advise(model: Optional[str] = None, **options: Any) -> Advice:
    """Each memory-saving technique's saving and time cost for this job, and
    the cheapest combination that fits (``gpumem advise``)."""
    return Advice(call("advise", _body("advise", "advise", dict(options, model=model))))


def sweep(model: Optional[str] = None, **options: Any) -> Sweep:
    """Memory (and time) over lists of micro-batch sizes and sequence lengths
    (``gpumem sweep``): ``batches`` defaults to [batch], ``seqs`` to [seq]."""
    return Sweep(call("sweep", _body("sweep", "sweep", dict(options, model=model))))


def plan(model: Optional[str] = None, **options: Any) -> Plan:
    """Search layouts for the fastest one that fits (``gpumem plan``):
    ``gpus``, ``global_batch``, ``headroom`` (0.05 or "5%"), ``top``,
    ``only_tp``/``only_pp``/... restrictions; the job's precision and
    optimizer stay as given unless ``search_precision`` / ``search_optimizer``."""
    return Plan(call("plan", _body("plan", "plan", dict(options, model=model))))


def doctor(message: str, **run: Any) -> Doctor:
    """Explain a CUDA out-of-memory message and rank the remedies (``gpumem
    doctor``). ``run`` optionally describes the job that failed, with the
    arguments of :func:`estimate` (model=..., batch=..., seq=..., ...)."""
    return Doctor(call("doctor", _body("doctor", "doctor", dict(run, message=message))))


def snapshot(path: Union[str, "os.PathLike[str]"], alloc_conf: Optional[str] = None, **options: Any) -> Snapshot:
    """Summarize a PyTorch memory snapshot (``torch.cuda.memory._dump_snapshot()``
    pickle, or the same data as JSON) and replay it through the allocator model
    (``gpumem snapshot``); ``alloc_conf`` replays with these
    PYTORCH_CUDA_ALLOC_CONF settings instead of the recorded ones."""
    return Snapshot(call("snapshot", _body("snapshot", "snapshot", dict(options, file=path, alloc_conf=alloc_conf))))


def models() -> Models:
    """The built-in model presets (``gpumem models``)."""
    return Models(call("models"))


def gpus() -> Gpus:
    """The built-in GPU catalog (``gpumem gpus``)."""
    return Gpus(call("gpus"))


def trace(model: Any, example_inputs: Any, **options: Any) -> Dict[str, Any]:
    """Trace a PyTorch model on the meta device (no weights, no GPU) into
    gpumem's model graph, a dict (written to ``out=`` when given) that every
    function here and every CLI command takes as the model. Needs torch >= 1.13;
    the rest of the package does not. Options and details: ``gpumem.tracer.trace``
    (``loss``, ``out``, ``name``, ``batch_dim``, ``seq_dim``, ``has_sequence``,
    ``seq_points``, ``cuda_semantics``, ``modern_saves``). Raises
    ``gpumem.tracer.TraceError`` (a ValueError) when the model cannot be traced.

        >>> g = gpumem.trace(lambda: MyNet(), lambda b, s: (torch.zeros(b, s, dtype=torch.long),), out="net.json")
        >>> gpumem.estimate("net.json", batch=8, seq=2048)
    """
    from . import tracer
    return tracer.trace(model, example_inputs, **options)
