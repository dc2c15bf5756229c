"""GGUF tensors -> the torch engine's config and layers, each matrix on the kernel kernels.py
chose for it; the token embedding keeps the file's rows and dequantizes those looked up."""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

from localchat.engine.engine_rule import TORCH_ARCHITECTURES
from localchat.engine.executors.torch.kernels import KernelChooser, SourceMatrix
from localchat.engine.executors.torch.qlinear import RowStack
from localchat.errors import EngineError
from localchat.formats.gguf_blocks import dequantize_tensor, kernel_forms
from localchat.models.gguf_checks import check_layer_shapes, check_model_metadata
from localchat.models.gguf_reader import read_gguf

SUPPORTED_ARCHITECTURES = TORCH_ARCHITECTURES
FLOAT_TYPES = (Q.F32, Q.F16, Q.BF16)


class QuantizedEmbedding:
    """Token rows as the file stores them (e.g. Q8_0), dequantized when looked up: exactly
    llama.cpp's rows. `raw` may be a view of the mapped file: then only rows looked up are
    paged in (llama.cpp's mmap), and nbytes counts nothing held."""

    def __init__(self, raw: np.ndarray, ggml_type: int, n_rows: int,
                 device: torch.device = torch.device("cpu")) -> None:
        self.raw = raw.reshape(n_rows, -1)
        self.ggml_type = ggml_type
        self.device = device
        self.mapped = raw.base is not None and not raw.flags.writeable

    def __getitem__(self, tokens: torch.Tensor) -> torch.Tensor:
        rows = dequantize(self.raw[tokens.cpu().numpy()], self.ggml_type).astype(np.float32)
        return torch.from_numpy(rows).to(self.device)

    def to(self, device: torch.device) -> "QuantizedEmbedding":
        return QuantizedEmbedding(self.raw, self.ggml_type, self.raw.shape[0], device)

    @property
    def nbytes(self) -> int:
        return 0 if self.mapped else self.raw.nbytes


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
                f"{arch!r}: use the llama.cpp engine")
        scaling = meta.get(f"{arch}.rope.scaling.type", "none")
        if scaling not in ("none", "linear"):  # llama3's factors come as a tensor instead
            raise EngineError(f"the torch engine does not run {scaling!r} RoPE scaling yet: "
                              "use the llama.cpp engine")
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
    embedding: torch.Tensor | QuantizedEmbedding  # [vocab, dim], looked up by token
    layers: list[LayerWeights]
    output_norm: torch.Tensor
    output: torch.nn.Module  # tied to the embedding when the file has no output.weight
    rope_freqs: torch.Tensor | None = None  # Llama 3.1's per-frequency RoPE divisors

    def to(self, device: torch.device) -> "ModelWeights":
        """Move float and NF4 layers (an HF directory loads on the CPU first); int4 and
        q4q8 layers are packed for their device at load and cannot move."""
        from localchat.engine.executors.torch.device import move_module
        from localchat.engine.executors.torch.q4q8 import BlockLinear
        from localchat.engine.executors.torch.qlinear import Int4Linear

        if device == self.embedding.device:
            return self

        def move(value):
            if isinstance(value, (Int4Linear, BlockLinear)):
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
        """Bytes of every distinct tensor held in memory (a tied output once; an embedding
        mapped from the file not at all)."""
        seen: dict[int, int] = {}

        def add(obj) -> None:
            if isinstance(obj, QuantizedEmbedding):
                seen[id(obj)] = obj.nbytes
            elif isinstance(obj, torch.Tensor):
                seen[obj.data_ptr()] = obj.numel() * obj.element_size()
            elif isinstance(obj, torch.nn.Module):
                for module in obj.modules():  # tensors held as plain attributes too
                    for t in list(module.parameters(recurse=False)) + list(
                            module.buffers(recurse=False)) + [
                            v for v in vars(module).values() if isinstance(v, torch.Tensor)]:
                        add(t)

        add(self.embedding)
        add(self.output_norm)
        add(self.output)
        for layer in self.layers:
            for value in vars(layer).values():
                if value is not None:
                    add(value)
        return sum(seen.values())


