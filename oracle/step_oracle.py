#!/usr/bin/python3
"""CPU oracle for gpumem's training-step simulator.

For small fp32 GPT-2-style and LLaMA-style causal LMs (the models of
activations_oracle.py, imported, not copied) and for the seed's toy MLP, runs
one first training step and one steady-state (second) training step, each
under its own

    torch.profiler.profile(activities=[CPU], profile_memory=True, record_shapes=True)

and rebuilds the curve of live tensor bytes from the profiler's allocation
events ("[memory]" events).

Live bytes = baseline + running sum of the allocation deltas, in time order:
  * baseline_bytes = parameter bytes (tied weights once) + input bytes
    (input_ids; labels are input_ids, HF convention), all allocated before the
    profile starts.  Module buffers (GPT-2's causal-mask `attn.bias`, LLaMA's
    `inv_freq`) are live too but are reported apart (`buffer_bytes`) and NOT in
    baseline_bytes.
  * step 2 starts from step 1's end: baseline + optimizer state.
The profiler only sees allocations made while it runs; frees of blocks
allocated before it started are not reported (c10 logs "Memory block of unknown
size was allocated before the profiling started").  Nothing allocated before a
profile is freed inside it here, which the script checks: the live bytes at
the end of each step equal baseline + optimizer state exactly.

Phases are marked with RecordFunction ranges "forward", "backward",
"optimizer", "zero_grad", "release" (drop of the Python reference to the loss).
They are opened with torch.ops.profiler._record_function_enter_new, which
allocates nothing (torch.profiler.record_function in 1.13 allocates a 4-byte
handle tensor outside the range and frees it inside the range, and a transient
288-byte tensor).  Allocation events are read from
prof.profiler.kineto_results.experimental_event_tree() (the function_events
list only keeps "[memory]" events that fall outside every op, so it loses
almost all of them), each is attributed to the phase range that encloses it in
the tree, and sorted by start_time_ns (stable on tree order).  The order is
verified with the allocator's own running total (`total_allocated`), which
must change by exactly alloc_size from one event to the next.

Usage:
  /usr/bin/python3 oracle/step_oracle.py --out tests/fixtures/oracle/step_memory.json
  /usr/bin/python3 oracle/step_oracle.py --selftest   # the 4 MiB alloc/free check only
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import activations_oracle as A  # noqa: E402  (also sets torch.set_num_threads(2))

# The event list depends on the intra-op thread count: e.g. CPU native_layer_norm_backward allocates a
# [num_threads, 2, h]-sized fp32 scratch.  Pin it (activations_oracle already does).
torch.set_num_threads(2)

PHASES = ["forward", "backward", "optimizer", "zero_grad", "release"]
LR = 1e-3
EVENTS_FOR = {"gpt2-h64-L2-b2-s32", "llama-h64-kv2-L2-b2-s32"}  # cases whose step-1 event list is written


# --------------------------------------------------------------------------------------
# profiler plumbing
# --------------------------------------------------------------------------------------

class Phase:
    """A RecordFunction range that allocates nothing (unlike torch.profiler.record_function in 1.13)."""

    def __init__(self, name):
        self.name = name

    def __enter__(self):
        self.h = torch.ops.profiler._record_function_enter_new(self.name, None)
        return self

    def __exit__(self, *exc):
        torch.ops.profiler._record_function_exit._RecordFunction(self.h)
        return False


def new_profile():
    return profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True)


def alloc_events(prof):
    """Allocation events of one profile, in time order:
    list of dicts {delta, phase, op, tid, total}.  Verifies the order with total_allocated."""
    kr = prof.profiler.kineto_results
    out = []
    seq = [0]

    def walk(ev, phase, op):
        ef = ev.extra_fields
        if isinstance(ef, torch._C._profiler._ExtraFields_Allocation):
            out.append({"t": ev.start_time_ns, "seq": seq[0], "delta": int(ef.alloc_size), "phase": phase,
                        "op": op[-1] if op else None, "path": " / ".join(op), "tid": ev.start_tid, "total": int(ef.total_allocated),
                        "device": str(ef.device)})
            seq[0] += 1
            return
        name = ev.name
        if phase is None and name in PHASES:
            phase = name
        elif phase is not None:
            op = op + (name,)  # enclosing ops / autograd nodes, outermost first
        for c in ev.children:
            walk(c, phase, op)

    for root in kr.experimental_event_tree():
        walk(root, None, ())
    out.sort(key=lambda e: (e["t"], e["seq"]))
    # cross-check with the flat event list: same number of "[memory]" events
    n_flat = sum(1 for e in kr.events() if e.name() == "[memory]")
    assert n_flat == len(out), (n_flat, len(out))
    # order check: the allocator's running total must move by exactly each delta
    for a, b in zip(out, out[1:]):
        assert b["total"] - a["total"] == b["delta"], "allocation events out of order"
    for e in out:
        assert e["phase"] is not None, "allocation outside every phase range"
        assert e["device"] == "cpu", e
    tids = {e["tid"] for e in out}
    assert len(tids) == 1, f"allocations on several threads: {tids}"
    return out


def summarize(events, start_live):
    """Live-bytes curve statistics.  start_live = live bytes when the profile starts."""
    live = start_live
    peak, peak_phase, peak_op, peak_path, peak_idx = start_live, PHASES[0], None, "", -1
    phase_peaks = {p: None for p in PHASES}
    after = {}
    cur_phase_idx = 0
    for i, e in enumerate(events):
        pi = PHASES.index(e["phase"])
        assert pi >= cur_phase_idx, "phase order"
        while cur_phase_idx < pi:  # phases that ended before this event
            after[PHASES[cur_phase_idx]] = live
            cur_phase_idx += 1
        if phase_peaks[e["phase"]] is None:
            phase_peaks[e["phase"]] = live  # the phase starts at the previous level
        live += e["delta"]
        phase_peaks[e["phase"]] = max(phase_peaks[e["phase"]], live)
        if live > peak:
            peak, peak_phase, peak_op, peak_path, peak_idx = live, e["phase"], e["op"], e["path"], i
    while cur_phase_idx < len(PHASES):
        after[PHASES[cur_phase_idx]] = live
        cur_phase_idx += 1
    prev = start_live
    for p in PHASES:  # a phase without events: its peak is its (constant) level
        if phase_peaks[p] is None:
            phase_peaks[p] = prev
        prev = after[p]
    return {
        "start_bytes": start_live,
        "peak_bytes": peak, "peak_phase": peak_phase, "peak_op": peak_op, "peak_op_path": peak_path,
        "peak_event_index": peak_idx,
        "after_forward": after["forward"], "after_backward": after["backward"],
        "after_optimizer": after["optimizer"], "after_zero_grad": after["zero_grad"],
        "after_release": after["release"],
        "phase_peaks": phase_peaks,
        "num_memory_events": len(events),
        "num_memory_events_by_phase": {p: sum(1 for e in events if e["phase"] == p) for p in PHASES},
    }


# --------------------------------------------------------------------------------------
# toy MLP (seed 000: tests/fixtures/models/toy_mlp.json)
# --------------------------------------------------------------------------------------

class ToyMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(1024, 1024)
        self.l2 = nn.Linear(1024, 1024)
        self.l3 = nn.Linear(1024, 2048)

    def forward(self, x, labels=None):
        return self.l3(self.l2(self.l1(x))).sum()


# --------------------------------------------------------------------------------------
# cases
# --------------------------------------------------------------------------------------

def case_name(fam, cfg, b, s):
    if fam == "toy_mlp":
        return f"toy_mlp-b{b}-{cfg['optimizer']}"
    pad = "-pad" if cfg.get("loss_impl") == "pad" else ""
    if fam == "gpt2":
        n = f"gpt2-h{cfg['hidden']}-L{cfg['layers']}-b{b}-s{s}"
        if cfg["resid_pdrop"] == 0.0:
            n += "-p0"
        return n + pad
    return f"llama-h{cfg['hidden']}-kv{cfg['kv_heads']}-L{cfg['layers']}-b{b}-s{s}" + pad


def build_cases():
    g, l = A.gpt2_config, A.llama_config
    cases = [
        ("gpt2", g(64, 2, 1000), 2, 32),
        ("gpt2", g(64, 2, 1000), 4, 128),
        ("gpt2", g(128, 4, 5000), 2, 32),
        ("gpt2", g(64, 4, 5000), 4, 32),
        ("gpt2", g(128, 2, 1000), 2, 128),
        ("gpt2", g(64, 2, 1000, pdrop=0.0), 2, 32),
        ("gpt2", g(64, 2, 1000, pdrop=0.0), 4, 128),
        ("llama", l(64, 2, 1000, 2, 172), 2, 32),
        ("llama", l(64, 2, 1000, 4, 172), 4, 128),
        ("llama", l(128, 4, 5000, 2, 344), 2, 32),
        ("llama", l(128, 4, 5000, 4, 344), 4, 32),
        ("llama", l(64, 4, 5000, 2, 344), 2, 32),
        ("llama", l(128, 2, 1000, 4, 172), 2, 128),
    ]
    # The same models with transformers >= 4.46's ForCausalLMLoss (labels padded
    # and shifted, no copy of the shifted logits): what gpumem models.
    cases += [(fam, dict(cfg, loss_impl="pad"), b, s) for fam, cfg, b, s in cases]
    return cases


# --------------------------------------------------------------------------------------
# measurement
# --------------------------------------------------------------------------------------

def unique_params(model):
    seen, out = set(), []
    for p in model.parameters():  # already deduplicated by identity (tied weights once)
        k = A.storage_key(p)
        if k not in seen:
            seen.add(k)
            out.append(p)
    return out


def for_loop_transient(numels, esize=4):
    """Peak of the P-sized temporaries of 1.13's (and 2.x's) _single_tensor_adam(w), non-capturable:
    `denom = (exp_avg_sq.sqrt() / bc2_sqrt).add_(eps)`: sqrt_i and the quotient coexist, while the previous
    iteration's denom is still bound to the local `denom` until the assignment completes."""
    best, prev = 0, 0
    for n in numels:
        best = max(best, (prev + 2 * n) * esize)
        prev = n
    return best


