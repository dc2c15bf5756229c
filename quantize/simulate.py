"""A float32 model with its 7 block projections quantized by a scheme and dequantized back
(embeddings, output and norms stay float32), so `eval --table` rows differ only in the
weights' rounding."""

from __future__ import annotations

from dataclasses import replace

import torch

from localchat.engine.executors.torch.qlinear import DenseLinear
from localchat.engine.executors.torch.weights import ModelWeights
from quantize.matrix_stats import MatrixError, matrix_error
from quantize.progress import Progress
from quantize.schemes import simulate

# fused layer attribute -> the GGUF names of the matrices stacked in it, by rows
FUSED = {"wqkv": ("attn_q", "attn_k", "attn_v"), "wo": ("attn_output",),
         "w_gate_up": ("ffn_gate", "ffn_up"), "w_down": ("ffn_down",)}


def _rows(weights: ModelWeights, field: str) -> list[int]:
    c = weights.config
    return {"wqkv": [c.n_heads * c.head_dim] + [c.n_kv_heads * c.head_dim] * 2,
            "wo": [c.dim], "w_gate_up": [c.ffn_dim] * 2, "w_down": [c.dim]}[field]


def projections(weights: ModelWeights):
    """(name, float32 matrix) for every block projection of a dense model."""
    for i, layer in enumerate(weights.layers):
        for field, names in FUSED.items():
            module = getattr(layer, field)
            if not isinstance(module, DenseLinear):
                raise TypeError(f"simulation needs float weights, not {type(module).__name__}")
            for name, w in zip(names, module.weight.split(_rows(weights, field))):
                yield f"blk.{i}.{name}.weight", w


def simulated_model(weights: ModelWeights, scheme: str) -> tuple[ModelWeights, list[MatrixError], float]:
    """(the model with simulated projections, per-matrix errors, bits per weight)."""
    errors: list[MatrixError] = []
    bits = numel = 0.0
    layers = []
    bar = Progress(f"simulating {scheme}", len(weights.layers))
    for i, layer in enumerate(weights.layers):
        new = {}
        for field, names in FUSED.items():
            parts = []
            for name, w in zip(names, getattr(layer, field).weight.split(_rows(weights, field))):
                w_hat, bpw = simulate(scheme, w)
                errors.append(matrix_error(f"blk.{i}.{name}.weight", w, w_hat, outliers=False))
                bits += bpw * w.numel()
                numel += w.numel()
                parts.append(w_hat)
            new[field] = DenseLinear(torch.cat(parts))
        layers.append(replace(layer, **new))
        bar.advance()
    bar.close()
    return replace(weights, layers=layers), errors, bits / numel
