"""GGUF tensors -> the torch engine's config and layers.

4-bit blocks stay quantized (qlinear.Int4Linear); norms stay float32; anything else is
dequantized with gguf-py's reference dequantizers (the correct-but-slower path).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

from localchat.engine.executors.torch.qlinear import DenseLinear, head_linear, int4_linear, q4_parts
from localchat.gguf_checks import check_model_metadata
from localchat.gguf_reader import read_gguf
from localchat.errors import EngineError

SUPPORTED_ARCHITECTURES = ("llama", "qwen2")


@dataclass(frozen=True)
class LlamaConfig:
    arch: str
    n_layers: int
    dim: int
    ffn_dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    context_length: int
    rope_base: float
    norm_eps: float
    rope_neox: bool  # qwen2 rotates halves; llama's GGUF Q/K rows are permuted for pairs
    rope_position_scale: float = 1.0  # linear RoPE scaling: positions × 1/factor

    @classmethod
    def from_metadata(cls, meta: dict) -> "LlamaConfig":
        arch = meta["general.architecture"]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise EngineError(
                f"the torch engine runs {', '.join(SUPPORTED_ARCHITECTURES)} models, not "
                f"{arch!r}: use --engine llama.cpp")
        scaling = meta.get(f"{arch}.rope.scaling.type", "none")
        if scaling not in ("none", "linear"):  # llama3's factors come as a tensor instead
            raise EngineError(f"the torch engine does not run {scaling!r} RoPE scaling yet: "
                              "use --engine llama.cpp")
        factor = float(meta.get(f"{arch}.rope.scaling.factor", 1.0)) if scaling == "linear" else 1.0
        n_heads = int(meta[f"{arch}.attention.head_count"])
        dim = int(meta[f"{arch}.embedding_length"])
        return cls(
            arch=arch,
            n_layers=int(meta[f"{arch}.block_count"]),
            dim=dim,
            ffn_dim=int(meta[f"{arch}.feed_forward_length"]),
            n_heads=n_heads,
            n_kv_heads=int(meta.get(f"{arch}.attention.head_count_kv", n_heads)),
            head_dim=int(meta.get(f"{arch}.attention.key_length", dim // n_heads)),
            vocab_size=len(meta["tokenizer.ggml.tokens"]),
            context_length=int(meta[f"{arch}.context_length"]),
            rope_base=float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
            norm_eps=float(meta[f"{arch}.attention.layer_norm_rms_epsilon"]),
            rope_neox=arch == "qwen2",
            rope_position_scale=1.0 / factor if factor > 0 else 1.0,
        )


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor
    wqkv: torch.nn.Module  # q, k, v stacked by rows: one matmul instead of three
    bqkv: torch.Tensor | None  # qwen2's biases, stacked the same way
    wo: torch.nn.Module
    ffn_norm: torch.Tensor
    w_gate_up: torch.nn.Module  # gate and up stacked by rows
    w_down: torch.nn.Module


@dataclass
class ModelWeights:
    config: LlamaConfig
    embedding: torch.Tensor  # [vocab, dim] float32 (looked up, never multiplied whole)
    layers: list[LayerWeights]
    output_norm: torch.Tensor
    output: torch.nn.Module  # tied to the embedding when the file has no output.weight
    rope_freqs: torch.Tensor | None = None  # Llama 3.1's per-frequency RoPE divisors

    def to(self, device: torch.device) -> "ModelWeights":
        """Move float and NF4 layers (an HF directory loads on the CPU first); int4 layers
        are packed for their device at load and cannot move."""
        from localchat.engine.executors.torch.device import move_module
        from localchat.engine.executors.torch.qlinear import Int4Linear

        if device == self.embedding.device:
            return self

        def move(value):
            if isinstance(value, Int4Linear):
                raise EngineError("int4 layers are packed for one device; load on the target device")
            if isinstance(value, torch.nn.Module):
                return move_module(value, device)
            return value.to(device) if isinstance(value, torch.Tensor) else value

        for layer in self.layers:
            for name, value in vars(layer).items():
                setattr(layer, name, move(value))
        tied = self.output is not None and getattr(self.output, "weight", None) is self.embedding
        self.embedding = self.embedding.to(device)
        self.output = move(self.output)
        if tied:
            self.output.weight = self.embedding
        self.output_norm = self.output_norm.to(device)
        self.rope_freqs = None if self.rope_freqs is None else self.rope_freqs.to(device)
        return self

    def nbytes(self) -> int:
        """Bytes of every distinct tensor held (a tied output is counted once)."""
        seen: dict[int, int] = {}

        def add(obj) -> None:
            if isinstance(obj, torch.Tensor):
                seen[obj.data_ptr()] = obj.numel() * obj.element_size()
            elif isinstance(obj, torch.nn.Module):
                for t in list(obj.parameters()) + list(obj.buffers()) + [
                        v for v in vars(obj).values() if isinstance(v, torch.Tensor)]:
                    add(t)

        add(self.embedding)
        add(self.output_norm)
        add(self.output)
        for layer in self.layers:
            for value in vars(layer).values():
                if value is not None:
                    add(value)
        return sum(seen.values())


def load_weights(path: Path, device: torch.device = torch.device("cpu")) -> ModelWeights:
    gguf_file = read_gguf(path)  # the validating reader every model path goes through
    check_model_metadata(gguf_file)
    config = LlamaConfig.from_metadata(gguf_file.metadata)
    tensors = gguf_file.tensors

    def dense(name: str) -> torch.Tensor:
        t, raw = tensors[name], gguf_file.tensor_data(name)
        shape = tuple(reversed(t.shape))  # ggml lists the fastest dimension first
        if t.ggml_type == Q.F32:
            arr = np.frombuffer(raw, dtype=np.float32).copy()
        else:
            arr = dequantize(raw.reshape(shape[:-1] + (-1,)), t.ggml_type).astype(np.float32)
        return torch.from_numpy(arr.reshape(shape)).to(device)

    def linear(*names: str, dense_layer=DenseLinear) -> torch.nn.Module:
        """One layer for matrices stacked by rows; 4-bit when they all are."""
        infos = [tensors[n] for n in names]
        if all(t.ggml_type in (Q.Q4_0, Q.Q4_1) for t in infos):
            return int4_linear([q4_parts(gguf_file.tensor_data(t.name), t.ggml_type,
                                         t.shape[1], t.shape[0]) for t in infos], device)
        return dense_layer(torch.cat([dense(n) for n in names]))

    def biases(*names: str) -> torch.Tensor | None:
        return torch.cat([dense(n) for n in names]) if all(n in tensors for n in names) else None

    try:
        embedding = dense("token_embd.weight")
        layers = [
            LayerWeights(
                attn_norm=dense(f"blk.{i}.attn_norm.weight"),
                wqkv=linear(*(f"blk.{i}.attn_{x}.weight" for x in "qkv")),
                bqkv=biases(*(f"blk.{i}.attn_{x}.bias" for x in "qkv")),
                wo=linear(f"blk.{i}.attn_output.weight"),
                ffn_norm=dense(f"blk.{i}.ffn_norm.weight"),
                w_gate_up=linear(f"blk.{i}.ffn_gate.weight", f"blk.{i}.ffn_up.weight"),
                w_down=linear(f"blk.{i}.ffn_down.weight"),
            )
            for i in range(config.n_layers)
        ]
        head = "output.weight" if "output.weight" in tensors else "token_embd.weight"
        # a file that keeps its head at 16/32 bits asked for that precision; an 8-bit (or
        # smaller) one loses nothing that matters in bfloat16
        head_layer = DenseLinear if tensors[head].ggml_type in (Q.F32, Q.F16, Q.BF16) \
            else head_linear
        output = linear(head, dense_layer=head_layer) if head == "output.weight" \
            else head_layer(embedding)
        rope_freqs = dense("rope_freqs.weight") if "rope_freqs.weight" in tensors else None
        return ModelWeights(config, embedding, layers, dense("output_norm.weight"), output,
                            rope_freqs)
    except KeyError as exc:
        raise EngineError(f"{path.name} lacks tensor {exc}; use --engine llama.cpp") from None
    finally:
        gguf_file.close()  # every tensor above was copied, packed or dequantized
