"""The Python bindings give the CLI's answers: each function's to_dict()
equals `gpumem ... --format json` for the same request, and bad input raises
gpumem.GpumemError (a ValueError) with the CLI's message.

Run: PYTHONPATH=build/python GPUMEM_CLI=build/gpumem python3 -m pytest -q tests/python
"""
import json
import os
import subprocess
from pathlib import Path

import pytest

import gpumem

ROOT = Path(__file__).resolve().parents[2]
CLI = os.environ.get("GPUMEM_CLI", str(ROOT / "build" / "gpumem"))
SNAPSHOT = ROOT / "tests" / "fixtures" / "snapshots" / "train_step.pickle"
OOM = ("CUDA out of memory. Tried to allocate 1.24 GiB (GPU 0; 15.78 GiB total capacity; 10.34 GiB already "
       "allocated; 435.50 MiB free; 14.21 GiB reserved in total by PyTorch)")


def cli_json(*args):
    p = subprocess.run([CLI, *map(str, args), "--format", "json"], capture_output=True, text=True, check=False)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def cli_error(*args):
    p = subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, check=False)
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    prefix = "gpumem: error: "
    line = p.stderr.strip().splitlines()[-1]
    assert line.startswith(prefix), line
    return line[len(prefix):]


def test_cli_exists():
    assert Path(CLI).is_file(), f"set GPUMEM_CLI to the gpumem binary (tried {CLI})"


def test_estimate_matches_cli():
    est = gpumem.estimate("llama-3-8b", batch=2, seq=1024, grad_accum=4)
    assert isinstance(est, gpumem.Estimate) and isinstance(est, gpumem.Result)
    assert est.to_dict() == cli_json("estimate", "llama-3-8b", "--batch", 2, "--seq", 1024, "--grad-accum", 4)
    assert isinstance(est.per_gpu.total_device, int)
    assert est.per_gpu.total_device == est.to_dict()["per_gpu"]["total_device"]
    assert est.per_gpu.fits is False
    r = repr(est)
    assert r.startswith("<Estimate llama-3-8b train: ") and "GiB of 79.18 GiB, does not fit>" in r


def test_estimate_options_match_cli():
    est = gpumem.estimate("llama-3-8b", seq=2048, gpus=8, zero=3, recompute="full", alloc_conf="expandable_segments:True",
                          offload_optimizer="cpu", mfu=0.4, tf32=True)
    assert est.to_dict() == cli_json("estimate", "llama-3-8b", "--seq", 2048, "--gpus", 8, "--zero", 3, "--recompute", "full",
                                     "--alloc-conf", "expandable_segments:True", "--offload-optimizer", "cpu",
                                     "--mfu", 0.4, "--tf32")
    inf = gpumem.estimate("gpt2", mode="infer", batch=4, seq=512, gen_len=128, analytic=True)
    assert inf.to_dict() == cli_json("estimate", "gpt2", "--mode", "infer", "--batch", 4, "--seq", 512, "--gen-len", 128, "--analytic")
    assert "fits>" in repr(inf)


def test_time_options_match_cli():
    est = gpumem.estimate("llama-3-8b", seq=4096, gpus=16, tp=8, fp8=True, tp_comm_overlap=True, dp_comm_overlap=False,
                          gemm_efficiency=0.5, analytic=True)
    assert est.to_dict() == cli_json("estimate", "llama-3-8b", "--seq", 4096, "--gpus", 16, "--tp", 8, "--fp8", "--tp-comm-overlap",
                                     "--no-dp-comm-overlap", "--gemm-efficiency", 0.5, "--analytic")
    parts = est.to_dict()["time"]["breakdown"]
    assert abs(sum(parts.values()) - est.to_dict()["time"]["step_seconds"]) < 1e-9 * est.to_dict()["time"]["step_seconds"]


def test_uneven_pipeline_options_match_cli():
    est = gpumem.estimate("llama-3-8b", seq=1024, gpus=4, pp=4, pp_layers=[6, 10, 10, 6], grad_accum=4, analytic=True)
    assert est.to_dict() == cli_json("estimate", "llama-3-8b", "--seq", 1024, "--gpus", 4, "--pp", 4, "--pp-layers", "6,10,10,6",
                                     "--grad-accum", 4, "--analytic")
    assert [s["layers"] for s in est.to_dict()["parallel"]["stages"]] == [6, 10, 10, 6]
    est = gpumem.estimate("llama-3.1-405b", seq=1024, gpus=1024, tp=8, pp=16, pp_embedding_layer=True, pp_loss_layer=True,
                          gpus_per_node=8, analytic=True)
    assert est.to_dict() == cli_json("estimate", "llama-3.1-405b", "--seq", 1024, "--gpus", 1024, "--tp", 8, "--pp", 16,
                                     "--pp-embedding-layer", "--pp-loss-layer", "--gpus-per-node", 8, "--analytic")
    with pytest.raises(gpumem.GpumemError) as e:
        gpumem.estimate("deepseek-v3", gpus=1024, pp=16, ep=64, analytic=True)
    assert "--pp-first-layers" in str(e.value)


