"""Quantization-aware training's rounding is gguf's own, bit for bit, for every type a draft's
layers can be written in, and its gradient passes straight through."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize

from quantize.fake_quant import SUPPORTED, fake_quant, quant_dequant


@pytest.mark.parametrize("matrix_type", SUPPORTED, ids=lambda t: t.name)
def test_quant_dequant_is_gguf_s_rounding_bit_for_bit(matrix_type):
    torch.manual_seed(0)
    w = torch.randn(16, 256) * 0.05
    w[0, :32] = 0.0  # an all-zero block (scale 0)
    w[1, 32:64] = 0.01  # a constant block
    w[2, 64:96] = torch.linspace(-1e-3, 2.0, 32)  # a wide one
    expected = dequantize(quantize(w.numpy(), matrix_type), matrix_type)
    assert np.array_equal(quant_dequant(w, matrix_type).numpy(), expected)


def test_fake_quant_rounds_forward_and_passes_the_gradient_straight_through():
    w = (torch.randn(4, 64) * 0.05).requires_grad_()
    out = fake_quant(w, Q.Q4_1)
    assert torch.equal(out.detach(), quant_dequant(w, Q.Q4_1)) and not torch.equal(out.detach(), w)
    (out * torch.arange(64.0)).sum().backward()
    assert torch.equal(w.grad, torch.arange(64.0).expand(4, 64))
