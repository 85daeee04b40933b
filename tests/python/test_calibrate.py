"""gpumem.calibrate(): the calibration document the CLI writes with --out, and
its use through calibration= (a file or the document).

Run: PYTHONPATH=build/python GPUMEM_CLI=build/gpumem python3 -m pytest -q tests/python/test_calibrate.py
"""
import json
import os
import subprocess
from pathlib import Path

import gpumem

ROOT = Path(__file__).resolve().parents[2]
CLI = os.environ.get("GPUMEM_CLI", str(ROOT / "build" / "gpumem"))
# V100 bert-large, batch 4, seq 512, fp32: nvidia-smi 14949 MiB (tests/fixtures/groundtruth/measured.json)
JOB = dict(gpu="V100-16GB", seq=512, batch=4, attention="eager", precision="fp32", cuda_context="1343MiB",
           zero_grad="zero", optimizer_impl="for-loop")


def test_calibrate_writes_what_the_cli_writes(tmp_path):
    out = tmp_path / "calib.json"
    doc = gpumem.calibrate("bert-large-uncased", out=str(out), measured_total="14949MiB", **JOB)
    assert json.loads(out.read_text()) == doc.to_dict()
    cli_out = tmp_path / "cli.json"
    args = [CLI, "calibrate", "bert-large-uncased", "--measured-total", "14949MiB", "--out", str(cli_out)]
    for k, v in JOB.items():
        args += ["--" + k.replace("_", "-"), str(v)]
    p = subprocess.run(args, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert json.loads(cli_out.read_text()) == doc.to_dict()


def test_calibrated_estimate_predicts_the_measured_job(tmp_path):
    out = tmp_path / "calib.json"
    gpumem.calibrate("bert-large-uncased", out=str(out), measured_total="14949MiB", **JOB)
    est = gpumem.estimate("bert-large-uncased", calibration=str(out), **JOB)
    # calibrated on this very job: the prediction equals the measurement (14949 MiB) to a MiB
    assert abs(est.per_gpu.total_device - 14949 * 2**20) <= 2**20
    lo, hi = est.uncertainty.range.low, est.uncertainty.range.high
    assert lo <= 14949 * 2**20 <= hi
