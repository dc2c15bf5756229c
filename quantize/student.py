"""A draft model cut from its target (embedding, output head, a few layers) as a trainable float32
torch module, written back as a normal GGUF. Embedding and head stay frozen; the kept layers and
the final norm train."""

from __future__ import annotations

import time
from pathlib import Path

import gguf
import numpy as np
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as Q
from gguf.quants import quantize

from localchat.engine.executors.torch.rope import RotaryEmbedding
from localchat.engine.executors.torch.weights import LlamaConfig
from localchat.errors import UsageError
from localchat.models.gguf_reader import read_gguf
from quantize.fake_quant import fake_quant
from quantize.gguf_copy import add_copied_tensor, copy_metadata, float32

LAYER_TENSORS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                 "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")
MATRIX_TYPE = Q.Q8_0  # the draft's layer matrices in the written file
FILE_TYPES = {Q.Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0, Q.Q4_1: gguf.LlamaFileType.MOSTLY_Q4_1,
              Q.Q4_0: gguf.LlamaFileType.MOSTLY_Q4_0}


def default_layers(n_target: int, n_draft: int) -> list[int]:
    """The target's first ⌈n_draft/2⌉ layers and its last ⌊n_draft/2⌋ (at least the last one):
    the middle layers change the residual stream least, so dropping them costs the least
    agreement (measured in docs/benchmarks.md, "Distilled drafts that pay")."""
    if not 1 <= n_draft < n_target:
        raise UsageError(f"--layers must be between 1 and {n_target - 1} (the target has {n_target})")
    tail = max(1, n_draft // 2)
    return list(range(n_draft - tail)) + list(range(n_target - tail, n_target))


class Block(torch.nn.Module):
    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.w = torch.nn.ParameterDict({k: torch.nn.Parameter(v) for k, v in tensors.items()})
        self.matrix_type: Q | None = None  # set: the matrices are seen as written in that type

    def weights(self) -> dict[str, torch.Tensor]:
        if self.matrix_type is None:
            return dict(self.w)
        return {k: fake_quant(v, self.matrix_type) if v.ndim == 2 else v for k, v in self.w.items()}

    def forward(self, x: torch.Tensor, config: LlamaConfig, cos: torch.Tensor, sin: torch.Tensor,
                rope: RotaryEmbedding) -> torch.Tensor:
        b, t, _ = x.shape
        w, c = self.weights(), config
        h = F.rms_norm(x, (c.dim,), w["attn_norm"], c.norm_eps)
        q = (h @ w["attn_q"].T).view(b * t, c.n_heads, c.head_dim)
        k = (h @ w["attn_k"].T).view(b * t, c.n_kv_heads, c.head_dim)
        v = (h @ w["attn_v"].T).view(b, t, c.n_kv_heads, c.head_dim)
        q = rope(q, cos, sin).view(b, t, c.n_heads, c.head_dim).transpose(1, 2)
        k = rope(k, cos, sin).view(b, t, c.n_kv_heads, c.head_dim).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v.transpose(1, 2), is_causal=True, enable_gqa=True)
        x = x + a.transpose(1, 2).reshape(b, t, c.n_heads * c.head_dim) @ w["attn_output"].T
        h = F.rms_norm(x, (c.dim,), w["ffn_norm"], c.norm_eps)
        return x + (F.silu(h @ w["ffn_gate"].T) * (h @ w["ffn_up"].T)) @ w["ffn_down"].T


