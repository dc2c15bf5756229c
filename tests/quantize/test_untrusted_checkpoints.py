"""Hostile or broken Hugging Face checkpoints and a hostile environment (issue 20) under
`localchat quantize`: one line, a non-zero exit, nothing left in the output folder."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from localchat.cli import main

from helpers.tiny_hf import tiny_tensors, write_tiny_hf_dir

Q = "model.layers.0.self_attn.q_proj.weight"
K = "model.layers.0.self_attn.k_proj.weight"


def _raw(path: Path, header: dict | bytes, data: bytes) -> Path:
    """A safetensors file with exactly this header, whatever it says."""
    head = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + data)
    return path


def _quantize_error(capsys, src: Path, out_dir: Path, type_name: str = "int8") -> str:
    out_dir.mkdir(exist_ok=True)
    rc = main(["quantize", str(src), "-o", str(out_dir / "out"), "--type", type_name])
    err = capsys.readouterr().err.strip()
    assert rc == 1 and err.startswith("localchat: error:"), err
    assert "\n" not in err and "Traceback" not in err
    assert list(out_dir.iterdir()) == []
    return err


def _with(**changes) -> dict:
    tensors = tiny_tensors()
    for name, value in changes.items():
        name = {"q": Q, "k": K}.get(name, name)
        if value is None:
            del tensors[name]
        else:
            tensors[name] = value
    return tensors


BAD_TENSORS = {
    "wrong shape": (_with(q=torch.randn(64, 63)), "q_proj.weight has shape [64, 63], config.json says [64, 64]"),
    "transposed": (_with(k=torch.randn(64, 32)), "k_proj.weight has shape [64, 32], config.json says [32, 64]"),
    "wrong dtype": (_with(q=torch.zeros(64, 64, dtype=torch.int32)), "has type I32, not a float type"),
    "I8 in a float model": (_with(q=torch.zeros(64, 64, dtype=torch.int8)), "has type I8"),
    "int8 without quantization_config": (
        _with(q=torch.zeros(64, 64, dtype=torch.int8), **{Q + "_scale": torch.ones(64)}),
        "quantization_config"),
    "missing": (_with(**{"model.layers.0.mlp.down_proj.weight": None}), "lacks tensor"),
}


@pytest.mark.parametrize("case", list(BAD_TENSORS))
@pytest.mark.parametrize("type_name", ["int8", "F32"])
def test_tensors_are_checked_against_config_before_writing(tmp_path, capsys, case, type_name):
    tensors, words = BAD_TENSORS[case]
    src = write_tiny_hf_dir(tmp_path / "src", tensors, with_tokenizer=True)
    err = _quantize_error(capsys, src, tmp_path / "out", type_name)
    assert words in err


F32_4 = {"dtype": "F32", "shape": [4]}
BAD_HEADERS = {
    "nested 60,000 deep": (b'{"a":' + b"[" * 60_000 + b"]" * 60_000 + b"}", 0, "nested too deeply"),
    "offsets as strings": ({"a": F32_4 | {"data_offsets": ["0", "16"]}}, 16, "two integers"),
    "overlapping": ({"a": F32_4 | {"data_offsets": [0, 16]}, "b": F32_4 | {"data_offsets": [8, 24]}},
                    24, "overlaps"),
    "reversed": ({"a": F32_4 | {"data_offsets": [16, 0]}}, 16, "reversed"),
    "negative shape": ({"a": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}}, 16,
                       "non-negative"),
    "unknown dtype": ({"a": {"dtype": "X9", "shape": [4], "data_offsets": [0, 16]}}, 16,
                      "unsupported dtype"),
    "size disagrees with shape": ({"a": {"dtype": "F32", "shape": [5], "data_offsets": [0, 16]}},
                                  16, "needs 20"),
    # issue 39 #9: json.loads let the last of two keys win, and skipped leading spaces
    "duplicate tensor key": (b'{"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}, '
                             b'"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}', 16,
                             "names tensor 'a' twice"),
    "header starting with spaces": (b'   {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}',
                                    16, "does not start with '{'"),
}


@pytest.mark.parametrize("case", list(BAD_HEADERS))
def test_malformed_safetensors_headers_are_one_line(tmp_path, capsys, case):
    header, n_data, words = BAD_HEADERS[case]
    src = write_tiny_hf_dir(tmp_path / "src", with_tokenizer=True)
    _raw(src / "model.safetensors", header, b"\0" * n_data)
    assert words in _quantize_error(capsys, src, tmp_path / "out")


def test_deeply_nested_config_json_is_one_line(tmp_path, capsys):
    src = write_tiny_hf_dir(tmp_path / "src", tiny_tensors(), with_tokenizer=True)
    (src / "config.json").write_text('{"a":' + "[" * 60_000 + "]" * 60_000 + "}")
    assert "nested too deeply" in _quantize_error(capsys, src, tmp_path / "out")


# -- the environment: a full disk, a terminate signal, file modes ---------------------------

@pytest.mark.parametrize("type_name", ["int8", "Q8_0"])
def test_too_little_free_space_is_refused_before_writing(tmp_path, capsys, monkeypatch, type_name):
    import shutil

    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=2**20))
    err = _quantize_error(capsys, "default", tmp_path / "out", type_name)
    assert "not enough free space" in err and "1.0 MiB" in err


def test_disk_filling_up_mid_write_of_safetensors_is_one_line(tmp_path, capsys, monkeypatch):
    import safetensors.torch
    from safetensors import SafetensorError

    def full(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    src = write_tiny_hf_dir(tmp_path / "src", tiny_tensors(), with_tokenizer=True)
    monkeypatch.setattr(safetensors.torch, "serialize_file", full)
    err = _quantize_error(capsys, src, tmp_path / "out")
    assert "No space left on device" in err and "nothing was written" in err


@pytest.mark.parametrize("type_name", ["int8", "nf4"])
def test_safetensors_outputs_have_one_file_mode(tmp_path, type_name):
    old = os.umask(0o022)
    try:
        src = write_tiny_hf_dir(tmp_path / "src", tiny_tensors(), with_tokenizer=True)
        assert main(["quantize", str(src), "-o", str(tmp_path / "out"), "--type", type_name]) == 0
    finally:
        os.umask(old)
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in (tmp_path / "out").iterdir()}
    assert set(modes.values()) == {"0o644"}, modes


@pytest.mark.subprocess
@pytest.mark.parametrize("type_name,out_name", [("Q8_0", "out.gguf"), ("int8", "out-int8")])
def test_sigterm_mid_quantize_leaves_nothing(tmp_path, type_name, out_name):
    """A real process, stopped by SIGTERM as soon as its first temporary file appears."""
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "localchat", "quantize", "default", "-o",
                             str(out_dir / out_name), "--type", type_name, "--threads", "1"],
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not any(out_dir.iterdir()) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "finished before it could be stopped"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert err.startswith("localchat: error: stopped by SIGTERM") and err.count("\n") == 1, err
    assert list(out_dir.iterdir()) == []


@pytest.mark.subprocess
@pytest.mark.slow  # a K-quant of the bundled model, stopped midway
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_llama_cpps_k_quant_step_stops_it(tmp_path, sig):
    """Issue 39 #13: a signal during llama.cpp's quantizer (one uninterruptible C call) was
    swallowed ("Exception ignored on calling ctypes callback") and the output written, exit 0.
    Stopped as soon as llama.cpp's output has bytes: exit 128+signal, nothing left."""
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "localchat", "quantize", "default", "-o",
                             str(out_dir / "out.gguf"), "--type", "Q4_K_M", "--threads", "1"],
                            stderr=subprocess.PIPE, text=True)

    def llama_cpp_writing() -> bool:  # the only plain file there is llama.cpp's output
        return any(p.is_file() and p.stat().st_size > 0 for p in out_dir.iterdir())

    deadline = time.monotonic() + 300
    while not llama_cpp_writing() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "finished before it could be stopped"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert "Exception ignored" not in err, err
    assert proc.returncode == 128 + sig, err
    assert list(out_dir.iterdir()) == []
