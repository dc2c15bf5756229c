"""GGUF -> a Hugging Face directory (config.json, model.safetensors, tokenizer): weights
dequantized under transformers' Llama/Qwen2 names with llama.cpp's Q/K permutation undone.
The directory appears whole or not at all."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from localchat.engine.executors.torch.weights import LlamaConfig
from localchat.atomic import atomic_directory
from localchat.errors import ModelFormatError, UsageError
from localchat.formats.gguf_blocks import dequantize_tensor
from localchat.models.gguf_checks import check_model_metadata
from localchat.models.gguf_reader import GGUFFile, read_gguf
from quantize.hf_tokenizer import build_tokenizer, tokenizer_config
from quantize.safe_output import save_safetensors

HF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
                 "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}


def rename_tensor(name: str, global_names: dict, layer_names: dict, layer_prefix: str,
                  out_layer_prefix: str, target: str) -> str:
    """One tensor name through a name table, either way: whole names first, then
    `<layer_prefix><i>.<part>[.suffix]` -> `<out_layer_prefix><i>.<mapped part>[.suffix]`."""
    if name in global_names:
        return global_names[name]
    if name.startswith(layer_prefix):
        index, _, rest = name[len(layer_prefix):].partition(".")
        for ours, theirs in layer_names.items():
            if rest == ours or rest.startswith(ours + "."):
                return f"{out_layer_prefix}{index}.{theirs}{rest[len(ours):]}"
    raise ModelFormatError(f"no {target} name for tensor {name!r}")


def hf_name(gguf_name: str) -> str:
    """blk.3.attn_q.weight -> model.layers.3.self_attn.q_proj.weight."""
    return rename_tensor(gguf_name, _GLOBAL_NAMES, _LAYER_NAMES, "blk.", "model.layers.",
                         "Hugging Face")


def unpermute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Inverse of convert_hf_to_gguf's permute(): per head, rows (pair j, member 0/1)
    go back to (half 0/1, position j)."""
    return (w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def gguf_tensor(g: GGUFFile, name: str) -> torch.Tensor:
    """Any GGUF tensor as float32, in PyTorch's [rows, cols] order."""
    t = g.tensors[name]
    return dequantize_tensor(g.tensor_data(name), t.ggml_type, t.shape)


def hf_config(config: LlamaConfig, meta: dict, tied: bool, dtype: torch.dtype) -> dict:
    arch = config.arch

    def token_id(key: str):
        value = meta.get(f"tokenizer.ggml.{key}")
        return value if type(value) is int else None

    scale = config.rope_position_scale
    return {
        "architectures": [HF_ARCHITECTURES[arch]],
        "model_type": arch,
        "hidden_size": config.dim,
        "intermediate_size": config.ffn_dim,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_kv_heads,
        "head_dim": config.head_dim,
        "vocab_size": config.vocab_size,
        "max_position_embeddings": config.context_length,
        "rms_norm_eps": config.norm_eps,
        "rope_theta": config.rope_base,
        "rope_scaling": None if scale == 1.0 else {"type": "linear", "rope_type": "linear",
                                                   "factor": 1.0 / scale},
        "tie_word_embeddings": tied,
        "hidden_act": "silu",
        "attention_bias": arch == "qwen2",  # qwen2 always has q/k/v biases
        "mlp_bias": False,
        "bos_token_id": token_id("bos_token_id"),
        "eos_token_id": token_id("eos_token_id"),
        "pad_token_id": token_id("padding_token_id"),
        "torch_dtype": str(dtype).removeprefix("torch."),
        "use_cache": True,
    }


def write_json(path: Path, content: dict) -> None:
    path.write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def export_gguf_to_hf(gguf_path: str | Path, out_dir: str | Path,
                      dtype: torch.dtype = torch.float32) -> Path:
    """Write the HF directory `out_dir` (which must not exist yet, or be empty)."""
    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise UsageError(f"{out_dir} already exists; choose a new directory")
    with read_gguf(gguf_path) as g:
        check_model_metadata(g)
        meta = g.metadata
        config = LlamaConfig.from_metadata(meta)
        if "rope_freqs.weight" in g.tensors:
            raise ModelFormatError("exporting Llama 3.1 RoPE factors (rope_freqs) is not supported")
        tokenizer = build_tokenizer(meta)
        tensors: dict[str, torch.Tensor] = {}
        for name in g.tensors:
            w = gguf_tensor(g, name)
            if config.arch == "llama" and ".attn_q." in name:
                w = unpermute(w, config.n_heads)
            elif config.arch == "llama" and ".attn_k." in name:
                w = unpermute(w, config.n_kv_heads)
            tensors[hf_name(name)] = w.to(dtype).contiguous()
        tied = "lm_head.weight" not in tensors
        files = {
            "config.json": hf_config(config, meta, tied, dtype),
            "generation_config.json": {k: v for k, v in (
                ("bos_token_id", meta.get("tokenizer.ggml.bos_token_id")),
                ("eos_token_id", meta.get("tokenizer.ggml.eos_token_id"))) if v is not None},
            "tokenizer_config.json": tokenizer_config(meta, config.context_length),
        }
    with atomic_directory(out_dir) as tmp:
        save_safetensors(tensors, tmp / "model.safetensors")
        tokenizer.save(str(tmp / "tokenizer.json"))
        for filename, content in files.items():
            write_json(tmp / filename, content)
    return out_dir