def measure(fam, cfg, b, s):
    torch.manual_seed(A.SEED)
    if fam == "toy_mlp":
        model = ToyMLP()
        inputs = torch.randn(b, 1024)
        labels = None
        input_bytes = inputs.numel() * inputs.element_size()
    else:
        model = (A.GPT2LMHeadModel if fam == "gpt2" else A.LlamaForCausalLM)(cfg)
        inputs = torch.randint(0, cfg["vocab"], (b, s), dtype=torch.long)
        labels = inputs  # HF convention: labels = input_ids (shifted inside the loss)
        input_bytes = inputs.numel() * inputs.element_size()
    model.train()
    params = unique_params(model)
    param_bytes = sum(A.storage_nbytes(p) for p in params)
    buffer_bytes = sum(A.storage_nbytes(x) for x in model.buffers())
    opt_name = cfg.get("optimizer", "adamw") if fam == "toy_mlp" else "adamw"
    if opt_name == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=LR, foreach=False)
        assert opt.param_groups[0]["foreach"] is False
        wd = opt.param_groups[0]["weight_decay"]
        opt_desc = {"name": "adamw", "foreach": False, "weight_decay": wd, "lr": LR, "amsgrad": False,
                    "betas": list(opt.param_groups[0]["betas"]), "eps": opt.param_groups[0]["eps"]}
    else:
        opt = torch.optim.SGD(model.parameters(), lr=LR, foreach=False)
        opt_desc = {"name": "sgd", "foreach": False, "weight_decay": 0.0, "lr": LR, "momentum": 0.0}
    baseline = param_bytes + input_bytes

    steps = []
    start = baseline
    for step in (1, 2):
        with new_profile() as prof:
            with Phase("forward"):
                loss = model(inputs, labels)
            with Phase("backward"):
                loss.backward()
            with Phase("optimizer"):
                opt.step()
            with Phase("zero_grad"):
                opt.zero_grad(set_to_none=True)
            with Phase("release"):
                del loss
        ev = alloc_events(prof)
        summ = summarize(ev, start)
        steps.append((summ, ev))
        start = summ["after_release"]

    # optimizer state
    state_bytes = 0
    step_tensor_bytes = 0
    for p in params:
        st = opt.state[p]
        for k, v in st.items():
            if isinstance(v, torch.Tensor):
                if k == "step":
                    step_tensor_bytes += A.storage_nbytes(v)
                else:
                    state_bytes += A.storage_nbytes(v)
    s1, s2 = steps[0][0], steps[1][0]
    checks = {}
    # optimizer step 1: exp_avg + exp_avg_sq (2 x params) + one 0-dim fp32 `step` tensor per parameter
    d = s1["after_optimizer"] - s1["after_backward"]
    if opt_name == "adamw":
        assert state_bytes == 2 * param_bytes, (state_bytes, param_bytes)
        assert step_tensor_bytes == 4 * len(params)
    assert d == state_bytes + step_tensor_bytes, (d, state_bytes, step_tensor_bytes)
    checks["step1_optimizer_delta_eq_2x_params_plus_step_tensors"] = True
    # end of each step: baseline + optimizer state, nothing else (no missed frees)
    assert s1["after_release"] == baseline + state_bytes + step_tensor_bytes
    assert s2["after_release"] == s1["after_release"]
    assert s2["after_optimizer"] == s2["after_backward"]  # no new state in step 2
    checks["end_of_step_eq_baseline_plus_state"] = True
    # grads: what zero_grad(set_to_none) frees == param bytes (every param gets a grad)
    assert s1["after_optimizer"] - s1["after_zero_grad"] == param_bytes, (s1["after_optimizer"], s1["after_zero_grad"])
    assert s2["after_optimizer"] - s2["after_zero_grad"] == param_bytes
    checks["zero_grad_frees_param_bytes"] = True
    # end of backward = start + grads (one per parameter) + the 4-byte loss: every activation is freed
    assert s1["after_backward"] == s1["start_bytes"] + param_bytes + 4
    assert s2["after_backward"] == s2["start_bytes"] + param_bytes + 4
    checks["after_backward_eq_start_plus_grads_plus_loss"] = True

    numels = [p.numel() for p in params]
    largest = max(numels)
    opt_info = {
        "param_bytes": param_bytes,
        "num_param_tensors": len(params),
        "largest_param_bytes": largest * 4,
        "state_bytes": state_bytes,
        "step_tensor_bytes": step_tensor_bytes,
    }
    for k, (summ, _) in (("step1", steps[0]), ("step2", steps[1])):
        # transient = peak inside the optimizer phase above the level it ends at
        opt_info[f"{k}_transient_bytes"] = summ["phase_peaks"]["optimizer"] - summ["after_optimizer"]
    if opt_name == "adamw":
        opt_info["for_loop_transient_model_bytes"] = for_loop_transient(numels)
        opt_info["foreach_transient_model_bytes"] = param_bytes  # _foreach_sqrt(exp_avg_sqs): one P-sized list
        for k in ("step1", "step2"):
            extra = opt_info[f"{k}_transient_bytes"] - opt_info["for_loop_transient_model_bytes"]
            # the rest are 0-dim CPU scalar tensors (Python-float wrapping), a few bytes
            assert 0 <= extra <= 64, (k, extra, opt_info)
            opt_info[f"{k}_transient_minus_model_bytes"] = extra

    res = {
        "name": case_name(fam, cfg, b, s),
        "family": fam, "config": cfg, "batch": b, "seq": s, "dtype": "float32",
        "optimizer": opt_desc,
        "param_bytes": param_bytes, "input_bytes": input_bytes, "buffer_bytes": buffer_bytes,
        "baseline_bytes": baseline,
        "step1": s1, "step2": s2,
        "optimizer_accounting": opt_info,
        "checks": checks,
    }
    if fam != "toy_mlp":
        sv = A.measure(fam, cfg, b, s)
        res["saved_bytes"] = sv["saved_bytes"]  # activations fixture's number, for reference
        # end of forward = start + saved activations (input_ids already in the baseline) + the 4-byte loss
        for k in ("step1", "step2"):
            st = res[k]
            assert st["after_forward"] == st["start_bytes"] + sv["saved_bytes"] - sv["saved_input_ids_bytes"] + 4, \
                (k, st["after_forward"], st["start_bytes"], sv["saved_bytes"])
        checks["after_forward_eq_start_plus_saved_activations_plus_loss"] = True
    return res, steps


