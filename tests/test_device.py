"""Device selection for the torch engine: CUDA if present, else MPS, else CPU; --device
overrides with a clear error for a device that is not there. (This project's CI machine
has no GPU: the CUDA kernels themselves are exercised only where one exists.)"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from localchat.engine.executors.torch import qlinear
from localchat.engine.executors.torch.device import pick_device
from localchat.errors import UsageError


def test_auto_picks_the_best_available_device():
    expected = "cuda" if torch.cuda.is_available() else (
        "mps" if torch.backends.mps.is_available() else "cpu")
    assert pick_device(None).type == expected == pick_device("auto").type
    assert pick_device("cpu") == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_missing_cuda_is_a_clear_usage_error():
    with pytest.raises(UsageError, match="no CUDA device"):
        pick_device("cuda")
    with pytest.raises(UsageError, match="unknown device"):
        pick_device("tpu")


def test_device_flag_errors_are_one_line():
    done = subprocess.run([sys.executable, "-m", "localchat", "run", "--engine", "torch",
                           "--device", "tpu", "hi"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith("localchat: error: unknown device")
    assert "Traceback" not in done.stderr


def _random_q4(rows=64, cols=128, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.integers(0, 16, (rows, cols)).astype(np.int32)
    d = rng.random((rows, cols // 32)).astype(np.float32) * 0.1
    zeros = rng.standard_normal((rows, cols // 32)).astype(np.float32) * 0.1
    return q, d, zeros


def test_a_failing_gpu_kernel_falls_back_to_dense_weights(monkeypatch):
    """Off the CPU, a missing int4 kernel (or one failing the reference check) becomes a
    float32 dense layer with the same weights; on the CPU the failure is an error."""
    def broken(*args, **kwargs):
        raise RuntimeError("no kernel for this device")

    monkeypatch.setattr(qlinear.Int4Linear, "__init__", broken)
    parts = [_random_q4()]
    layer = qlinear.int4_linear(parts, torch.device("meta"))
    assert isinstance(layer, qlinear.DenseLinear) and layer.weight.device.type == "meta"
    with pytest.raises(RuntimeError):
        qlinear.int4_linear(parts, torch.device("cpu"))
