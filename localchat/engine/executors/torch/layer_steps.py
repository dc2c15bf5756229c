"""A Llama layer's pieces as plain functions: a generated token's whole layer in one call
(compiled: ahead of time by aot_layer.py, else by torch.compile), a prompt's two calls around its
causal attention (eager: compiling them gained nothing measurable). No row depends on another or
on padding, so a token gets the same bits alone, batched or verified."""

from __future__ import annotations

import os
import shutil
from typing import Callable

import torch
import torch.nn.functional as F

from localchat.paths import cache_dir


def attention_inputs(x: torch.Tensor, norm: torch.Tensor, wqkv: torch.nn.Module,
                     bqkv: torch.Tensor | None, rope, cos: torch.Tensor, sin: torch.Tensor,
                     config, kv_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [T, dim] -> q [T, H, D], k and v [T, KV, D] in the KV store's dtype: norm, one
    fused matmul, RoPE on q and k."""
    c = config
    h = F.rms_norm(x, (x.shape[-1],), norm, c.norm_eps)
    qkv = wqkv(h)
    if bqkv is not None:
        qkv = qkv + bqkv
    n_qk = c.n_heads + c.n_kv_heads
    qkv = qkv.view(x.shape[0], n_qk + c.n_kv_heads, c.head_dim)
    qk = rope(qkv[:, :n_qk], cos, sin)  # q and k heads rotated together
    return qk[:, :c.n_heads], qk[:, c.n_heads:].to(kv_dtype), qkv[:, n_qk:].to(kv_dtype)


def rounded_as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t rounded to `dtype` and back: what a matmul against a cache of that dtype sees. llama.cpp
    rounds the query and the softmax weights to f16 against its f16 cache; so do we."""
    return t.to(dtype).to(t.dtype)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     padded: torch.Tensor, valid: torch.Tensor, config) -> torch.Tensor:
    """B single-token queries, each over its own slots padded to one length: q [B, H, D],
    padded and valid [B, L] -> [B, H·D]. The query heads sharing a KV head form one matrix."""
    c = config
    b, length = padded.shape
    flat = padded.flatten()
    keys = k_cache.index_select(0, flat).view(b, length, *k_cache.shape[1:])
    values = v_cache.index_select(0, flat).view(b, length, *v_cache.shape[1:])
    qg = rounded_as(q, k_cache.dtype).reshape(b, c.n_kv_heads, c.n_heads // c.n_kv_heads, c.head_dim)
    keys, values = (t.transpose(1, 2).to(q.dtype, memory_format=torch.contiguous_format)
                    for t in (keys, values))
    scores = torch.matmul(qg, keys.transpose(-1, -2)) * (c.head_dim ** -0.5)  # [B,KV,g,L]
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    out = torch.matmul(rounded_as(scores.softmax(-1), v_cache.dtype), values)  # [B, KV, g, D]
    return out.reshape(b, c.n_heads * c.head_dim)


def rest_of_layer(x: torch.Tensor, attn: torch.Tensor, wo: torch.nn.Module,
                  ffn_norm: torch.Tensor, w_gate_up: torch.nn.Module, w_down: torch.nn.Module,
                  config) -> torch.Tensor:
    """The attention's output projection and residual, then the SwiGLU feed-forward."""
    c = config
    x = x + wo(attn)
    h = F.rms_norm(x, (x.shape[-1],), ffn_norm, c.norm_eps)
    gate, up = w_gate_up(h).split(c.ffn_dim, dim=-1)
    return x + w_down(F.silu(gate) * up)


def decode_layer(x: torch.Tensor, new_slots: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, padded: torch.Tensor, valid: torch.Tensor, attn_norm,
                 wqkv, bqkv, wo, ffn_norm, w_gate_up, w_down, rope, cos, sin, config,
                 kv_dtype) -> torch.Tensor:
    """A whole layer for rows that are single queries (generated tokens), in one call (one
    graph): q/k/v, their K/V written at new_slots, attention over the padded slots, the rest."""
    q, k, v = attention_inputs(x, attn_norm, wqkv, bqkv, rope, cos, sin, config, kv_dtype)
    k_cache.index_copy_(0, new_slots, k)
    v_cache.index_copy_(0, new_slots, v)
    attn = decode_attention(q, k_cache, v_cache, padded, valid, config)
    return rest_of_layer(x, attn, wo, ffn_norm, w_gate_up, w_down, config)


PIECES = (attention_inputs, decode_attention, rest_of_layer, decode_layer)
COMPILED = (decode_layer,)  # 30 calls a step; torch.compile only where AOTInductor fails
_compiled: dict[str, Callable] = {}


def compiles_by_default(device: torch.device) -> bool:
    """Compiled on a CPU with a C++ compiler, unless LOCALCHAT_EAGER=1 (as vLLM's
    --enforce-eager); CUDA and MPS stay eager until measured there."""
    if os.environ.get("LOCALCHAT_EAGER", "") not in ("", "0"):
        return False
    return device.type == "cpu" and any(shutil.which(cc) for cc in ("g++", "c++", "clang++"))


class LayerSteps:
    """The pieces a forward pass calls: the functions themselves, or compiled forms of those
    in COMPILED (compiled on first call, once per process, so a model whose layers run ahead of
    time never imports torch.compile; Inductor's code is kept in the cache dir's inductor/)."""

    def __init__(self, compiled: bool) -> None:
        self.compiled = compiled
        for piece in PIECES:
            setattr(self, piece.__name__, _on_first_call(piece) if compiled and piece in COMPILED
                    else piece)


def _on_first_call(piece: Callable) -> Callable:
    def run(*args):
        return _compile(piece)(*args)
    return run


def _compile(piece: Callable) -> Callable:
    if piece.__name__ not in _compiled:
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir() / "inductor"))
        import torch._dynamo
        import torch.fx.experimental._config as shapes

        torch._dynamo.config.suppress_errors = True  # a piece that fails to compile runs eagerly
        # up to 4 graphs per model shape; a target and a draft of another size need 8, and
        # past the limit a shape would run eagerly (other bits than its compiled steps)
        torch._dynamo.config.recompile_limit = 64
        # graphs for the first shape, one row, and any other row count or context length
        # (a context of 64 must not be taken for the head size)
        shapes.use_duck_shape = False
        _compiled[piece.__name__] = torch.compile(piece, dynamic=None)
    return _compiled[piece.__name__]
