"""A Hugging Face directory -> the same model with NF4 decoder projections, as transformers +
bitsandbytes save it (load_in_4bit, "nf4"); embeddings, norms and lm_head stay float."""

from __future__ import annotations

from pathlib import Path

import torch

from localchat.models.hf_files import read_json
from quantize.hf_rewrite import rewrite_projections
from localchat.formats.nf4 import quantize_nf4


def quantization_config(double_quant: bool, compute_dtype: str) -> dict:
    return {
        "quant_method": "bitsandbytes",
        "load_in_4bit": True,
        "load_in_8bit": False,
        "bnb_4bit_quant_type": "nf4",
        "bnb_4bit_use_double_quant": double_quant,
        "bnb_4bit_compute_dtype": compute_dtype,
        "bnb_4bit_quant_storage": "uint8",
        "llm_int8_skip_modules": None,
    }


def quantize_hf_dir_to_nf4(src: str | Path, dst: str | Path, double_quant: bool = False) -> Path:
    """Write `dst` (new, or empty): `src` with its block projections in NF4."""
    compute = str(read_json(Path(src) / "config.json").get("torch_dtype") or "float32")

    def encode(name: str, t: torch.Tensor) -> dict[str, torch.Tensor]:
        return quantize_nf4(t, double_quant=double_quant, dtype=t.dtype)

    return rewrite_projections(src, dst, encode, quantization_config(double_quant, compute),
                               label="NF4")
