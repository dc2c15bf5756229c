"""The torch engine's Llama forward pass against llama.cpp on the real bundled model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from localchat.engine.torch.model import KVStore, LlamaModel
from localchat.engine.torch.weights import LlamaConfig, load_weights
from localchat.errors import EngineError
from localchat.models import resolve_model


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(2)
    weights = load_weights(resolve_model("default"))
    return LlamaModel(weights, max_positions=2048)


@pytest.fixture(scope="module")
def varied_tokens(engine):
    """≥ 1000 tokens of English prose, code and unicode from Python's own docs."""
    from pydoc_data.topics import topics

    text = topics["if"] + topics["for"] + topics["try"] + topics["class"] + " naïve café 東京 ✓"
    return engine.tokenize_text(text)[:1100]


def _agreement_with_llama_cpp(model, tokens) -> tuple[float, float]:
    import llama_cpp

    n = len(tokens)
    llm = llama_cpp.Llama(str(resolve_model("default")), n_ctx=1280, logits_all=True,
                          n_threads=2, verbose=False)
    try:
        llm.eval(tokens)
        reference = torch.from_numpy(np.array(llm.scores[:n]))
    finally:
        llm.close()
    kv = KVStore(model.config, 1280)
    ours = model.forward(torch.tensor(tokens), torch.arange(n), torch.arange(n),
                         torch.arange(n), kv, all_logits=True)
    agreement = (ours.argmax(-1) == reference.argmax(-1)).float().mean().item()
    max_diff = (ours - reference).abs().max().item()
    print(f"top-1 agreement {agreement:.4f} over {n} positions, max logit diff {max_diff:.3f}")
    return agreement, max_diff


@pytest.fixture(scope="module")
def agreement(model, varied_tokens):
    assert len(varied_tokens) >= 1000
    return _agreement_with_llama_cpp(model, varied_tokens)


def test_teacher_forced_top1_agreement_with_llama_cpp(agreement):
    """Measured 0.977 over 1100 positions (max logit diff ~1.7). Exactly dequantized
    float32 weights agree no better (0.974), so the gap is in numerics we do not yet
    share with llama.cpp, not in the int4 kernels; a broken model scores near 0."""
    top1, max_diff = agreement
    assert top1 >= 0.96 and max_diff < 3.0


@pytest.mark.xfail(strict=True, reason="issue target 99.5% not reached yet (0.977 measured)")
def test_agreement_reaches_the_issue_target(agreement):
    assert agreement[0] >= 0.995


def test_scattered_slots_give_the_same_logits_as_contiguous(model, varied_tokens):
    """Attention reads K/V through the slot list: where blocks live must not matter."""
    tokens = torch.tensor(varied_tokens[:40])
    n = len(tokens)
    contiguous = model.forward(tokens, torch.arange(n), torch.arange(n), torch.arange(n),
                               KVStore(model.config, 256), all_logits=True)
    blocks = torch.tensor([11, 3, 7])  # three 16-slot blocks, out of order
    slots = (blocks[:, None] * 16 + torch.arange(16)).flatten()[:n]
    scattered = model.forward(tokens, torch.arange(n), slots, slots,
                              KVStore(model.config, 256), all_logits=True)
    assert torch.allclose(contiguous, scattered, atol=1e-4)


def test_prefill_then_decode_equals_one_prefill(model, varied_tokens):
    tokens = torch.tensor(varied_tokens[:24])
    kv = KVStore(model.config, 64)
    full = model.forward(tokens, torch.arange(24), torch.arange(24), torch.arange(24), kv,
                         all_logits=True)
    kv2 = KVStore(model.config, 64)
    model.forward(tokens[:20], torch.arange(20), torch.arange(20), torch.arange(20), kv2)
    for p in range(20, 24):
        step = model.forward(tokens[p:p + 1], torch.tensor([p]), torch.tensor([p]),
                             torch.arange(p + 1), kv2)
        # bfloat16 activations: one-token and batched passes round differently
        assert step.argmax() == full[p].argmax()
        assert (step - full[p]).abs().max() < 0.5


def test_unsupported_architecture_points_to_llama_cpp():
    with pytest.raises(EngineError, match="--engine llama.cpp"):
        LlamaConfig.from_metadata({"general.architecture": "gemma3"})
