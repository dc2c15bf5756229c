"""A one-layer Llama Hugging Face directory (random float32 weights) for refusal tests."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

TINY_CONFIG = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
               "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
               "vocab_size": 32, "max_position_embeddings": 128, "rms_norm_eps": 1e-5,
               "tie_word_embeddings": True}


def tiny_tensors() -> dict[str, torch.Tensor]:
    """Every tensor TINY_CONFIG needs, random."""
    p = "model.layers.0"
    shapes = {"model.embed_tokens.weight": (32, 64), "model.norm.weight": (64,),
              f"{p}.input_layernorm.weight": (64,), f"{p}.post_attention_layernorm.weight": (64,),
              f"{p}.self_attn.q_proj.weight": (64, 64), f"{p}.self_attn.k_proj.weight": (32, 64),
              f"{p}.self_attn.v_proj.weight": (32, 64), f"{p}.self_attn.o_proj.weight": (64, 64),
              f"{p}.mlp.gate_proj.weight": (128, 64), f"{p}.mlp.up_proj.weight": (128, 64),
              f"{p}.mlp.down_proj.weight": (64, 128)}
    return {k: torch.randn(s) for k, s in shapes.items()}


def write_tiny_hf_dir(path: Path, tensors: dict | None = None, config: dict = TINY_CONFIG,
                      with_tokenizer: bool = False) -> Path:
    """config.json, model.safetensors (when tensors are given) and an empty tokenizer.json if asked."""
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    if with_tokenizer:
        (path / "tokenizer.json").write_text("{}")
    if tensors is not None:
        save_file(tensors, str(path / "model.safetensors"))
    return path
