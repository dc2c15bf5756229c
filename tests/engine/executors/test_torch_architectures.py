"""The torch engine's forward pass against llama.cpp on small random models of each
variant it runs: llama, qwen2 (q/k/v biases, half rotation), linear RoPE scaling and
Llama 3.1's per-frequency RoPE factors. Float32 weights, so both sides compute the same
function and only rounding (fp16 KV cache, summation order) separates them."""

from __future__ import annotations

import dataclasses

import gguf
import numpy as np
import pytest
import torch

from localchat.engine.executors.torch.rope import llama3_rope_factors
from quantize.agreement import llama_cpp_logits, torch_logits
from localchat.engine.executors.torch.weights import load_weights
from localchat.errors import EngineError
from helpers.tiny_models import HEAD_DIM, write_random_model

N = 300  # positions: long enough for RoPE scaling to matter


@pytest.fixture(scope="module")
def tokens():
    return np.random.default_rng(1).integers(3, 49152, N).tolist()


VARIANTS = {
    "llama": {},
    "qwen2": {"arch": "qwen2"},
    "linear-rope": {"linear_rope_factor": 4.0},
    "llama3-rope": {"rope_freqs": llama3_rope_factors(HEAD_DIM, 10000.0, 8.0, 1.0, 4.0, 64).numpy()},
}


@pytest.mark.model
@pytest.mark.parametrize("variant", VARIANTS)
def test_float32_model_matches_llama_cpp(tmp_path, tokens, variant):
    path = write_random_model(tmp_path / f"{variant}.gguf", **VARIANTS[variant])
    reference = llama_cpp_logits(path, tokens)
    weights = load_weights(path)
    ours = torch_logits(weights, tokens)
    diff = (ours - reference).abs().max().item()
    print(f"{variant}: max logit diff {diff:.4f} (logits up to {reference.abs().max():.0f})")
    assert diff < 0.1  # measured 0.012-0.016 with logits up to ~130
    assert torch.equal(ours.argmax(-1), reference.argmax(-1))
    if variant.endswith("rope"):  # the scaling is what made them agree
        plain = dataclasses.replace(weights, rope_freqs=None,
                                    config=dataclasses.replace(weights.config, rope_position_scale=1.0))
        assert (torch_logits(plain, tokens) - reference).abs().max() > 1.0


@pytest.mark.model
def test_q4_0_model_matches_llama_cpp_closely(tmp_path, tokens):
    """4-bit weights through the int4 kernel; llama.cpp rounds activations to 8 bits and
    we to bfloat16, so logits differ by a little more (measured 0.8 of ~130)."""
    path = write_random_model(tmp_path / "q4_0.gguf", ggml_type=gguf.GGMLQuantizationType.Q4_0)
    reference = llama_cpp_logits(path, tokens)
    ours = torch_logits(load_weights(path), tokens)
    assert (ours - reference).abs().max() < 3.0
    assert (ours.argmax(-1) == reference.argmax(-1)).float().mean() >= 0.98


def test_unsupported_rope_scaling_points_to_llama_cpp(tmp_path):
    from localchat.engine.executors.torch.weights import LlamaConfig

    meta = {"general.architecture": "llama", "llama.rope.scaling.type": "yarn"}
    with pytest.raises(EngineError, match="yarn.*use the llama.cpp engine"):
        LlamaConfig.from_metadata(meta)
