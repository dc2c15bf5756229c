"""A Hugging Face directory -> the same model with its decoder projections re-encoded (the walk
NF4, INT8 and INT4 share): other files are kept or copied, config.json gains
`quantization_config`, and the directory appears whole or not at all."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Callable

import torch
from safetensors import safe_open

from localchat.atomic import atomic_directory
from localchat.errors import UsageError
from localchat.models.hf_files import INDEX_FILE, read_json, safetensors_files
from quantize.export_hf import write_json
from quantize.progress import Progress
from quantize.safe_output import save_safetensors

QUANTIZED = re.compile(r"model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)\.weight")

# (tensor name, float matrix) -> tensors to store under that Linear's prefix, keyed by
# the suffix after "<prefix>." (e.g. "weight", "weight_scale")
Encoder = Callable[[str, torch.Tensor], dict[str, torch.Tensor]]


def rewrite_projections(src: str | Path, dst: str | Path, encode: Encoder,
                        quantization_config: dict, label: str = "quantizing") -> Path:
    src, dst = Path(src), Path(dst)
    config = read_json(src / "config.json")
    if "quantization_config" in config:
        raise UsageError(f"{src} is already quantized ({config['quantization_config'].get('quant_method')})")
    shards = safetensors_files(src)
    with atomic_directory(dst) as tmp:
        weight_map: dict[str, str] = {}
        for shard in shards:
            out: dict[str, torch.Tensor] = {}
            with safe_open(str(shard), framework="pt") as f:
                names = list(f.keys())
                bar = Progress(f"{label} {shard.name}", len(names))
                for name in names:
                    t = f.get_tensor(name)
                    if QUANTIZED.fullmatch(name) and t.dim() == 2:
                        prefix = name[: -len("weight")]
                        out |= {prefix + k: v for k, v in encode(name, t).items()}
                    else:
                        out[name] = t
                    bar.advance(note=name)
                bar.close()
            save_safetensors(out, tmp / shard.name)
            weight_map |= {name: shard.name for name in out}
        for extra in src.iterdir():  # tokenizer files, generation config, chat template
            if extra.is_file() and extra.suffix != ".safetensors" and \
                    extra.name not in ("config.json", INDEX_FILE):
                shutil.copy2(extra, tmp / extra.name)
        if (src / INDEX_FILE).is_file():
            write_json(tmp / INDEX_FILE, {"metadata": {}, "weight_map": weight_map})
        write_json(tmp / "config.json", config | {"quantization_config": quantization_config})
    return dst
