"""Any model file's block projections (GGUF, float safetensors, NF4, INT8/INT4, GPTQ) as float32
by Hugging Face name and layout, with its bits per weight, to compare files matrix by matrix."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from localchat.formats.gptq import dequantize_gptq, gptq_config, gptq_matrices
from localchat.formats.intq import QUANT_METHOD, SCALE_SUFFIX, dequantize_int, load_int
from localchat.formats.nf4 import QUANT_STATE_KEY, dequantize, load_nf4
from localchat.models.facts import GGUFFacts
from localchat.models.gguf_reader import read_gguf
from localchat.models.hf_files import read_json, safetensors_files
from quantize.export_hf import gguf_tensor, hf_name, unpermute
from quantize.hf_rewrite import QUANTIZED


def projection_matrices(facts: GGUFFacts) -> tuple[dict[str, torch.Tensor], float]:
    """({HF name: float32 matrix}, stored bits per projection weight)."""
    return _hf(facts.path) if facts.path.is_dir() else _gguf(facts.path)


def _gguf(path: Path) -> tuple[dict[str, torch.Tensor], float]:
    out, bits, numel = {}, 0, 0
    with read_gguf(path) as g:
        meta = g.metadata
        arch = meta["general.architecture"]
        heads = int(meta[f"{arch}.attention.head_count"])
        kv_heads = int(meta.get(f"{arch}.attention.head_count_kv", heads))
        for name, info in g.tensors.items():
            if not name.startswith("blk.") or not name.endswith(".weight") or len(info.shape) != 2:
                continue
            key = hf_name(name)
            if not QUANTIZED.fullmatch(key):
                continue
            w = gguf_tensor(g, name)
            if arch == "llama" and ".attn_q." in name:
                w = unpermute(w, heads)
            elif arch == "llama" and ".attn_k." in name:
                w = unpermute(w, kv_heads)
            out[key] = w
            bits += 8 * info.n_bytes
            numel += w.numel()
    return out, bits / max(numel, 1)


def _hf(directory: Path) -> tuple[dict[str, torch.Tensor], float]:
    q = read_json(directory / "config.json").get("quantization_config")
    is_int = isinstance(q, dict) and q.get("quant_method") == QUANT_METHOD
    gptq = gptq_config(q, directory.name) if isinstance(q, dict) and \
        q.get("quant_method") == "gptq" else None
    out, bits, numel = {}, 0, 0
    for shard in safetensors_files(directory):
        with safe_open(str(shard), framework="pt") as f:
            keys = set(f.keys())
            for name, m, stored in gptq_matrices(keys, f.get_tensor, gptq) if gptq else ():
                if QUANTIZED.fullmatch(name):
                    out[name] = dequantize_gptq(m)
                    bits += sum(8 * _nbytes(f, k) for k in stored)
                    numel += m.codes.numel()
            for name in sorted(k for k in keys if QUANTIZED.fullmatch(k)):
                stored = [k for k in keys if k == name or k.startswith(name + ".")
                          or k == name + SCALE_SUFFIX]
                if is_int and name + SCALE_SUFFIX in keys:
                    w = dequantize_int(load_int(f.get_tensor, name, q["bits"], q.get("group_size")))
                elif f"{name}.{QUANT_STATE_KEY}" in keys:
                    m = load_nf4(lambda k: f.get_tensor(k) if k in keys else None, name)
                    w = m if isinstance(m, torch.Tensor) else dequantize(m)
                else:
                    w = f.get_tensor(name).float()
                out[name] = w
                bits += sum(8 * _nbytes(f, k) for k in stored)
                numel += w.numel()
    return out, bits / max(numel, 1)


def _nbytes(f, key: str) -> int:
    t = f.get_tensor(key)
    return t.numel() * t.element_size()

