"""Rotary position embeddings with the Llama family's context extensions: linear scaling and
Llama 3.1's per-frequency factors (GGUF's rope_freqs.weight, or llama3_rope_factors() from
a Hugging Face config)."""

from __future__ import annotations

import math

import torch


def inverse_frequencies(head_dim: int, base: float) -> torch.Tensor:
    half = head_dim // 2
    return 1.0 / (base ** (torch.arange(0, half, dtype=torch.float64) / half))


def llama3_rope_factors(head_dim: int, base: float, factor: float, low_freq_factor: float,
                        high_freq_factor: float, original_context: int) -> torch.Tensor:
    """Llama 3.1's divisors: long wavelengths slowed by `factor`, short ones untouched,
    a smooth blend in between (as transformers and llama.cpp's converter compute them)."""
    low_wavelen = original_context / low_freq_factor
    high_wavelen = original_context / high_freq_factor
    factors = []
    for freq in inverse_frequencies(head_dim, base).tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(factor)
        else:
            smooth = (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            factors.append(1.0 / ((1 - smooth) / factor + smooth))
    return torch.tensor(factors, dtype=torch.float32)


class RotaryEmbedding:
    """cos/sin tables for every position up to the context length, built once."""

    def __init__(self, head_dim: int, base: float, max_positions: int, *, neox: bool,
                 position_scale: float = 1.0, freq_factors: torch.Tensor | None = None) -> None:
        inv_freq = inverse_frequencies(head_dim, base)
        if freq_factors is not None:
            inv_freq = inv_freq / freq_factors.to("cpu", torch.float64)
        positions = torch.arange(max_positions, dtype=torch.float64) * position_scale
        angles = torch.outer(positions, inv_freq)
        self.cos, self.sin = angles.cos().float(), angles.sin().float()
        self.neox = neox

    def to(self, device: torch.device) -> "RotaryEmbedding":
        self.cos, self.sin = self.cos.to(device), self.sin.to(device)
        return self

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin for these positions, looked up once per forward (not per layer)."""
        return (self.cos.index_select(0, positions)[:, None, :],
                self.sin.index_select(0, positions)[:, None, :])

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x: [T, heads, head_dim]."""
        if self.neox:  # rotate halves (HF layout, and qwen2 in GGUF)
            a, b = x.chunk(2, dim=-1)
            return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)
        a, b = x[..., 0::2], x[..., 1::2]  # rotate adjacent pairs (GGUF's permuted Q/K)
        return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)
