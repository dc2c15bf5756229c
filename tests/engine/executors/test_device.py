"""Device selection for the torch engine: CUDA if present, else MPS, else CPU; --device
overrides with a clear error for a device that is not there. (This project's CI machine
has no GPU: the CUDA kernels themselves are exercised only where one exists.)"""

from __future__ import annotations


import pytest
import torch

from localchat.engine.executors.torch.device import pick_device
from localchat.errors import UsageError

from helpers.cli import localchat


def test_auto_picks_the_best_available_device():
    expected = "cuda" if torch.cuda.is_available() else (
        "mps" if torch.backends.mps.is_available() else "cpu")
    assert pick_device(None).type == expected == pick_device("auto").type
    assert pick_device("cpu") == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_missing_cuda_is_a_clear_usage_error():
    with pytest.raises(UsageError, match="no CUDA device"):
        pick_device("cuda")
    with pytest.raises(UsageError, match="device .tpu. is unknown"):
        pick_device("tpu")


@pytest.mark.subprocess
def test_device_flag_errors_are_one_line():
    done = localchat("run", "--engine", "torch", "--device", "tpu", "hi")
    assert done.returncode == 2 and done.stderr.startswith("localchat: error: --device 'tpu' is unknown")
    assert "Traceback" not in done.stderr

