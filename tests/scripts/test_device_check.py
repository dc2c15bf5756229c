"""scripts/device_check.py, the one command a lent GPU machine runs, run here on the CPU
(--quick --device cpu): it must pass, and its JSON must hold what a GPU session reads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.subprocess  # runs the CLI or starts a process

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "device_check.py"


@pytest.mark.slow
def test_quick_device_check_passes_on_the_cpu(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path / "out"),
           "LOCALCHAT_HOME": str(tmp_path / "home")}
    run = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--device", "cpu"],
                         capture_output=True, text=True, env=env, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip().splitlines()[-1] == "device-check: PASS"
    report = json.loads((tmp_path / "out" / "device_check.json").read_text())
    assert report["passed"] and not report["failures"]
    assert report["agreement"]["top1_agreement"] >= 0.999  # CPU against CPU
    assert report["agreement"]["max_abs_diff"] < 1e-3
    assert report["batching"]["batched_equals_alone"] is True
    assert report["batching"]["first_cached_tokens"] == 0
    assert min(report["batching"]["cached_tokens"]) > 0
    assert report["speed"]["decode_tok_s_1"] > 0 and report["speed"]["aggregate_tok_s"] > 0
    assert report["kernels"] and report["environment"]["torch"]
    assert report["lines"][-1] == "device-check: PASS"
