"""The q4q8 kernels (GGUF blocks times int8 activations, llama.cpp's arithmetic on x86): the
exact sums llama.cpp's scheme defines, and the whole model on them, compiled ahead of time,
against the model on PyTorch's int4 kernel. (Mapping and choice: test_kernels.py.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.teacher_forced import teacher_forced

from localchat.engine.executors.torch import kernels, q4q8

pytestmark = pytest.mark.skipif(not q4q8.available(), reason="no AVX2 CPU or C++ compiler")


def _q8_activations(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's Q8 rounding of activations: per 32 values, d = max|x| / 127, q = round(x / d)."""
    groups = x.reshape(x.shape[0], -1, 32).astype(np.float32)
    d = np.abs(groups).max(axis=-1) / np.float32(127)
    q = np.rint(groups * np.where(d > 0, 1 / d, 0)[..., None].astype(np.float32))
    return q, d


def test_q4_blocks_times_int8_activations_are_the_exact_integer_sums():
    rng = np.random.default_rng(0)
    n, k, rows = 40, 256, 5
    q = rng.integers(0, 16, (n, k))
    scale = rng.random((n, k // 32)).astype(np.float32) * 0.02
    zero = (rng.random((n, k // 32)).astype(np.float32) - 0.5) * 0.1
    x = rng.standard_normal((rows, k)).astype(np.float32)
    layer = q4q8.Q4Q8Linear(torch.from_numpy(q), torch.from_numpy(scale), torch.from_numpy(zero))
    ours = layer(torch.from_numpy(x)).double().numpy()

    xq, dx = _q8_activations(x)
    dots = np.einsum("rgi,ngi->rng", xq, q.reshape(n, -1, 32))  # integers, exactly
    minimum = zero - 8 * scale
    expected = (np.einsum("rng,ng,rg->rn", dots, scale, dx)
                + np.einsum("ng,rg->rn", minimum, dx * xq.sum(-1)))
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5)


def test_q8_blocks_times_int8_activations_are_the_exact_integer_sums():
    rng = np.random.default_rng(1)
    n, k, rows = 24, 128, 3
    codes = rng.integers(-127, 128, (n, k)).astype(np.int8)
    d = rng.random((n, k // 32)).astype(np.float32) * 0.01
    x = rng.standard_normal((rows, k)).astype(np.float32)
    ours = q4q8.Q8Q8Linear(torch.from_numpy(codes), torch.from_numpy(d))(torch.from_numpy(x))

    xq, dx = _q8_activations(x)
    dots = np.einsum("rgi,ngi->rng", xq, codes.reshape(n, -1, 32).astype(np.float64))
    expected = np.einsum("rng,ng,rg->rn", dots, d, dx)
    np.testing.assert_allclose(ours.double().numpy(), expected, rtol=1e-5, atol=1e-5)


def test_the_model_on_q4q8_compiled_ahead_of_time_gives_the_int4pack_tokens(engine, monkeypatch):
    """The bundled model with every matrix on q4q8/q8q8 (what an AVX2 CPU chooses), its decode
    layers as an AOTInductor artifact calling the op, against PyTorch's int4 kernel eagerly."""
    from localchat.cli.eval_agreement import varied_text_tokens
    from localchat.engine.executors.torch.model import LlamaModel
    from localchat.engine.executors.torch.weights import load_weights
    from localchat.models.specs import resolve_model_facts

    path = resolve_model_facts("default").path
    tokens = torch.tensor(varied_text_tokens(engine, 96)[:96])
    reference = teacher_forced(LlamaModel(load_weights(path), 256, compiled=False), tokens, 64)
    monkeypatch.setattr(kernels, "KERNELS", tuple(kernels.BY_NAME[name] for name in
                                                  ("q4q8", "q8q8", "f32")))
    chooser = kernels.KernelChooser(torch.device("cpu"))
    model = LlamaModel(load_weights(path, chooser=chooser), 256, compiled=True)
    assert set(chooser.chosen.values()) == {"q4q8", "q8q8"}
    ours = teacher_forced(model, tokens, 64, warm=True)
    assert model.describe()["generated-token layers"] == "aotinductor"
    agree = (reference.argmax(-1) == ours.argmax(-1)).float().mean().item()
    assert agree >= 0.95, agree  # bfloat16 against int8 activations: both round
    assert (reference - ours).abs().max().item() < 2.0
