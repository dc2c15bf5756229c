"""A Hugging Face Llama/Qwen2 directory (byte-level BPE) -> a float32 GGUF that llama.cpp and
our engine load: the inverse of export_hf.py, with Llama's Q/K rows permuted as
convert_hf_to_gguf.py does."""

from __future__ import annotations


from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors import safe_open

from localchat.engine.executors.torch.hf_weights import hf_llama_config
from localchat.errors import ModelFormatError, UsageError
from localchat.models.hf_files import chat_template, read_json, read_json_if_present, safetensors_files
from quantize.export_hf import _GLOBAL_NAMES, _LAYER_NAMES, rename_tensor
from quantize.hf_tokenizer import CONTROL, PRE_TOKENIZERS, USER_DEFINED
from quantize.progress import Progress

_TO_GGUF_GLOBAL = {v: k for k, v in _GLOBAL_NAMES.items()}
_TO_GGUF_LAYER = {v: k for k, v in _LAYER_NAMES.items()}
NORMAL = 1


def gguf_name(name: str) -> str:
    """model.layers.3.self_attn.q_proj.weight -> blk.3.attn_q.weight."""
    return rename_tensor(name, _TO_GGUF_GLOBAL, _TO_GGUF_LAYER, "model.layers.", "blk.", "GGUF")


def permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """convert_hf_to_gguf's permute(): per head, rows (half, j) -> (pair j, member)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def pre_name(pre_tokenizer: dict | None) -> str:
    """llama.cpp's tokenizer.ggml.pre for the pre-tokenizers hf_tokenizer.py writes."""
    p = pre_tokenizer or {}
    parts = p.get("pretokenizers", []) if p.get("type") == "Sequence" else [p]
    kinds = [q.get("type") for q in parts]
    if kinds == ["ByteLevel"] and parts[0].get("use_regex", True):
        return "gpt-2"
    if kinds == ["Digits", "ByteLevel"] and parts[0].get("individual_digits"):
        return "smollm"
    if kinds == ["Split", "ByteLevel"]:
        regex = (parts[0].get("pattern") or {}).get("Regex")
        for name in ("qwen2", "llama-bpe"):
            if regex == PRE_TOKENIZERS[name]:
                return name
    raise ModelFormatError(f"unrecognised tokenizer pre-tokenizer {kinds} (known: byte-level "
                           "BPE as gpt-2, smollm, qwen2, llama-bpe split it)")


def _tokenizer(directory: Path, writer: gguf.GGUFWriter, vocab_size: int) -> None:
    tok = read_json(directory / "tokenizer.json")
    model = tok.get("model") or {}
    if model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict):
        raise ModelFormatError(f"{directory.name}: only byte-level BPE tokenizers convert to GGUF")
    tokens: dict[int, str] = {int(i): t for t, i in model["vocab"].items()}
    types = {i: NORMAL for i in tokens}
    for added in tok.get("added_tokens", []):
        tokens[int(added["id"])] = added["content"]
        types[int(added["id"])] = CONTROL if added.get("special") else USER_DEFINED
    n = max(vocab_size, max(tokens) + 1)
    if sorted(tokens) != list(range(n)):
        raise ModelFormatError(f"{directory.name}: token ids are not 0..{n - 1} without gaps")
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre_name(tok.get("pre_tokenizer")))
    writer.add_token_list([tokens[i] for i in range(n)])
    writer.add_token_types([types[i] for i in range(n)])
    writer.add_token_merges(merges)
    tok_config = read_json_if_present(directory / "tokenizer_config.json")
    ids = {t: i for i, t in tokens.items()}
    for key, add in (("bos_token", writer.add_bos_token_id), ("eos_token", writer.add_eos_token_id),
                     ("unk_token", writer.add_unk_token_id), ("pad_token", writer.add_pad_token_id)):
        value = tok_config.get(key)
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str) and value in ids:
            add(ids[value])
    writer.add_add_bos_token(bool(tok_config.get("add_bos_token", False)))
    template = chat_template(directory, tok_config)
    if template:
        writer.add_chat_template(template)


def write_float32_gguf(directory: str | Path, out: str | Path) -> Path:
    """Write `out` (a temporary name the caller renames) from an HF directory."""
    directory, out = Path(directory), Path(out)
    cfg = read_json(directory / "config.json")
    if "quantization_config" in cfg:
        raise UsageError(f"{directory.name} is quantized "
                         f"({cfg['quantization_config'].get('quant_method')}); convert a float model")
    config, rope_freqs = hf_llama_config(cfg, directory.name)
    if rope_freqs is not None:
        raise UsageError("Llama 3.1 RoPE scaling is not supported for HF -> GGUF yet")
    arch = config.arch
    writer = gguf.GGUFWriter(str(out), arch)
    writer.add_name(directory.name)
    writer.add_block_count(config.n_layers)
    writer.add_context_length(config.context_length)
    writer.add_embedding_length(config.dim)
    writer.add_feed_forward_length(config.ffn_dim)
    writer.add_head_count(config.n_heads)
    writer.add_head_count_kv(config.n_kv_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_rope_freq_base(config.rope_base)
    if config.rope_position_scale != 1.0:
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(1.0 / config.rope_position_scale)
    writer.add_layer_norm_rms_eps(config.norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(int(gguf.LlamaFileType.ALL_F32))
    _tokenizer(directory, writer, config.vocab_size)
    try:
        with_tensors = []
        for shard in safetensors_files(directory):
            with safe_open(str(shard), framework="pt") as f:
                names = list(f.keys())
                bar = Progress(f"reading {shard.name}", len(names))
                for name in names:
                    w = f.get_tensor(name).float()
                    if arch == "llama" and name.endswith("self_attn.q_proj.weight"):
                        w = permute(w, config.n_heads)
                    elif arch == "llama" and name.endswith("self_attn.k_proj.weight"):
                        w = permute(w, config.n_kv_heads)
                    with_tensors.append(gguf_name(name))
                    writer.add_tensor(with_tensors[-1], np.ascontiguousarray(w.numpy()))
                    bar.advance(note=name)
                bar.close()
        if cfg.get("tie_word_embeddings") is False and "output.weight" not in with_tensors:
            raise ModelFormatError(f"{directory.name}: untied embeddings but no lm_head.weight")
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    return out


