"""Small random Llama-family GGUF models, written on the fly with the bundled model's
real vocabulary, so both engines can load them and be compared number for number.

With float32 weights there is no quantization on either side, so the torch engine's
forward pass (RoPE variants, GQA, biases, norms) must match llama.cpp's closely; a
wrong rotation or a transposed matrix shows up as a large logit difference.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from localchat.models.gguf_reader import read_gguf
from localchat.models.specs import resolve_model

DIM, HEADS, KV_HEADS, FFN, LAYERS = 128, 4, 2, 256, 2
HEAD_DIM = DIM // HEADS


def _vocabulary() -> dict:
    bundled = read_gguf(resolve_model("default"))
    try:
        return {k: v for k, v in bundled.metadata.items() if k.startswith("tokenizer.")}
    finally:
        bundled.close()


def write_random_model(path: Path, *, arch: str = "llama", seed: int = 0,
                       rope_freqs: np.ndarray | None = None, linear_rope_factor: float | None = None,
                       ggml_type: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32,
                       context_length: int = 4096, renamed_token: int | None = None,
                       token_texts: dict[int, str] | None = None,
                       chat_template: bool = True, dim: int = DIM, ffn: int = FFN,
                       layers: int = LAYERS, heads: int = HEADS, kv_heads: int = KV_HEADS,
                       declared: dict[str, object] | None = None) -> Path:
    """A model with random weights (2 layers of width 128 unless told); `ggml_type` for the
    2-D projections;
    `renamed_token`: give that token another text (a vocabulary that differs);
    `token_texts`: replace these tokens' texts; chat_template False: the file has none;
    `declared`: metadata that lies about the tensors, by writer field (block_count,
    embedding_length, feed_forward_length, head_count_kv, layer_norm_rms_eps, tokenizer_model)."""
    said = declared or {}
    rng = np.random.default_rng(seed)
    vocab = _vocabulary()
    if renamed_token is not None:
        tokens = list(vocab["tokenizer.ggml.tokens"])
        tokens[renamed_token] = tokens[renamed_token] + "-renamed"
        vocab["tokenizer.ggml.tokens"] = tokens
    if token_texts:
        vocab["tokenizer.ggml.tokens"] = [token_texts.get(i, t) for i, t in
                                          enumerate(vocab["tokenizer.ggml.tokens"])]
    n_vocab = len(vocab["tokenizer.ggml.tokens"])
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"random-{arch}")
    head_dim = dim // heads
    writer.add_block_count(said.get("block_count", layers))  # type: ignore[arg-type]
    writer.add_context_length(context_length)
    writer.add_embedding_length(said.get("embedding_length", dim))  # type: ignore[arg-type]
    writer.add_feed_forward_length(said.get("feed_forward_length", ffn))  # type: ignore[arg-type]
    writer.add_head_count(heads)
    writer.add_head_count_kv(said.get("head_count_kv", kv_heads))  # type: ignore[arg-type]
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(said.get("layer_norm_rms_eps", 1e-5))  # type: ignore[arg-type]
    if linear_rope_factor is not None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(linear_rope_factor)
    writer.add_tokenizer_model(said.get("tokenizer_model", vocab["tokenizer.ggml.model"]))  # type: ignore[arg-type]
    writer.add_tokenizer_pre(vocab["tokenizer.ggml.pre"])
    writer.add_token_list(vocab["tokenizer.ggml.tokens"])
    writer.add_token_types([int(t) for t in vocab["tokenizer.ggml.token_type"]])
    writer.add_token_merges(vocab["tokenizer.ggml.merges"])
    writer.add_bos_token_id(vocab["tokenizer.ggml.bos_token_id"])
    writer.add_eos_token_id(vocab["tokenizer.ggml.eos_token_id"])
    writer.add_add_bos_token(False)
    if chat_template:
        writer.add_chat_template(vocab["tokenizer.chat_template"])

    def matrix(rows: int, cols: int, scale: float) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

    def add_matrix(name: str, w: np.ndarray) -> None:
        if ggml_type == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, w)
        else:
            writer.add_tensor(name, gguf.quants.quantize(w, ggml_type), raw_dtype=ggml_type)

    writer.add_tensor("token_embd.weight", matrix(n_vocab, dim, 1.0))
    for i in range(layers):
        p = f"blk.{i}."
        writer.add_tensor(p + "attn_norm.weight", (1 + 0.1 * rng.standard_normal(dim)).astype(np.float32))
        add_matrix(p + "attn_q.weight", matrix(dim, dim, dim ** -0.5))
        add_matrix(p + "attn_k.weight", matrix(kv_heads * head_dim, dim, dim ** -0.5))
        add_matrix(p + "attn_v.weight", matrix(kv_heads * head_dim, dim, dim ** -0.5))
        if arch == "qwen2":
            for x, n in (("q", dim), ("k", kv_heads * head_dim), ("v", kv_heads * head_dim)):
                writer.add_tensor(p + f"attn_{x}.bias", (0.5 * rng.standard_normal(n)).astype(np.float32))
        add_matrix(p + "attn_output.weight", matrix(dim, dim, dim ** -0.5))
        writer.add_tensor(p + "ffn_norm.weight", (1 + 0.1 * rng.standard_normal(dim)).astype(np.float32))
        add_matrix(p + "ffn_gate.weight", matrix(ffn, dim, dim ** -0.5))
        add_matrix(p + "ffn_up.weight", matrix(ffn, dim, dim ** -0.5))
        add_matrix(p + "ffn_down.weight", matrix(dim, ffn, ffn ** -0.5))
    writer.add_tensor("output_norm.weight", np.ones(dim, dtype=np.float32))
    if rope_freqs is not None:
        writer.add_tensor("rope_freqs.weight", rope_freqs.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
