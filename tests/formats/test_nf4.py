"""NF4 in bitsandbytes' layout (localchat/formats/nf4.py): the quantizer's layout and error,
NF4Linear, and a whole NF4 model (the bundled one, exported and quantized) in the torch
engine."""

from __future__ import annotations

import json

import pytest
import torch

from localchat.engine.base import Message, Request, SamplingParams
from localchat.engine.executors.torch.hf_weights import load_hf_weights
from localchat.engine.executors.torch.model import KVStore, LlamaModel
from localchat.engine.executors.torch.qlinear import NF4Linear
from localchat.formats.nf4 import (NF4_LEVELS, dequantize, dequantize_nf4, dynamic_map, load_nf4,
                                   quantize_nf4)
from quantize.nf4_hf import quantize_hf_dir_to_nf4

LEVELS = torch.tensor(NF4_LEVELS)


def _codes(parts) -> torch.Tensor:
    packed = parts["weight"].flatten()
    return torch.stack([packed >> 4, packed & 15], dim=-1).flatten()


def test_layout_high_nibble_first_blocks_of_64():
    idx = torch.randint(0, 16, (4, 128), generator=torch.Generator().manual_seed(0))
    idx[:, ::64] = 0  # every block holds a -1 level: its absmax is exactly 2.5
    w = LEVELS[idx] * 2.5
    parts = quantize_nf4(w)
    assert parts["weight"].dtype == torch.uint8 and parts["weight"].shape == (4 * 128 // 2, 1)
    assert int(parts["weight"][0, 0]) == int(idx[0, 0]) << 4 | int(idx[0, 1])
    assert torch.equal(_codes(parts), idx.flatten().to(torch.uint8))
    assert torch.equal(parts["weight.absmax"], torch.full((8,), 2.5))  # 512 weights / 64
    assert torch.equal(parts["weight.quant_map"], LEVELS) and len(set(NF4_LEVELS)) == 16
    assert LEVELS[0] == -1 and LEVELS[7] == 0 and LEVELS[15] == 1 and bool((LEVELS.diff() > 0).all())
    state = json.loads(bytes(parts["weight.quant_state.bitsandbytes__nf4"].tolist()))
    assert state == {"quant_type": "nf4", "blocksize": 64, "dtype": "float32", "shape": [4, 128]}
    assert torch.equal(dequantize_nf4(parts), w)  # levels themselves come back exactly


def test_error_is_bounded_by_half_the_largest_level_gap():
    w = torch.randn(96, 320, generator=torch.Generator().manual_seed(1)) * 0.05
    w[3, 7] = 4.0  # an outlier only costs its own block
    parts = quantize_nf4(w)
    err = (dequantize_nf4(parts) - w).abs().view(-1, 64)
    bound = LEVELS.diff().max() / 2 * parts["weight.absmax"]
    assert bool((err.amax(dim=1) <= bound * (1 + 1e-6)).all())
    # nearest-level rounding: the typical error is a fraction of the worst case (0.19 here)
    assert bool((err.mean(dim=1) < 0.3 * bound).all())


def test_double_quantization_round_trip():
    w = torch.randn(256, 512, generator=torch.Generator().manual_seed(2)) * 0.02
    single, double = quantize_nf4(w), quantize_nf4(w, double_quant=True)
    assert double["weight.absmax"].dtype == torch.uint8
    assert double["weight.nested_absmax"].shape == (-(-w.numel() // 64 // 256),)
    assert torch.equal(double["weight.nested_quant_map"], dynamic_map())
    state = json.loads(bytes(double["weight.quant_state.bitsandbytes__nf4"].tolist()))
    assert state["nested_blocksize"] == 256 and abs(state["nested_offset"]
                                                    - single["weight.absmax"].mean().item()) < 1e-6
    assert torch.equal(double["weight"], single["weight"])  # the codes do not change
    s, d = dequantize_nf4(single), dequantize_nf4(double)
    assert (s - d).abs().max() < 0.01 * w.abs().max()
    assert (d - w).norm() < 1.02 * (s - w).norm()


def test_dynamic_map_is_bitsandbytes_signed_8bit_map():
    d = dynamic_map()
    assert d.shape == (256,) and bool((d.diff() > 0).all())
    assert d[-1] == 1.0 and (d == 0).sum() == 1 and d.min() > -1
    assert torch.allclose(d[128:].abs().min(), torch.tensor(5.5e-7))  # 10^-6 · mean(0.1, 1)


def test_nf4_linear_equals_dequantize_then_matmul():
    w = torch.randn(200, 192, generator=torch.Generator().manual_seed(3))
    m = load_nf4(quantize_nf4(w, double_quant=True).get, "weight")
    layer = NF4Linear(m)
    layer.CHUNK_ROWS = 64  # several chunks, the last one partial
    x = torch.randn(5, 192)
    assert torch.allclose(layer(x), x @ dequantize(m).t(), atol=1e-5)
    assert layer.codes.numel() == 200 * 192 // 2  # packed codes only, no dense copy
    # rows that are not whole blocks come back dense (they cannot be chunked by rows)
    odd = torch.randn(3, 100)
    dense = load_nf4(quantize_nf4(odd).get, "weight")
    assert isinstance(dense, torch.Tensor) and (dense - odd).abs().max() < 0.2 * odd.abs().max()


@pytest.fixture(scope="module")
def nf4_dir(hf_dir, tmp_path_factory):
    return quantize_hf_dir_to_nf4(hf_dir, tmp_path_factory.mktemp("nf4") / "smollm2-nf4",
                                  double_quant=True)


def test_nf4_model_runs_in_the_torch_engine(nf4_dir, hf_dir):
    """The whole NF4 model: generates, and agrees with its float32 source on most
    teacher-forced next tokens. Measured 0.725 over 200 positions of Python's docs
    (SmolLM2-135M is small and its float32 weights were already Q4_1); broken NF4
    (wrong nibble order, wrong levels) scores near 0."""
    from pydoc_data.topics import topics

    from localchat.engine import EngineConfig, open_engine

    torch.set_num_threads(2)
    eng = open_engine(EngineConfig(str(nf4_dir), engine="torch", ctx_size=512, threads=2,
                      kv_memory=1024 * 23040))
    try:
        assert eng.info.quant_type == "NF4"
        reply = eng.complete(Request(messages=[Message("user", "What is the capital of France?")],
                                     sampling=SamplingParams(temperature=0.0), max_tokens=8))
        assert reply.text.strip()
        tokens = eng.tokenize_text(topics["if"] + topics["for"] + topics["while"])[:200]
    finally:
        eng.close()
    nf4, f32 = load_hf_weights(nf4_dir), load_hf_weights(hf_dir)
    assert nf4.nbytes() < 0.35 * f32.nbytes()
    n = len(tokens)
    logits = [LlamaModel(w, 256).forward(torch.tensor(tokens), torch.arange(n), torch.arange(n),
                                         torch.arange(n), KVStore(w.config, 256), all_logits=True)
              for w in (nf4, f32)]
    agreement = (logits[0].argmax(-1) == logits[1].argmax(-1)).float().mean().item()
    print(f"NF4 (double-quant) vs float32 top-1 agreement: {agreement:.3f} over {n} positions; "
          f"weights {nf4.nbytes() / 2**20:.0f} MiB vs {f32.nbytes() / 2**20:.0f} MiB")
    assert n == 200 and agreement >= 0.65