def test_params_matches_cli():
    p = gpumem.params("gpt2")
    assert isinstance(p, gpumem.Params)
    assert p.to_dict() == cli_json("params", "gpt2")
    assert "gpt2" in repr(p)
    assert gpumem.params(params="7B").to_dict() == cli_json("params", "--params", "7B")


def test_fit_matches_cli():
    f = gpumem.fit("gpt2", seq=1024, gpu="A100-40GB")
    assert isinstance(f, gpumem.Fit)
    assert f.to_dict() == cli_json("fit", "gpt2", "--seq", 1024, "--gpu", "A100-40GB")
    assert repr(f).startswith("<Fit gpt2")


def test_serving_matches_cli():
    s = gpumem.serving("llama-3.1-8b", gpu="H100-80GB", max_model_len=32768)
    assert isinstance(s, gpumem.Serving)
    assert s.to_dict() == cli_json("serving", "llama-3.1-8b", "--gpu", "H100-80GB", "--max-model-len", 32768)
    assert s.per_gpu.fits is True and s.kv_cache_tokens > 0
    # the engine's own command line: after -- on the CLI, a list in Python
    cmd = ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--max-model-len", "16384", "-tp", "2"]
    p = subprocess.run([CLI, "serving", "llama-3.1-8b", "--format", "json", "--", *cmd], capture_output=True, text=True, check=False)
    assert p.returncode == 0, p.stderr
    assert gpumem.serving("llama-3.1-8b", command=cmd).to_dict() == json.loads(p.stdout)
    assert json.loads(p.stdout)["tp"] == 2
    with pytest.raises(gpumem.GpumemError) as e:
        gpumem.serving("llama-3.1-8b", command=["vllm", "serve", "x", "--bogus", "1"])
    assert e.value.field == "command"
    # SGLang: its own fraction and flag names
    g = gpumem.serving("llama-3.1-8b", gpu="H100-80GB", engine="sglang", mem_fraction_static=0.88, max_model_len=131072)
    assert g.to_dict() == cli_json("serving", "llama-3.1-8b", "--gpu", "H100-80GB", "--engine", "sglang", "--mem-fraction-static", 0.88, "--max-model-len", 131072)
    assert g.to_dict()["engine"] == "sglang" and g.to_dict()["kv_cache_tokens"] > 400000
    # requests of 8k tokens: the count the KV cache holds, and a throughput row per concurrency level
    t = gpumem.serving("llama-3.1-8b", gpu="H100-80GB", max_model_len=32768, request_len=8192).to_dict()
    assert t["concurrency_at_request_len"] > t["max_concurrency"]
    assert t["throughput"][0]["concurrency"] == 1 and t["throughput"][-1]["concurrency"] == int(t["concurrency_at_request_len"])


def test_plan_matches_cli():
    p = gpumem.plan("llama-3-8b", gpus=8, top=3, headroom="10%", only_zero=[1, 3])
    assert isinstance(p, gpumem.Plan)
    want = cli_json("plan", "llama-3-8b", "--gpus", 8, "--top", 3, "--headroom", "10%", "--only-zero", "1,3")
    got = p.to_dict()
    for d in (got, want):  # wall-clock time of the search differs run to run
        d.pop("search_seconds", None)
    assert got == want
    assert repr(p).startswith("<Plan ")
    p = gpumem.plan("llama-3-8b", gpus=16, gpus_per_node=4, top=3, search_optimizer=True, seq=2048)
    want = cli_json("plan", "llama-3-8b", "--gpus", 16, "--gpus-per-node", 4, "--top", 3, "--search-optimizer", "--seq", 2048)
    got = p.to_dict()
    for d in (got, want):
        d.pop("search_seconds", None)
    assert got == want
    assert all(c["tp"] <= 4 for c in got["top"])