class Student(torch.nn.Module):
    """forward(tokens [B, T]) -> logits [B, T, vocab], positions 0..T−1."""

    def __init__(self, config: LlamaConfig, embedding: torch.Tensor, head: torch.Tensor | None,
                 output_norm: torch.Tensor, blocks: list[dict[str, torch.Tensor]],
                 source_layers: list[int], max_positions: int = 4096) -> None:
        super().__init__()
        self.config, self.source_layers = config, source_layers
        self.register_buffer("embedding", embedding, persistent=False)
        self.register_buffer("head", head, persistent=False)  # None: tied to the embedding
        self.head_bf16: torch.Tensor | None = None
        self.output_norm = torch.nn.Parameter(output_norm)
        self.blocks = torch.nn.ModuleList(Block(t) for t in blocks)
        self.rope = RotaryEmbedding(config.head_dim, config.rope_base, max_positions,
                                    neox=config.rope_neox, position_scale=config.rope_position_scale)

    def hidden(self, tokens: torch.Tensor) -> torch.Tensor:
        b, t = tokens.shape
        x = self.embedding[tokens]
        cos, sin = self.rope.tables(torch.arange(t).repeat(b))
        for block in self.blocks:
            x = block(x, self.config, cos, sin, self.rope)
        return F.rms_norm(x, (self.config.dim,), self.output_norm, self.config.norm_eps)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        head = self.embedding if self.head is None else self.head
        h = self.hidden(tokens)
        if self.head_bf16 is not None:  # frozen head; bfloat16 only where measured faster
            return (h.to(torch.bfloat16) @ self.head_bf16.T).float()
        return h @ head.T

    def train_as(self, matrix_type: Q | None) -> None:
        """Train the layer matrices as they will be written (quantization-aware), or as
        float32 (None)."""
        for block in self.blocks:
            block.matrix_type = matrix_type

    def use_bf16_head(self) -> bool:
        """Time the head's matmul in float32 and bfloat16 (native on some CPUs, emulated
        on others) and keep bfloat16 if it is clearly faster; returns the choice."""
        head = self.embedding if self.head is None else self.head
        x, w16 = torch.randn(256, self.config.dim), head.to(torch.bfloat16)

        def timed(fn) -> float:
            fn()
            t = time.perf_counter()
            fn()
            return time.perf_counter() - t

        faster = timed(lambda: x.to(torch.bfloat16) @ w16.T) < 0.7 * timed(lambda: x @ head.T)
        self.head_bf16 = w16 if faster else None
        return faster


def _float32(f, name: str) -> torch.Tensor:
    return torch.from_numpy(np.array(float32(f, name)))  # a writable copy


def student_from_target(target: Path, layers: list[int]) -> Student:
    """The target's embedding, head and final norm, and its `layers` in that order."""
    f = read_gguf(target)
    try:
        config = LlamaConfig.from_metadata(f.metadata)
        if any(f"blk.0.attn_{x}.bias" in f.tensors for x in "qkv"):
            raise UsageError("distill supports Llama-architecture targets (no attention biases)")
        blocks = [{k: _float32(f, f"blk.{i}.{k}.weight") for k in LAYER_TENSORS} for i in layers]
        head = _float32(f, "output.weight") if "output.weight" in f.tensors else None
        return Student(config, _float32(f, "token_embd.weight"), head,
                       _float32(f, "output_norm.weight"), blocks, list(layers))
    finally:
        f.close()


def write_student_gguf(student: Student, target: Path, out: Path,
                       matrix_type: Q = MATRIX_TYPE) -> Path:
    """`out` (a temporary name the caller renames): the target's metadata with the draft's
    block count, its embedding/head tensors copied byte for byte, the trained layers as
    matrix_type (Q8_0, Q4_1 or Q4_0) and norms as F32."""
    reader = read_gguf(target)
    arch = student.config.arch
    writer = gguf.GGUFWriter(str(out), arch)
    try:
        target_name = reader.metadata.get("general.name")
        copy_metadata(reader, writer, {
            f"{arch}.block_count": len(student.blocks),
            "general.name": f"{target_name} draft ({len(student.blocks)} layers)",
            "general.file_type": int(FILE_TYPES[matrix_type]),  # the layers are matrix_type
        })
        plan: list[tuple[str, object]] = [(name, add_copied_tensor(reader, name, writer))
                                          for name in reader.tensors if not name.startswith("blk.")]
        for j, block in enumerate(student.blocks):
            for key in LAYER_TENSORS:
                data = block.w[key].detach().float().numpy()
                name = f"blk.{j}.{key}.weight"
                if data.ndim == 1:
                    plan.append((name, np.ascontiguousarray(data)))
                    writer.add_tensor_info(name, data.shape, np.dtype(np.float32), data.nbytes)
                else:
                    packed = quantize(data, matrix_type)
                    plan.append((name, packed))
                    writer.add_tensor_info(name, packed.shape, np.dtype(np.uint8), packed.nbytes,
                                           raw_dtype=matrix_type)
        norm = student.output_norm.detach().float().numpy()
        plan = [(n, norm if n == "output_norm.weight" else d) for n, d in plan]
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for _, data in plan:
            writer.write_tensor_data(data)
    finally:
        writer.close()
        reader.close()
    return out
