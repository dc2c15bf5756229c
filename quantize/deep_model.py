"""A speed fixture: a deep copy of a model whose extra layers cost a real layer's bytes and
FLOPs but add nothing to the residual stream (their o_proj and down_proj are zero), so it
computes the source's logits up to rounding. deep:K is the bundled model with 30·K layers in
Q8_0 -- a bandwidth-bound target for benchmarking speculative decoding, never a chat model."""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

from localchat.errors import UsageError
from localchat.models.hf_files import read_json
from quantize.export_hf import export_gguf_to_hf, write_json
from quantize.gguf_quantize import quantize_gguf
from quantize.hf_to_gguf import write_float32_gguf
from quantize.safe_output import save_safetensors

DEEP_SPEC = re.compile(r"deep:(\d+)")
SILENT = ("self_attn.o_proj.weight", "mlp.down_proj.weight")  # zero in the copied layers
MAX_K = 16


def deepen(tensors: dict[str, torch.Tensor], n_layers: int, k: int) -> dict[str, torch.Tensor]:
    """The HF tensors of an n_layers model stretched to n_layers·k layers: layer i ≥ n_layers
    is a copy of layer i mod n_layers with its SILENT projections zero."""
    out = {}
    for name, w in tensors.items():
        m = re.match(r"model\.layers\.(\d+)\.(.+)", name)
        if m is None:
            out[name] = w
            continue
        layer, rest = int(m[1]), m[2]
        for copy in range(k):
            out[f"model.layers.{layer + copy * n_layers}.{rest}"] = \
                torch.zeros_like(w) if copy and rest in SILENT else (w.clone() if copy else w)
    return out


def write_deep_model(source: Path, k: int, out: Path, type_name: str = "Q8_0",
                     threads: int | None = None) -> Path:
    """Write the GGUF `out` (atomically): `source` (a GGUF) with k times its layers, through
    quantize.export_hf (float32 HF), the deepening, HF -> GGUF, and the `type_name` quantizer."""
    if not 1 <= k <= MAX_K:
        raise UsageError(f"K must be 1..{MAX_K}, got {k}")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".localchat-deep-") as tmp:
        hf = export_gguf_to_hf(source, Path(tmp) / "source")
        config = read_json(hf / "config.json")
        n_layers = int(config["num_hidden_layers"])
        deep = Path(tmp) / f"deep-{k}"
        shutil.copytree(hf, deep, ignore=shutil.ignore_patterns("model.safetensors"))
        save_safetensors(deepen(load_file(hf / "model.safetensors"), n_layers, k),
                         deep / "model.safetensors")
        shutil.rmtree(hf)
        write_json(deep / "config.json", {**config, "num_hidden_layers": n_layers * k})
        f32 = Path(tmp) / "float32.gguf"
        write_float32_gguf(deep, f32)
        shutil.rmtree(deep)
        quantize_gguf(f32, out, type_name, threads)
    return out


def deep_fixture(k: int) -> Path:
    """deep:K, built once into the cache dir: the bundled model with 30·K layers in Q8_0."""
    from localchat.models.specs import resolve_model
    from localchat.paths import cache_dir

    path = cache_dir() / "fixtures" / f"deep-{k}-Q8_0.gguf"
    if not path.exists():
        write_deep_model(Path(resolve_model("default")), k, path)
    return path


def resolve_deep(spec: str) -> Path:
    """The fixture's path for a `deep:K` spec."""
    m = DEEP_SPEC.fullmatch(spec)
    if m is None:
        raise UsageError(f"{spec!r}: a deep fixture is deep:K, K in 1..{MAX_K}")
    if not 1 <= int(m[1]) <= MAX_K:
        raise UsageError(f"K must be 1..{MAX_K}, got {m[1]}")
    return deep_fixture(int(m[1]))
