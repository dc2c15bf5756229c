"""Llama-family forward pass over a paged KV store: one preallocated [layers, slots, kv_heads,
head_dim] pair (slot = block · block_size + offset), each sequence attended in its block
table's order, so no sequence needs contiguous memory."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from localchat.engine.executors.torch.layer_steps import LayerSteps, compiles_by_default, rounded_as
from localchat.engine.executors.torch.rope import RotaryEmbedding
from localchat.engine.executors.torch.weights import LlamaConfig, ModelWeights


class KVStore:
    """Preallocated keys and values for every slot of every block, plus one scratch slot
    (`scratch`) where rows whose K/V is already stored write theirs unread."""

    def __init__(self, config: LlamaConfig, n_slots: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu"):
        self.scratch = n_slots
        shape = (config.n_layers, n_slots + 1, config.n_kv_heads, config.head_dim)
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
                 compiled: bool | None = None, ahead_of_time: bool | None = None) -> None:
        """compiled: generated tokens' layers compiled (None: where layer_steps says so);
        ahead_of_time: their AOTInductor artifact (None: where compiled; True: also for an
        otherwise eager model, a draft: no Dynamo guards, so no cost to the target's graphs)."""
        self.w = weights
        self.config = weights.config
        c = self.config
        self.rope = RotaryEmbedding(c.head_dim, c.rope_base, max_positions, neox=c.rope_neox,
                                    position_scale=c.rope_position_scale,
                                    freq_factors=weights.rope_freqs)
        self.device = weights.embedding.device
        self.rope.to(self.device)
        self.steps = LayerSteps(compiles_by_default(self.device) if compiled is None else compiled)
        self.ahead_of_time = self.steps.compiled if ahead_of_time is None else (
            ahead_of_time and compiles_by_default(self.device))
        self.aot = None  # (the KV dtype it serves, its call per layer, weights per layer)

    def _attention(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                   mask: torch.Tensor | None) -> torch.Tensor:
        """Grouped-query attention without expanding K/V: the query heads that share a
        KV head are stacked into one matrix. q: [T, H, D]; keys/values: [L, KV, D] in the
        cache's dtype (q and the softmax weights are rounded to it, as in decode_attention)."""
        c = self.config
        n_new, group = q.shape[0], c.n_heads // c.n_kv_heads
        cache_dtype = keys.dtype
        q, keys, values = rounded_as(q, cache_dtype), keys.to(q.dtype), values.to(q.dtype)
        # [KV, group·T, D]: rows ordered (head-in-group, token)
        qg = q.reshape(n_new, c.n_kv_heads, group, c.head_dim).permute(1, 2, 0, 3)
        qg = qg.reshape(c.n_kv_heads, group * n_new, c.head_dim)
        scores = torch.bmm(qg, keys.permute(1, 2, 0)) * (c.head_dim ** -0.5)  # [KV, g·T, L]
        if mask is not None:
            scores = scores.masked_fill(~mask.repeat(group, 1), float("-inf"))
        out = torch.bmm(rounded_as(scores.softmax(-1), cache_dtype), values.transpose(0, 1))
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
        """Compile now what replies would otherwise wait for: on a CPU the generated tokens'
        layer artifact (aot_layer.py); where that fails, torch.compile's graphs for one and two
        generated tokens at contexts of one and two PAD_TO buckets, after prompts of 17, 50
        and 1 tokens. Writes slots 0-73, which nothing reads before writing them again."""
        if min(kv.scratch, self.rope.cos.shape[0]) < 74:
            return
        if self.device.type == "cpu" and self.ahead_of_time:
            self._load_aot(kv)
        if not self.steps.compiled or self.aot:
            return  # eager, or ahead of time: nothing left to compile (the passes below
            # would only compute: 74 tokens, 0.2 s on the bundled model, 1 s at 1B)
        slots = torch.arange(74)
        for start, end, n_prompt in ((0, 17, 17), (17, 18, 0), (18, 20, 0), (20, 70, 70),
                                     (70, 71, 0), (71, 73, 0), (73, 74, 74)):
            n = end - start
            self.forward_batch(Batch(torch.zeros(n, dtype=torch.long), slots[start:end],
                                     slots[start:end], [(n, slots[:end], n_prompt)],
                                     torch.tensor([n - 1])), kv)

    def _load_aot(self, kv: KVStore) -> None:
        """Generated tokens' layers as AOTInductor artifacts for KV stores like `kv`; if one
        cannot be built here, they stay on torch.compile."""
        from localchat.engine.executors.torch import aot_layer

        try:
            calls: dict[str, object] = {}
            per_layer = []
            for layer in self.w.layers:
                key = aot_layer.signature(layer)
                if key not in calls:
                    calls[key] = aot_layer.load_decode_layer(layer, self.rope, self.config, kv)
                per_layer.append(calls[key])
        except Exception as exc:  # noqa: BLE001 -- any failure leaves the compiled pieces
            logging.getLogger("localchat.engine").warning(
                "generated tokens' layers not compiled ahead of time (%s); using %s", exc,
                "torch.compile" if self.steps.compiled else "eager steps")
            return
        self.aot = (kv.k.dtype, per_layer,
                    [aot_layer.layer_tensors(layer) for layer in self.w.layers])

    def describe(self) -> dict[str, str]:
        """For ModelInfo.kernels: how the layer pieces run."""
        return {"generated-token layers": "aotinductor" if self.aot else
                ("inductor" if self.steps.compiled else "eager")}

    @torch.inference_mode()
    def forward_batch(self, batch: "Batch", kv: KVStore) -> torch.Tensor:
        """Several sequences of different lengths in one pass: generated tokens (single
        queries) run each layer together in one call, prompt tokens together around their
        causal attention. Logits of batch.logit_rows, [R, vocab], on the CPU (where sampling
        happens); index tensors may be on the CPU too."""
        c, dev = self.config, self.device
        plan = _AttentionPlan(batch, kv.scratch, dev)
        x = self.w.embedding[batch.tokens.to(dev)]
        cos, sin = self.rope.tables(batch.positions.to(dev))
        single, prompt = plan.single, plan.prompt
        xs, xp = (None if g is None else (x if g.everything else x[g.rows]) for g in (single, prompt))
        cs, cp = ((cos, sin) if g is None or g.everything else (cos[g.rows], sin[g.rows])
                  for g in (single, prompt))
        aot = self.aot if self.aot is not None and self.aot[0] == kv.k.dtype else None
        for i, layer in enumerate(self.w.layers):
            if prompt is not None:  # first: a generated token may attend to this layer's prompt
                xp = self._prompt_layer(xp, prompt, layer, kv.k[i], kv.v[i], *cp)
            if single is not None and aot is not None:
                xs = aot[1][i](xs, single.new_slots, kv.k[i], kv.v[i], single.padded,
                               single.valid, *cs, aot[2][i])
            elif single is not None:
                xs = self.steps.decode_layer(
                    xs, single.new_slots, kv.k[i], kv.v[i], single.padded, single.valid,
                    layer.attn_norm, layer.wqkv, layer.bqkv, layer.wo, layer.ffn_norm,
                    layer.w_gate_up, layer.w_down, self.rope, *cs, c, kv.k.dtype)
        if prompt is None or single is None:
            x = xs if prompt is None else xp
        else:
            x = x.new_empty(x.shape)
            x[single.rows], x[prompt.rows] = xs, xp
        x = F.rms_norm(x[batch.logit_rows.to(dev)], (c.dim,), self.w.output_norm, c.norm_eps)
        return self.w.output(x).float().cpu()

    def _prompt_layer(self, x: torch.Tensor, prompt: "_PromptRows", layer, k_cache: torch.Tensor,
                      v_cache: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """One layer for prompt rows: each causal block attends to its sequence's slots."""
        c, steps = self.config, self.steps
        q, k, v = steps.attention_inputs(x, layer.attn_norm, layer.wqkv, layer.bqkv, self.rope,
                                         cos, sin, c, k_cache.dtype)
        k_cache.index_copy_(0, prompt.new_slots, k)
        v_cache.index_copy_(0, prompt.new_slots, v)
        attn = q.new_empty(x.shape[0], c.n_heads * c.head_dim)
        for rows, slots, mask in prompt.blocks:
            attn[rows] = self._attention(q[rows], k_cache.index_select(0, slots),
                                         v_cache.index_select(0, slots), mask)
        return steps.rest_of_layer(x, attn, layer.wo, layer.ffn_norm, layer.w_gate_up,
                                   layer.w_down, c)


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


@dataclass
class _SingleRows:
    """Generated tokens: single queries, each over its context slots padded to one length."""

    rows: torch.Tensor  # their indices among the batch's rows
    everything: bool  # they are every row, in order
    new_slots: torch.Tensor  # [S]; the scratch slot where the K/V is already stored
    padded: torch.Tensor  # [S, L] context slots
    valid: torch.Tensor  # [S, L]


@dataclass
class _PromptRows:
    """Prompt tokens: one CAUSAL_BLOCK of a sequence at a time, over its slots so far."""

    rows: torch.Tensor
    everything: bool
    new_slots: torch.Tensor
    blocks: list[tuple[slice, torch.Tensor, torch.Tensor]]  # (rows among these, slots, mask)


class _AttentionPlan:
    """The batch's rows split into generated and prompt tokens, with the index tensors every
    layer reuses. Shapes never depend on who shares the step (attention's bits do not depend
    on padding), so a token computes the same bits alone, batched or verified."""

    PAD_TO = 64  # context lengths are padded to a multiple: fewer shapes
    ROW_WISE = 16
    CAUSAL_BLOCK = 16  # the block manager's block size: prompts are cut on its boundaries

    def __init__(self, batch: Batch, scratch: int, dev: torch.device) -> None:
        new_slots = torch.where(batch.new_slots >= 0, batch.new_slots, scratch)
        single_rows, contexts, prompt_rows, blocks = [], [], [], []
        offset = 0
        for n, slots, row_wise_from in batch.seqs:
            start = int(batch.positions[offset])
            n_causal = min(n, max(0, row_wise_from - start))
            p, end = start, start + n_causal
            while p < end:  # one causal block at a time: shapes fixed by position
                block_end = min((p // self.CAUSAL_BLOCK + 1) * self.CAUSAL_BLOCK, end)
                first = len(prompt_rows)
                prompt_rows += range(offset + p - start, offset + block_end - start)
                mask = torch.arange(block_end)[None, :] <= batch.positions[
                    offset + p - start:offset + block_end - start, None]
                blocks.append((slice(first, len(prompt_rows)), slots[:block_end].to(dev),
                               mask.to(dev)))
                p = block_end
            for row in range(offset + n_causal, offset + n):
                single_rows.append(row)
                contexts.append(slots[:int(batch.positions[row]) + 1])
            offset += n
        self.single = self.prompt = None
        if single_rows:
            length = -(-max(len(s) for s in contexts) // self.PAD_TO) * self.PAD_TO
            padded = torch.zeros(len(contexts), length, dtype=torch.long)
            valid = torch.zeros(len(contexts), length, dtype=torch.bool)
            for i, slots in enumerate(contexts):
                padded[i, :slots.shape[0]] = slots
                valid[i, :slots.shape[0]] = True
            rows = torch.tensor(single_rows)
            self.single = _SingleRows(rows.to(dev), len(single_rows) == offset,
                                      new_slots[rows].to(dev), padded.to(dev), valid.to(dev))
        if prompt_rows:
            rows = torch.tensor(prompt_rows)
            self.prompt = _PromptRows(rows.to(dev), len(prompt_rows) == offset,
                                      new_slots[rows].to(dev), blocks)