def test_sweep_matches_cli():
    s = gpumem.sweep("gpt2", batches=[1, 2, 4], seqs=[512, 1024])
    assert isinstance(s, gpumem.Sweep)
    assert s.to_dict() == cli_json("sweep", "gpt2", "--batches", "1,2,4", "--seqs", "512,1024")
    assert s.batches == [1, 2, 4] and len(s.points) == 6
    assert "6 points" in repr(s)


def test_advise_matches_cli():
    a = gpumem.advise("llama-3-8b", batch=4, seq=2048)
    assert isinstance(a, gpumem.Advice)
    assert a.to_dict() == cli_json("advise", "llama-3-8b", "--batch", 4, "--seq", 2048)
    assert "techniques" in repr(a)


def test_simulate_matches_cli_timeline(tmp_path):
    t = gpumem.simulate("gpt2", batch=2, seq=512)
    assert isinstance(t, gpumem.Timeline)
    out = tmp_path / "t.json"
    subprocess.run([CLI, "estimate", "gpt2", "--batch", "2", "--seq", "512", "--timeline", str(out)],
                   check=True, capture_output=True)
    assert t.to_dict() == json.loads(out.read_text())
    assert "events" in repr(t)


def test_snapshot_matches_cli():
    s = gpumem.snapshot(str(SNAPSHOT))
    assert isinstance(s, gpumem.Snapshot)
    assert s.to_dict() == cli_json("snapshot", SNAPSHOT)
    assert isinstance(s.peak_reserved, int)
    conf = "expandable_segments:True"
    assert gpumem.snapshot(SNAPSHOT, alloc_conf=conf).to_dict() == cli_json("snapshot", SNAPSHOT, "--alloc-conf", conf)
    assert "peak allocated" in repr(s)


def test_doctor_matches_cli():
    d = gpumem.doctor(OOM)
    assert isinstance(d, gpumem.Doctor)
    assert d.to_dict() == cli_json("doctor", OOM)
    assert "fragmentation" in d.explanation
    assert repr(d).startswith("<Doctor ")
    d2 = gpumem.doctor(OOM, model="llama-3.2-1b", batch=4, seq=2048, gpu="V100-16GB")
    assert d2.to_dict() == cli_json("doctor", OOM, "--model", "llama-3.2-1b", "--batch", 4, "--seq", 2048, "--gpu", "V100-16GB")


def test_models_and_gpus_match_cli():
    m = gpumem.models()
    assert isinstance(m, gpumem.Models)
    assert m.to_dict() == cli_json("models")
    assert "gpt2" in [x.name for x in m] and len(m) == len(m.to_dict()["models"])
    g = gpumem.gpus()
    assert g.to_dict() == cli_json("gpus")
    assert any(x.name == "H100-80GB" for x in g)
    assert repr(m).startswith("<Models ") and repr(g).startswith("<Gpus ")


