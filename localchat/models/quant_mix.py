"""The type llama.cpp's quantizer gives each tensor for a file type (its
llama_tensor_get_type: K-quant mixes put the output, some attn_v and ffn_down layers in more
bits; rows that do not split into a type's blocks fall back), so `plan`, the model picker and
the file `quantize` writes agree. Only the file types `localchat quantize` offers."""

from __future__ import annotations

from dataclasses import dataclass

# ftype -> the default tensor type of the mix
BASE_TYPE = {
    "F32": "F32", "F16": "F16", "BF16": "BF16", "Q8_0": "Q8_0", "Q4_0": "Q4_0", "Q4_1": "Q4_1",
    "Q5_0": "Q5_0", "Q5_1": "Q5_1", "Q2_K": "Q2_K", "Q3_K_S": "Q3_K", "Q3_K_M": "Q3_K",
    "Q3_K_L": "Q3_K", "Q4_K_S": "Q4_K", "Q4_K_M": "Q4_K", "Q5_K_S": "Q5_K", "Q5_K_M": "Q5_K",
    "Q6_K": "Q6_K",
}
# ggml's (block size, bytes per block)
TYPE_SIZE = {
    "F32": (1, 4), "F16": (1, 2), "BF16": (1, 2), "Q8_0": (32, 34), "Q4_0": (32, 18),
    "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24), "Q2_K": (256, 84), "Q3_K": (256, 110),
    "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210),
}
FALLBACK = {"Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}
QUANTIZED = {t for t, (block, _) in TYPE_SIZE.items() if block > 1}
NOT_QUANTIZED = ("_norm.weight", "ffn_gate_inp.weight", "altup", "laurel", "per_layer_model_proj",
                 "ssm_conv1d", "attn_rel_b.weight", "position_embd", "token_types")


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]  # ggml order: the row length first

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def tensor_bytes(n_elements: int, type_name: str) -> int:
    block, size = TYPE_SIZE[type_name]
    return n_elements // block * size


def planned_types(tensors: list[Tensor], ftype: str, *, arch: str = "llama", n_gqa: int = 1,
                  n_expert: int = 1) -> dict[str, str]:
    """Each tensor's type in a `ftype` file, as llama.cpp's quantizer chooses it (tensors
    it does not quantize are written as float32, as the F32 intermediate holds them)."""
    base = BASE_TYPE[ftype]
    tied = not any(t.name == "output.weight" for t in tensors)
    n_v = sum(1 for t in tensors if _category(t.name) in ("attn_v", "attn_qkv"))
    n_down = sum(1 for t in tensors if _category(t.name) == "ffn_down")
    counters = {"v": 0, "down": 0}
    out = {}
    for t in tensors:
        if not _quantizable(t):
            out[t.name] = "F32"
            continue
        new = base
        if base in QUANTIZED:
            new = _mix(t, base, ftype, tied, arch, n_gqa, n_expert, counters, n_v, n_down)
            new = _fallback(t, new)
        out[t.name] = new
    return out


def planned_bytes(tensors: list[Tensor], ftype: str, **model) -> int:
    types = planned_types(tensors, ftype, **model)
    return sum(tensor_bytes(t.n_elements, types[t.name]) for t in tensors)


def _quantizable(t: Tensor) -> bool:
    return len([d for d in t.shape if d > 1]) >= 2 and len(t.shape) >= 2 and \
        t.name.endswith("weight") and not any(part in t.name for part in NOT_QUANTIZED)


def _category(name: str) -> str:
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    for key, category in (("attn_qkv.weight", "attn_qkv"), ("attn_kv_b.weight", "attn_qkv"),
                          ("attn_v.weight", "attn_v"), ("attn_k.weight", "attn_k"),
                          ("attn_q.weight", "attn_q"), ("attn_output.weight", "attn_output"),
                          ("ffn_up", "ffn_up"), ("ffn_gate", "ffn_gate"),
                          ("ffn_down", "ffn_down")):
        if key in name:
            return category
    return "other"


def _more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _mix(t: Tensor, new: str, ftype: str, tied: bool, arch: str, n_gqa: int, n_expert: int,
         counters: dict, n_v: int, n_down: int) -> str:
    """llama_tensor_get_type_impl for the ftypes above."""
    category = _category(t.name)
    if category == "output" or (tied and category == "token_embd"):
        if arch == "falcon" or t.shape[0] % TYPE_SIZE[new][0] != 0:
            return "Q8_0"
        return new if new == "Q8_0" else "Q6_K"
    if category == "token_embd":
        return new
    if category in ("attn_v", "attn_qkv"):  # llama.cpp's category_is_attn_v
        i = counters["v"]
        counters["v"] += 1
        if ftype == "Q2_K":
            new = "Q4_K" if n_gqa >= 4 else "Q3_K"
        elif ftype == "Q3_K_M":
            new = "Q5_K" if i < 2 else "Q4_K"
        elif ftype == "Q3_K_L":
            new = "Q5_K"
        elif ftype in ("Q4_K_M", "Q5_K_M") and _more_bits(i, n_v):
            new = "Q6_K"
        elif ftype == "Q4_K_S" and i < 4:
            new = "Q5_K"
        if n_expert == 8:
            new = "Q8_0"
        return new
    if category == "attn_k":
        return "Q8_0" if n_expert == 8 else new
    if category == "ffn_down":
        i = counters["down"]
        counters["down"] += 1
        n = n_down
        if ftype == "Q2_K":
            return "Q3_K"
        if ftype == "Q3_K_M":
            return "Q5_K" if i < n // 16 else \
                "Q4_K" if arch != "falcon" or _more_bits(i, n) else "Q3_K"
        if ftype == "Q3_K_L":
            return "Q4_K" if arch == "falcon" else "Q5_K"
        if ftype == "Q4_K_M":
            if arch == "falcon":
                return "Q6_K" if i < n // 16 else "Q5_K" if _more_bits(i, n) else "Q4_K"
            return "Q6_K" if _more_bits(i, n) else new
        if ftype == "Q5_K_M" and _more_bits(i, n):
            return "Q6_K"
        if ftype == "Q4_K_S" and arch != "falcon" and i < n // 8:
            return "Q5_K"
        return new
    if category == "attn_output":
        if arch != "falcon":
            if n_expert == 8:
                return "Q5_K" if ftype in ("Q2_K", "Q3_K_S", "Q3_K_M", "Q4_K_S", "Q4_K_M") else new
            return {"Q2_K": "Q3_K", "Q3_K_M": "Q4_K", "Q3_K_L": "Q5_K"}.get(ftype, new)
        return "Q4_K" if ftype == "Q3_K_L" else new
    return new


def _fallback(t: Tensor, new: str) -> str:
    """A row that does not split into the type's blocks takes llama.cpp's fallback type."""
    block = TYPE_SIZE[new][0]
    if t.shape[0] % block == 0:
        return new
    new = FALLBACK.get(new, "F16")
    return new if t.shape[0] % TYPE_SIZE[new][0] == 0 else "F16"
