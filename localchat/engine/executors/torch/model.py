"""Llama-family forward pass over a paged KV store: one preallocated [layers, slots, kv_heads,
head_dim] pair (slot = block · block_size + offset), each sequence attended in its block
table's order, so no sequence needs contiguous memory."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from localchat.engine.executors.torch.layer_steps import LayerSteps, compiles_by_default
from localchat.engine.executors.torch.rope import RotaryEmbedding
from localchat.engine.executors.torch.weights import LlamaConfig, ModelWeights


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
    def __init__(self, weights: ModelWeights, max_positions: int,
                 compiled: bool | None = None) -> None:
        """compiled: the layer pieces compiled by Inductor (None: where layer_steps says so)."""
        self.w = weights
        self.config = weights.config
        c = self.config
        self.rope = RotaryEmbedding(c.head_dim, c.rope_base, max_positions, neox=c.rope_neox,
                                    position_scale=c.rope_position_scale,
                                    freq_factors=weights.rope_freqs)
        self.device = weights.embedding.device
        self.rope.to(self.device)
        self.steps = LayerSteps(compiles_by_default(self.device) if compiled is None else compiled)

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

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, new_slots: torch.Tensor,
                context_slots: torch.Tensor, kv: KVStore, all_logits: bool = False
                ) -> torch.Tensor:
        """One sequence: logits for its last new token ([vocab]), or for every new token
        ([T, vocab]). new_slots: where the new tokens' K/V go (-1: already there, in a
        shared block); context_slots: every slot of the sequence in position order."""
        n = tokens.shape[0]
        row_wise_from = int(positions[0]) if n <= _AttentionPlan.ROW_WISE else int(positions[-1]) + 1
        batch = Batch(tokens, positions, new_slots,
                      [(n, context_slots.to(torch.long), row_wise_from)],
                      logit_rows=torch.arange(n) if all_logits else torch.tensor([n - 1]))
        logits = self.forward_batch(batch, kv)
        return logits if all_logits else logits[0]

    def warm_up(self, kv: KVStore) -> None:
        """Compile now what replies would otherwise wait for (a prompt; one sequence decoding
        and several, at contexts of one and two PAD_TO buckets). Writes slots 0-72, which
        nothing reads before writing them again."""
        if not self.steps.compiled or min(kv.k.shape[1], self.rope.cos.shape[0]) < 73:
            return
        tokens, slots = torch.zeros(73, dtype=torch.long), torch.arange(73)
        for start, end in ((0, 17), (17, 18), (18, 20), (20, 70), (70, 71), (71, 73)):
            self.forward(tokens[start:end], slots[start:end], slots[start:end], slots[:end], kv)

    @torch.inference_mode()
    def forward_batch(self, batch: "Batch", kv: KVStore) -> torch.Tensor:
        """Several sequences of different lengths in one pass: every matmul sees all their
        new tokens; attention reads each sequence's own slots (sequences adding one token
        together, the rest one by one). Logits of batch.logit_rows, [R, vocab], on the
        CPU (where sampling happens); index tensors may be on the CPU too."""
        c = self.config
        dev = self.device
        tokens, positions = batch.tokens.to(dev), batch.positions.to(dev)
        new_slots = batch.new_slots.to(dev)
        n_new = tokens.shape[0]
        x = self.w.embedding[tokens]
        write = new_slots >= 0
        if not bool(write.all()):
            new_slots = new_slots[write]
        plan = _AttentionPlan(batch, dev)
        cos, sin = self.rope.tables(positions)
        steps, layers = self.steps, self.w.layers
        q, k, v = steps.attention_inputs(x, layers[0].attn_norm, layers[0].wqkv, layers[0].bqkv,
                                         self.rope, cos, sin, c, kv.k.dtype)
        for i, layer in enumerate(layers):
            if new_slots.shape[0] != n_new:
                k, v = k[write], v[write]
            kv.k[i].index_copy_(0, new_slots, k)
            kv.v[i].index_copy_(0, new_slots, v)
            attn = plan.run(self, q, kv.k[i], kv.v[i])
            if i + 1 < len(layers):  # this layer's feed-forward and the next one's q, k, v
                nxt = layers[i + 1]
                x, q, k, v = steps.between_layers(
                    x, attn, layer.wo, layer.ffn_norm, layer.w_gate_up, layer.w_down,
                    nxt.attn_norm, nxt.wqkv, nxt.bqkv, self.rope, cos, sin, c, kv.k.dtype)
            else:
                x = steps.rest_of_layer(x, attn, layer.wo, layer.ffn_norm, layer.w_gate_up,
                                        layer.w_down, c)
        x = F.rms_norm(x[batch.logit_rows.to(dev)], (c.dim,), self.w.output_norm, c.norm_eps)
        return self.w.output(x).float().cpu()


@dataclass
class Batch:
    """The new tokens of several sequences, concatenated in sequence order. seqs: per sequence, (how
    many new tokens are its, every slot of its context in position order, new ones included, the
    first position attended row-wise). logit_rows: which new tokens' logits to return (the last of
    each sequence that samples next; all of them to verify drafts)."""

    tokens: torch.Tensor  # [N]
    positions: torch.Tensor  # [N]
    new_slots: torch.Tensor  # [N]; -1 where the K/V is already in a shared block
    seqs: list[tuple[int, torch.Tensor, int]]
    logit_rows: torch.Tensor  # [R]


class _AttentionPlan:
    """Index tensors built once per forward pass and reused by every layer. Shapes never depend
    on who shares the step, so a token computes the same bits alone, batched or verified:
    generated tokens are single queries padded by context length to PAD_TO, prompt tokens
    run one CAUSAL_BLOCK at a time."""

    PAD_TO = 64
    ROW_WISE = 16
    CAUSAL_BLOCK = 16  # the block manager's block size: prompts are cut on its boundaries

    def __init__(self, batch: Batch, dev: torch.device) -> None:
        buckets: dict[int, list[tuple[int, torch.Tensor]]] = {}
        self.multi = []  # (rows, context slots, causal mask) per longer sequence
        offset = 0
        for n, slots, row_wise_from in batch.seqs:
            start = int(batch.positions[offset])
            n_causal = min(n, max(0, row_wise_from - start))
            p, end = start, start + n_causal
            while p < end:  # one causal block at a time: shapes fixed by position
                block_end = min((p // self.CAUSAL_BLOCK + 1) * self.CAUSAL_BLOCK, end)
                rows = slice(offset + p - start, offset + block_end - start)
                mask = torch.arange(block_end)[None, :] <= batch.positions[rows, None]
                self.multi.append((rows, slots[:block_end].to(dev), mask.to(dev)))
                p = block_end
            for row in range(offset + n_causal, offset + n):
                length = int(batch.positions[row]) + 1
                bucket = -(-length // self.PAD_TO) * self.PAD_TO
                buckets.setdefault(bucket, []).append((row, slots[:length]))
            offset += n
        self.singles = []  # (rows, padded context slots, valid) per padded length
        for length, members in sorted(buckets.items()):
            padded = torch.zeros(len(members), length, dtype=torch.long)
            valid = torch.zeros(len(members), length, dtype=torch.bool)
            for i, (_, slots) in enumerate(members):
                padded[i, :slots.shape[0]] = slots
                valid[i, :slots.shape[0]] = True
            rows = torch.tensor([row for row, _ in members], device=dev)
            self.singles.append((rows, padded.to(dev), valid.to(dev)))
        self.n_tokens = offset
        self.one_batch = not self.multi and len(self.singles) == 1  # rows already in order

    def run(self, model: LlamaModel, q: torch.Tensor, k_cache: torch.Tensor,
            v_cache: torch.Tensor) -> torch.Tensor:
        if self.one_batch:  # every row a single query, already in order
            _, padded, valid = self.singles[0]
            return model.steps.decode_attention(q, k_cache, v_cache, padded, valid, model.config)
        outs = []
        for rows, padded, valid in self.singles:
            outs.append((rows, model.steps.decode_attention(q[rows], k_cache, v_cache, padded,
                                                            valid, model.config)))
        out = q.new_empty(self.n_tokens, q.shape[1] * q.shape[2])
        for rows, single_out in outs:
            out[rows] = single_out
        for rows, slots, mask in self.multi:
            keys = k_cache.index_select(0, slots).to(q.dtype)
            values = v_cache.index_select(0, slots).to(q.dtype)
            out[rows] = model._attention(q[rows], keys, values, mask)
        return out