def strictly_equal(a, b):
    """Equal values of the same types, objects' keys in the same order (a
    float 2.0 is not the int 2 here, as it is for ==)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(strictly_equal(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(strictly_equal(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("command,body", [
    ("estimate", {"model": "llama-3-8b", "batch": 2, "seq": 1024, "grad_accum": 4}),
    ("estimate", {"model": "llama-3-8b", "gpus": 16, "tp": 2, "pp": 2, "zero": 1, "analytic": True, "tokens": "1e12"}),
    ("estimate", {"model": "gpt2", "mode": "infer", "batch": 4, "seq": 512, "gen_len": 128}),
    ("plan", {"model": "llama-3-8b", "gpus": 8, "top": 2}),
    ("sweep", {"model": "gpt2", "batches": [1, 2], "seqs": [512]}),
    ("snapshot", {"file": str(SNAPSHOT)}),
    ("doctor", {"message": OOM, "model": "llama-3.2-1b", "batch": 4}),
    ("serving", {"model": "llama-3-8b", "gpu": "H100-80GB"}),
    ("gpus", {}),
])
def test_answer_objects_are_the_answer_text_read(command, body):
    # gpumem.call() builds the answer's Python objects directly
    # (_gpumem.call_value); they must be what json.loads of the answer's text
    # (_gpumem.call) gives: the same values, types and key order.
    text = json.dumps(body)
    want = json.loads(gpumem._gpumem.call(command, text, 0.0))
    got = gpumem._gpumem.call_value(command, text, 0.0)
    for d in (want, got):
        d.pop("search_seconds", None)  # (a plan's wall-clock time)
    assert strictly_equal(got, want)
    with pytest.raises(gpumem.GpumemError) as e:
        gpumem._gpumem.call_value(command, json.dumps(dict(body, batch=-1)), 0.0)
    assert (e.value.code, e.value.field) == ("invalid_argument", "batch")


@pytest.mark.parametrize("kwargs,args", [
    (dict(model="no-such-model"), ["estimate", "no-such-model"]),
    (dict(model="gpt2", precision="fp12"), ["estimate", "gpt2", "--precision", "fp12"]),
    (dict(model="gpt2", mode="pretrain"), ["estimate", "gpt2", "--mode", "pretrain"]),
    (dict(model="gpt2", gpu="RTX-9999"), ["estimate", "gpt2", "--gpu", "RTX-9999"]),
    (dict(model="gpt2", batch=0), ["estimate", "gpt2", "--batch", "0"]),
])
def test_errors_carry_cli_message(kwargs, args):
    with pytest.raises(ValueError) as e:
        gpumem.estimate(**kwargs)
    assert isinstance(e.value, gpumem.GpumemError)
    assert str(e.value) == cli_error(*args)
    assert isinstance(e.value.code, str) and isinstance(e.value.field, str)


def test_other_errors():
    with pytest.raises(gpumem.GpumemError) as e:
        gpumem.snapshot(str(ROOT / "no" / "such.pickle"))
    assert str(e.value) == cli_error("snapshot", str(ROOT / "no" / "such.pickle"))
    with pytest.raises(gpumem.GpumemError) as e:
        gpumem.params()
    assert str(e.value) == cli_error("params") and e.value.field == "model"
    with pytest.raises(gpumem.GpumemError) as e:
        gpumem.estimate("gpt2", no_such_option=1)
    assert "no_such_option" in str(e.value) and e.value.field == "no_such_option"
    with pytest.raises(gpumem.GpumemError) as e:
        gpumem.estimate("gpt2", grad_acum=2)
    assert "did you mean grad_accum?" in str(e.value)
    with pytest.raises(gpumem.GpumemError) as e:
        gpumem.plan("gpt2", only_tpp=[1])
    assert "only_tp" in str(e.value)
    with pytest.raises(gpumem.GpumemError):
        gpumem.plan("gpt2", headroom="lots")


def test_result_wrapper():
    est = gpumem.estimate("gpt2", analytic=True)
    d = est.to_dict()
    d["per_gpu"]["total_device"] = -1  # a copy: the result is unchanged
    assert est.per_gpu.total_device > 0
    assert est["per_gpu"]["capacity"] == est.per_gpu.capacity
    assert "per_gpu" in est and "per_gpu" in dir(est)
    with pytest.raises(AttributeError):
        est.no_such_field  # noqa: B018
    with pytest.raises(AttributeError):
        est.per_gpu = 1
    assert json.loads(est.to_json()) == est.to_dict()
    assert gpumem.call("estimate", {"model": "gpt2", "analytic": True}) == est.to_dict()


def test_docstrings():
    for name in ["estimate", "params", "fit", "plan", "sweep", "advise", "simulate", "snapshot", "doctor", "models", "gpus", "call"]:
        assert getattr(gpumem, name).__doc__, name


def test_keywords_are_the_field_table():
    # Every field the CLI takes for estimate is a keyword of gpumem.estimate.
    names = {f["key"] for f in gpumem.fields("estimate") if not f["cli_only"]}
    assert {"grad_accum", "gpu_memory", "pp_layers", "tp_comm_overlap", "dp_comm_overlap"} <= names
    # headroom as a percentage string is parsed by the library (the same rule as the CLI)
    a = gpumem.plan("gpt2", gpus=2, headroom="10%", top=1, analytic=True)
    b = gpumem.plan("gpt2", gpus=2, headroom=0.10, top=1, analytic=True)
    assert a.to_dict()["top"] == b.to_dict()["top"]
    assert gpumem.__version__.count(".") == 2


def test_stubs_type_results_from_the_schema():
    # The stubs give each result's to_dict() a TypedDict generated from docs/schema:
    # the keys a real answer has are declared there.
    import ast
    stub = os.path.join(os.path.dirname(gpumem.__file__), "__init__.pyi")
    tree = ast.parse(open(stub).read())
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    declared = {s.target.id for s in classes["EstimateDict"].body if isinstance(s, ast.AnnAssign)}
    est = gpumem.estimate("gpt2", seq=256, analytic=True).to_dict()
    assert set(est) <= declared | {"time", "flops"}
    per_gpu = {s.target.id for s in classes["EstimateDictPerGpu"].body if isinstance(s, ast.AnnAssign)}
    assert {"total_device", "capacity", "fits"} <= per_gpu