def event_table(events):
    ops = []
    idx = {}
    rows = []
    for e in events:
        op = e["path"]
        if op not in idx:
            idx[op] = len(ops)
            ops.append(op)
        rows.append([e["delta"], PHASES.index(e["phase"]), idx[op]])
    return {"columns": ["delta_bytes", "phase_index", "op_index"], "phases": PHASES, "ops": ops, "events": rows}


# --------------------------------------------------------------------------------------
# self test: the profiler's deltas reproduce known allocations
# --------------------------------------------------------------------------------------

def selftest():
    with new_profile() as prof:
        with Phase("forward"):
            a = torch.empty(1024 * 1024)  # 4 MiB
            b = torch.empty(3, 5, dtype=torch.float64)  # 120 B, not rounded
            del a
        with Phase("backward"):
            del b
    ev = alloc_events(prof)
    deltas = [(e["delta"], e["phase"]) for e in ev]
    assert deltas == [(4194304, "forward"), (120, "forward"), (-4194304, "forward"), (-120, "backward")], deltas
    s = summarize(ev, 0)
    assert s["peak_bytes"] == 4194304 + 120 and s["after_forward"] == 120 and s["after_backward"] == 0, s
    return deltas


NOTES = (
    "CPU profiler ([memory] events from kineto_results.experimental_event_tree), torch 1.13, fp32, 2 intra-op "
    "threads. Live bytes = baseline_bytes (params, tied once, + input_ids; labels = input_ids; module buffers "
    "excluded, see buffer_bytes) + running sum of allocation deltas in time order. step2 starts at "
    "step1.after_release = baseline + optimizer state. CPU sizes are exact nbytes (no 512 B rounding). "
    "Dropout via torch.native_dropout (bool mask) as on CUDA. step_tensor_bytes (0-dim fp32 'step' per param) "
    "live on the CPU even when training on CUDA (capturable=False). Small (<=8 B) allocations of 0-dim CPU "
    "tensors made by wrapping Python scalars are included; on CUDA they are host memory."
)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--selftest", action="store_true")
    args = ap.parse_args()
    selftest()
    if args.selftest:
        print("selftest ok")
        return
    results = []
    events = {}
    cases = build_cases()
    cases.append(("toy_mlp", {"in": 1024, "layers": [[1024, 1024], [1024, 1024], [1024, 2048]], "bias": True,
                              "loss": "sum", "optimizer": "adamw"}, 10240, 1))
    for fam, cfg, b, s in cases:
        r, steps = measure(fam, cfg, b, s)
        r["notes"] = NOTES
        results.append(r)
        if r["name"] in EVENTS_FOR:
            events[r["name"]] = event_table(steps[0][1])
        s1, s2 = r["step1"], r["step2"]
        print(f"{r['name']:<28} base={r['baseline_bytes']:>10} step1 peak={s1['peak_bytes']:>11} "
              f"({s1['peak_phase']}/{s1['peak_op']}) step2 peak={s2['peak_bytes']:>11} ({s2['peak_phase']}/"
              f"{s2['peak_op']}) ev={s1['num_memory_events']}/{s2['num_memory_events']}", file=sys.stderr)
    out = {"generator": "oracle/step_oracle.py", "torch_version": torch.__version__, "phases": PHASES,
           "num_threads": torch.get_num_threads(),
           "cases": results, "step1_events": events}
    if args.out:
        A.write_fixture(args.out, out)


if __name__ == "__main__":
    main()