def load_weights(path: Path, device: torch.device = torch.device("cpu"),
                 chooser: KernelChooser | None = None) -> ModelWeights:
    """The model in `path` with each matrix on the kernel `chooser` picks (a fresh one,
    measuring without a cache, when None)."""
    gguf_file = read_gguf(path)  # the validating reader every model path goes through
    check_model_metadata(gguf_file)
    if gguf_file.metadata["general.architecture"] in SUPPORTED_ARCHITECTURES:
        check_layer_shapes(gguf_file)  # as llama.cpp's loader does; others are refused next
    config = LlamaConfig.from_metadata(gguf_file.metadata)
    tensors = gguf_file.tensors
    chooser = chooser or KernelChooser(device)

    def dense(name: str) -> torch.Tensor:
        return dequantized(name).to(device)

    def dequantized(name: str) -> torch.Tensor:
        return dequantize_tensor(gguf_file.tensor_data(name), tensors[name].ggml_type,
                                 tensors[name].shape)

    def dequantized_rows(infos: list, rows: list[int]) -> torch.Tensor:
        """float32 rows of matrices stacked by rows, dequantizing only those rows' blocks."""
        out, first = [], 0
        for t in infos:
            n = int(t.shape[1])
            mine = [r - first for r in rows if first <= r < first + n]
            if mine:
                raw = gguf_file.tensor_data(t.name).reshape(n, -1)[mine]
                out.append(dequantize_tensor(raw, t.ggml_type, (t.shape[0], len(mine))))
            first += n
        return torch.cat(out)

    def source(names: tuple[str, ...]) -> SourceMatrix:
        """Matrices stacked by rows (fused q/k/v, gate/up) as the kernel chooser sees them."""
        infos = [tensors[n] for n in names]
        types = {t.ggml_type for t in infos}
        kind = Q(next(iter(types))).name if len(types) == 1 else "mixed"
        file_bytes = sum(gguf_file.tensor_data(n).nbytes for n in names)
        forms = kernel_forms([(t.ggml_type, gguf_file.tensor_data(t.name), int(t.shape[1]),
                               int(t.shape[0])) for t in infos])
        shape = (sum(int(t.shape[1]) for t in infos), int(infos[0].shape[0]))
        return SourceMatrix(lambda: torch.cat([dequantized(n) for n in names]), kind,
                            file_bytes, 8 * file_bytes / (shape[0] * shape[1]), shape=shape,
                            reference_rows=functools.partial(dequantized_rows, infos), **forms)

    def linear(label: str, *names: str) -> torch.nn.Module:
        """One layer for matrices fused by rows; split into one per matrix when their types
        have no exact kernel together (a Q4_K_M file's Q4_K q/k with a Q6_K v)."""
        m = source(names)
        if m.kind == "mixed" and not m.has_exact_form:
            runs = itertools.groupby(names, key=lambda name: tensors[name].ggml_type)
            return RowStack([linear("+".join(n.split(".")[-2] for n in run), *run)
                             for run in (list(r) for _, r in runs)])
        return chooser.build(m, label)

    def biases(*names: str) -> torch.Tensor | None:
        return torch.cat([dense(n) for n in names]) if all(n in tensors for n in names) else None

    try:
        embd = tensors["token_embd.weight"]
        embedding = dense(embd.name) if embd.ggml_type == Q.F32 else QuantizedEmbedding(
            gguf_file.tensor_data(embd.name), embd.ggml_type, embd.shape[1], device)
        layers = [
            LayerWeights(
                attn_norm=dense(f"blk.{i}.attn_norm.weight"),
                wqkv=linear("attn_qkv", *(f"blk.{i}.attn_{x}.weight" for x in "qkv")),
                bqkv=biases(*(f"blk.{i}.attn_{x}.bias" for x in "qkv")),
                wo=linear("attn_output", f"blk.{i}.attn_output.weight"),
                ffn_norm=dense(f"blk.{i}.ffn_norm.weight"),
                w_gate_up=linear("ffn_gate_up", f"blk.{i}.ffn_gate.weight",
                                 f"blk.{i}.ffn_up.weight"),
                w_down=linear("ffn_down", f"blk.{i}.ffn_down.weight"),
            )
            for i in range(config.n_layers)
        ]
        head = "output.weight" if "output.weight" in tensors else "token_embd.weight"
        output = linear("output" if head == "output.weight" else "output (tied)", head)
        rope_freqs = dense("rope_freqs.weight") if "rope_freqs.weight" in tensors else None
        return ModelWeights(config, embedding, layers, dense("output_norm.weight"), output,
                            rope_freqs)
    except KeyError as exc:
        raise EngineError(f"{path.name} lacks tensor {exc}; use the llama.cpp engine") from None
    finally:
        gguf_file.close()  # tensors were copied, packed or dequantized; the embedding's view
        # keeps the file mapped while the model lives
