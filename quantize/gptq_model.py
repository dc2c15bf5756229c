"""A Hugging Face directory -> GPTQ int4 (AutoGPTQ's v1 layout), calibrated block by block in
float32 ("true sequential") on the END of the eval text, so `localchat eval` never scores it.
Embeddings, norms and lm_head stay float; the directory appears whole or not at all."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open

from localchat.errors import UsageError
from localchat.models.hf_files import read_json, safetensors_files
from localchat.formats.gptq import pack_v1
from quantize.gptq import GPTQResult, gptq_quantize, split_rows
from quantize.hf_rewrite import rewrite_projections
from quantize.progress import Progress

SEGMENT_TOKENS = 512  # tokens per calibration segment (each one attends within itself)
SEGMENTS = 32  # segments taken from the calibration text (fewer if it is shorter)
CALIBRATION_CHARS = 160_000  # the default text's tail: ~38k tokens, more than needed
MIN_TOKENS = 256
PERCDAMP = 0.01
GROUP_SIZES = (32, 64, 128, 256)


def quantization_config(group_size: int, act_order: bool = True) -> dict:
    return {"quant_method": "gptq", "bits": 4, "group_size": group_size,
            "desc_act": act_order, "sym": False, "static_groups": True,
            "true_sequential": True, "damp_percent": PERCDAMP, "checkpoint_format": "gptq"}


def calibration_text(text_file: str | None = None) -> str:
    if text_file is not None:
        try:
            return Path(text_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"cannot read --calibration {text_file}: {e}") from None
    from quantize.quality import default_text

    text = default_text()
    start = text.find("\n\n", len(text) - CALIBRATION_CHARS)  # from a paragraph start
    return text[start + 2:]


def calibration_tokens(directory: Path, text_file: str | None = None,
                       segments: int = SEGMENTS, seq_len: int = SEGMENT_TOKENS) -> torch.Tensor:
    """[n, seq_len] token ids: consecutive segments of the calibration text."""
    from localchat.engine.executors.torch.hf_vocab import HFVocabulary

    vocab = HFVocabulary(directory)
    text = calibration_text(text_file)
    tokens: list[int] = []
    for start in range(0, len(text), 20000):
        tokens += vocab.tokenize_text(text[start:start + 20000])
        if len(tokens) >= segments * seq_len:
            break
    if len(tokens) < MIN_TOKENS:
        raise UsageError(f"the calibration text has {len(tokens)} tokens; GPTQ needs at "
                         f"least {MIN_TOKENS}")
    seq_len = min(seq_len, len(tokens))
    n = min(segments, len(tokens) // seq_len)
    return torch.tensor(tokens[:n * seq_len]).reshape(n, seq_len)


def hessian(x: torch.Tensor) -> torch.Tensor:
    """2/n · Σ xxᵀ over every token, accumulated chunk by chunk (float32 products,
    float64 sum): gptq.hessian() without a float64 copy of all the inputs."""
    x = x.reshape(-1, x.shape[-1])
    h = torch.zeros(x.shape[1], x.shape[1], dtype=torch.float64)
    for chunk in x.split(4096):
        h += (chunk.t() @ chunk).double()
    return h * (2.0 / x.shape[0])


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)  # HF layout: rotate halves
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


def _rope_tables(config, rope_freqs, seq_len: int):
    from localchat.engine.executors.torch.rope import inverse_frequencies

    inv = inverse_frequencies(config.head_dim, config.rope_base)
    if rope_freqs is not None:
        inv = inv / rope_freqs.double()
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64) * config.rope_position_scale, inv)
    return angles.cos().float()[:, None, :], angles.sin().float()[:, None, :]  # [T, 1, D/2]


def _attention(config, qkv: torch.Tensor, cos, sin, batch: int = 8) -> torch.Tensor:
    """Causal attention within each segment. qkv: [n, T, (H + 2·KV)·D] -> [n, T, H·D]."""
    c = config
    n, t, _ = qkv.shape
    out = torch.empty(n, t, c.n_heads * c.head_dim)
    for s in range(0, n, batch):
        x = qkv[s:s + batch].reshape(-1, t, c.n_heads + 2 * c.n_kv_heads, c.head_dim)
        q = _rope(x[:, :, :c.n_heads], cos, sin).transpose(1, 2)
        k = _rope(x[:, :, c.n_heads:c.n_heads + c.n_kv_heads], cos, sin).transpose(1, 2)
        v = x[:, :, c.n_heads + c.n_kv_heads:].transpose(1, 2)
        group = c.n_heads // c.n_kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out[s:s + batch] = o.transpose(1, 2).reshape(-1, t, c.n_heads * c.head_dim)
    return out


def _norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def block(c, i: int, x: torch.Tensor, get, quantize, cos, sin, with_bias: bool) -> torch.Tensor:
    """Block i on x [n, T, dim]; `quantize(names, inputs)` gives each Linear group's
    weights (stacked by rows) once its inputs are known, so later inputs see them."""
    p = f"model.layers.{i}"
    h = _norm(x, get(f"{p}.input_layernorm.weight"), c.norm_eps)
    attn = [f"{p}.self_attn.{n}_proj.weight" for n in "qkv"]
    qkv = h @ quantize(attn, h).t()
    if with_bias:
        qkv = qkv + torch.cat([get(a.removesuffix("weight") + "bias") for a in attn])
    a = _attention(c, qkv, cos, sin)
    del qkv, h
    x = x + a @ quantize([f"{p}.self_attn.o_proj.weight"], a).t()
    del a
    h = _norm(x, get(f"{p}.post_attention_layernorm.weight"), c.norm_eps)
    gate_up = [f"{p}.mlp.gate_proj.weight", f"{p}.mlp.up_proj.weight"]
    gate, up = (h @ quantize(gate_up, h).t()).split(c.ffn_dim, dim=-1)
    act = F.silu(gate) * up
    del gate, up, h
    return x + act @ quantize([f"{p}.mlp.down_proj.weight"], act).t()


def gptq_model(directory: Path, tokens: torch.Tensor, group_size: int = 128,
               act_order: bool = True, layers: int | None = None,
               log=None) -> dict[str, GPTQResult]:
    """{HF weight name: GPTQResult} for every block projection of the first `layers`
    blocks (all by default), quantized sequentially on the calibration `tokens`."""
    from localchat.engine.executors.torch.hf_weights import hf_llama_config

    cfg = read_json(directory / "config.json")
    config, rope_freqs = hf_llama_config(cfg, directory.name)
    c = config
    with_bias = c.arch == "qwen2" or bool(cfg.get("attention_bias"))
    handles = {}
    for shard in safetensors_files(directory):
        f = safe_open(str(shard), framework="pt")
        handles |= {k: f for k in f.keys()}

    def get(name: str) -> torch.Tensor:
        return handles[name].get_tensor(name).float()

    n_layers = c.n_layers if layers is None else min(layers, c.n_layers)
    cos, sin = _rope_tables(c, rope_freqs, tokens.shape[1])
    x = get("model.embed_tokens.weight")[tokens]  # [n, T, dim]
    results: dict[str, GPTQResult] = {}
    bar = Progress(f"GPTQ on {tokens.numel()} tokens", n_layers * 4)

    def quantize(names: list[str], inputs: torch.Tensor) -> torch.Tensor:
        """GPTQ for the Linears `names` (sharing `inputs`), stacked; returns the
        dequantized stacked matrix."""
        ws, h = [get(n) for n in names], hessian(inputs)
        r = gptq_quantize(torch.cat(ws), h, bits=4, group_size=group_size,
                          act_order=act_order, percdamp=PERCDAMP)
        for name, part in zip(names, split_rows(r, [w.shape[0] for w in ws])):
            results[name] = part
        if log is not None and r.damp > 2 * PERCDAMP * torch.diag(h).mean().item():
            log(f"{names[0]}: Cholesky failed; damping raised to {r.damp:.3g}")
        bar.advance(note=names[0].removeprefix("model."))
        return r.dequantized

    with torch.inference_mode():
        for i in range(n_layers):
            x = block(c, i, x, get, quantize, cos, sin, with_bias)
    bar.close()
    return results


def quantize_hf_dir_to_gptq(src: str | Path, dst: str | Path, group_size: int = 128,
                            text_file: str | None = None, *, act_order: bool = True,
                            segments: int = SEGMENTS, seq_len: int = SEGMENT_TOKENS,
                            layers: int | None = None, stream=None) -> Path:
    """Write `dst` (new): `src`'s block projections as GPTQ int4 (v1 layout). `layers`
    limits GPTQ to the first blocks (tests); the rest would stay float, so it also cuts
    the written model's num_hidden_layers to match."""
    src, dst = Path(src), Path(dst)
    stream = stream or sys.stderr
    if group_size not in GROUP_SIZES:
        raise UsageError(f"GPTQ group size must be one of {', '.join(map(str, GROUP_SIZES))}, "
                         f"got {group_size}")
    config = read_json(src / "config.json")
    if "quantization_config" in config:
        raise UsageError(f"{src} is already quantized ({config['quantization_config'].get('quant_method')})")
    start = time.perf_counter()
    tokens = calibration_tokens(src, text_file, segments, seq_len)
    results = gptq_model(src, tokens, group_size, act_order, layers,
                         log=lambda msg: print(f"GPTQ: {msg}", file=stream))
    seconds = time.perf_counter() - start
    print(f"GPTQ: {len(results)} matrices, {tokens.shape[0]}×{tokens.shape[1]} calibration "
          f"tokens, {seconds:.1f} s", file=stream)
    packed = {name: pack_v1(r) for name, r in results.items()}
    qconfig = quantization_config(group_size, act_order)
    if layers is None:
        return rewrite_projections(src, dst, lambda name, w: packed[name], qconfig, label="GPTQ")
    return _write_first_layers(src, dst, packed, qconfig, layers)


def _write_first_layers(src: Path, dst: Path, packed: dict, qconfig: dict, layers: int) -> Path:
    """A model cut to its first `layers` blocks (a small real model for tests)."""
    import shutil

    from localchat.atomic import atomic_directory
    from quantize.export_hf import write_json
    from quantize.safe_output import save_safetensors

    config = read_json(src / "config.json")
    out: dict[str, torch.Tensor] = {}
    for shard in safetensors_files(src):
        with safe_open(str(shard), framework="pt") as f:
            for name in f.keys():
                if name.startswith("model.layers.") and int(name.split(".")[2]) >= layers:
                    continue
                if name in packed:
                    prefix = name.removesuffix("weight")
                    out |= {prefix + k: v for k, v in packed[name].items()}
                else:
                    out[name] = f.get_tensor(name)
    with atomic_directory(dst) as tmp:
        save_safetensors(out, tmp / "model.safetensors")
        for extra in src.iterdir():
            if extra.is_file() and extra.suffix != ".safetensors" and extra.name != "config.json" \
                    and not extra.name.endswith(".index.json"):
                shutil.copy2(extra, tmp / extra.name)
        write_json(tmp / "config.json", config | {"num_hidden_layers": layers,
                                                  "quantization_config": qconfig})
    return dst
