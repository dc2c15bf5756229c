"""A Hugging Face directory -> the same model with NF4 linear layers, as transformers +
bitsandbytes save it (load_in_4bit, bnb_4bit_quant_type "nf4").

Like transformers, only the decoder blocks' projections are quantized: embeddings, norms
and lm_head stay in their float type. Shards keep their names (the index is rewritten).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from localchat.atomic import atomic_directory
from localchat.hf_model_files import INDEX_FILE, read_json, safetensors_files
from quantize.export_hf import write_json
from quantize.nf4 import quantize_nf4

QUANTIZED = re.compile(r"model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)\.weight")


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
    src, dst = Path(src), Path(dst)
    config = read_json(src / "config.json")
    if "quantization_config" in config:
        raise ValueError(f"{src} is already quantized")
    compute = str(config.get("torch_dtype") or "float32")
    with atomic_directory(dst) as tmp:
        weight_map: dict[str, str] = {}
        for shard in safetensors_files(src):
            out: dict[str, torch.Tensor] = {}
            with safe_open(str(shard), framework="pt") as f:
                for name in f.keys():
                    t = f.get_tensor(name)
                    if QUANTIZED.fullmatch(name) and t.dim() == 2:
                        prefix = name[: -len("weight")]
                        out |= {prefix + k: v for k, v in
                                quantize_nf4(t, double_quant=double_quant, dtype=t.dtype).items()}
                    else:
                        out[name] = t
            save_file(out, str(tmp / shard.name), metadata={"format": "pt"})
            weight_map |= {name: shard.name for name in out}
        for extra in src.iterdir():  # tokenizer files, generation config, chat template
            if extra.is_file() and extra.suffix != ".safetensors" and \
                    extra.name not in ("config.json", INDEX_FILE):
                shutil.copy2(extra, tmp / extra.name)
        if (src / INDEX_FILE).is_file():
            write_json(tmp / INDEX_FILE, {"metadata": {}, "weight_map": weight_map})
        write_json(tmp / "config.json",
                   config | {"quantization_config": quantization_config(double_quant, compute)})
    return dst
