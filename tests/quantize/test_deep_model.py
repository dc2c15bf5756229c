"""scripts/deep-model: a deep copy of the bundled model (layers 30..59 copy 0..29 with o_proj
and down_proj zero) computes the source's greedy tokens, at twice the layers and bytes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from localchat.engine import EngineConfig, open_engine
from localchat.engine.base import Message, Request, SamplingParams
from localchat.models.files import validate_model_file
from quantize.deep_model import SILENT, deepen

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "deep-model"
PROMPTS = ("Write a Python function that reverses a string.", "What is the capital of France?",
           "List three colours.")


def test_deepen_copies_layers_and_silences_their_outputs():
    tensors = {"model.embed_tokens.weight": torch.ones(2, 2),
               **{f"model.layers.{i}.{n}": torch.full((2, 2), float(i + 1))
                  for i in range(2) for n in (*SILENT, "self_attn.q_proj.weight")}}
    deep = deepen(tensors, 2, 3)
    assert len([n for n in deep if n.endswith("q_proj.weight")]) == 6
    assert torch.equal(deep["model.layers.5.self_attn.q_proj.weight"], tensors[
        "model.layers.1.self_attn.q_proj.weight"])
    for i in range(2, 6):
        for n in SILENT:
            assert not deep[f"model.layers.{i}.{n}"].any()
    assert deep["model.layers.1.mlp.down_proj.weight"].eq(2).all()  # the originals stay


@pytest.mark.subprocess
@pytest.mark.slow
def test_a_deep_2_copy_has_the_sources_greedy_tokens(tmp_path, engine):
    """In the source's own type (Q4_1: its dequantized blocks requantize to themselves) the
    copy must decode exactly as the source; Q8_0 (the benchmark's) only adds its rounding."""
    out = tmp_path / "deep-2.gguf"
    done = subprocess.run([sys.executable, str(SCRIPT), "2", str(out), "--type", "Q4_1"],
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr
    facts = validate_model_file(out)
    assert facts.n_layers == 60
    deep = open_engine(EngineConfig(str(out), ctx_size=1024, threads=2))
    try:
        assert deep.info.weights_bytes > 1.5 * engine.info.weights_bytes  # the embedding is shared
        for prompt in PROMPTS:
            request = Request(messages=[Message("user", prompt)],
                              sampling=SamplingParams(temperature=0.0), max_tokens=24)
            assert deep.complete(request).text == engine.complete(request).text, prompt
    finally:
        deep.close()


@pytest.mark.subprocess
def test_bad_k_is_a_one_line_error(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "0", str(tmp_path / "x.gguf")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0
    assert "K must be 1..16" in done.stderr and not (tmp_path / "x.gguf").exists()
