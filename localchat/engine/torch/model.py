"""Llama-family forward pass over a paged KV store.

The KV store is one preallocated tensor pair per model, [layers, slots, kv_heads,
head_dim], where slot = block · block_size + offset. A forward call writes the new
tokens' keys/values into their slots and attends over the sequence's slots in position
order, as given by its block table, so sequences never need contiguous memory.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from localchat.engine.torch.rope import RotaryEmbedding
from localchat.engine.torch.weights import LlamaConfig, ModelWeights


class KVStore:
    """Preallocated keys and values for every slot of every block."""

    def __init__(self, config: LlamaConfig, n_slots: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu"):
        shape = (config.n_layers, n_slots, config.n_kv_heads, config.head_dim)
        # empty, not zeros: pages are committed only as slots are written (always before
        # they are read), so a large budget costs nothing until it is used
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)

    @property
    def bytes_per_token(self) -> int:
        layers, _, kv_heads, head_dim = self.k.shape
        return 2 * layers * kv_heads * head_dim * self.k.element_size()


class LlamaModel:
    def __init__(self, weights: ModelWeights, max_positions: int) -> None:
        self.w = weights
        self.config = weights.config
        c = self.config
        self.rope = RotaryEmbedding(c.head_dim, c.rope_base, max_positions, neox=c.rope_neox,
                                    position_scale=c.rope_position_scale,
                                    freq_factors=weights.rope_freqs)
        self.device = weights.embedding.device
        self.rope.to(self.device)

    def _attention(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                   mask: torch.Tensor | None) -> torch.Tensor:
        """Grouped-query attention without expanding K/V: the query heads that share a
        KV head are stacked into one matrix. q: [T, H, D]; keys/values: [L, KV, D]."""
        c = self.config
        n_new, group = q.shape[0], c.n_heads // c.n_kv_heads
        # [KV, group·T, D]: rows ordered (head-in-group, token)
        qg = q.reshape(n_new, c.n_kv_heads, group, c.head_dim).permute(1, 2, 0, 3)
        qg = qg.reshape(c.n_kv_heads, group * n_new, c.head_dim)
        scores = torch.bmm(qg, keys.permute(1, 2, 0)) * (c.head_dim ** -0.5)  # [KV, g·T, L]
        if mask is not None:
            scores = scores.masked_fill(~mask.repeat(group, 1), float("-inf"))
        out = torch.bmm(scores.softmax(-1), values.transpose(0, 1))  # [KV, g·T, D]
        out = out.view(c.n_kv_heads, group, n_new, c.head_dim).permute(2, 0, 1, 3)
        return out.reshape(n_new, c.n_heads * c.head_dim)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), weight, self.config.norm_eps)

    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor,  # [T] new tokens of one sequence
        positions: torch.Tensor,  # [T] their positions
        new_slots: torch.Tensor,  # [T] where their K/V go; -1: already there (shared block)
        context_slots: torch.Tensor,  # [L] every slot of the sequence, position order, incl. new
        kv: KVStore,
        all_logits: bool = False,
    ) -> torch.Tensor:
        """Logits for the last token ([vocab]), or for every new token ([T, vocab]), on
        the CPU (where sampling happens); the index tensors may be on the CPU too."""
        c = self.config
        dev = self.device
        tokens, positions = tokens.to(dev), positions.to(dev)
        new_slots, context_slots = new_slots.to(dev), context_slots.to(dev)
        n_new, n_ctx = tokens.shape[0], context_slots.shape[0]
        x = self.w.embedding[tokens]
        # query i (at positions[i]) sees context positions 0..positions[i]
        mask = torch.arange(n_ctx, device=dev)[None, :] <= positions[:, None]
        write = new_slots >= 0
        if not bool(write.all()):
            new_slots = new_slots[write]
        cos, sin = self.rope.tables(positions)
        n_qk = c.n_heads + c.n_kv_heads
        for i, layer in enumerate(self.w.layers):
            h = self._norm(x, layer.attn_norm)
            qkv = layer.wqkv(h)  # q, k and v projections fused into one matmul
            if layer.bqkv is not None:
                qkv = qkv + layer.bqkv
            qkv = qkv.view(n_new, n_qk + c.n_kv_heads, c.head_dim)
            qk = self.rope(qkv[:, :n_qk], cos, sin)  # q and k heads rotated together
            q, k, v = qk[:, :c.n_heads], qk[:, c.n_heads:], qkv[:, n_qk:]
            if new_slots.shape[0] != n_new:
                k, v = k[write], v[write]
            kv.k[i].index_copy_(0, new_slots, k.to(kv.k.dtype))
            kv.v[i].index_copy_(0, new_slots, v.to(kv.v.dtype))
            keys = kv.k[i].index_select(0, context_slots).to(q.dtype)
            values = kv.v[i].index_select(0, context_slots).to(q.dtype)
            attn = self._attention(q, keys, values, None if n_new == 1 else mask)
            x = x + layer.wo(attn)
            h = self._norm(x, layer.ffn_norm)
            gate, up = layer.w_gate_up(h).split(c.ffn_dim, dim=-1)
            x = x + layer.w_down(F.silu(gate) * up)
        x = self._norm(x if all_logits else x[-1:], self.w.output_norm)
        logits = self.w.output(x)
        return (logits if all_logits else logits[0]).float().cpu()
