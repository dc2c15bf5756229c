"""The memory planner: with how much context, for how many users a model fits, from its metadata
alone (`localchat plan`; the TUI's model picker). Weights are the file's tensor bytes; KV bytes
per token are GGUFFacts.kv_bytes_per_token, the formula the engines use."""

from __future__ import annotations

from dataclasses import dataclass

from localchat.errors import ConfigError
from localchat.models.facts import GGUFFacts
from localchat.models.quant_mix import BASE_TYPE, Tensor, planned_bytes

# bits per weight of llama.cpp's types (block bytes × 8 / block size; K-quant mixes averaged)
BITS_PER_WEIGHT = {"F16": 16.0, "Q8_0": 8.5, "Q6_K": 6.5625, "Q5_K_M": 5.69, "Q5_1": 6.0,
                   "Q5_0": 5.5, "Q4_K_M": 4.85, "Q4_1": 5.0, "Q4_0": 4.5, "NF4": 4.127}
# bytes per cached value, by KV-cache type (llama.cpp's cache type names; "q8_0/f16" is
# K as q8_0 and V as f16, the llama.cpp executor's exact-batching cache on the CPU, averaged)
KV_BYTES_PER_VALUE = {"f32": 4.0, "f16": 2.0, "q8_0/f16": (34 / 32 + 2) / 2, "q8_0": 34 / 32,
                      "q4_0": 18 / 32}


# formats `quantize` writes as a directory: only the block projections are quantized; the
# embeddings, norms and output matrix stay float32 (as transformers + bitsandbytes keep them)
PROJECTIONS_ONLY = ("NF4",)


@dataclass(frozen=True)
class ModelSize:
    weights_bytes: int  # as stored in the file
    n_params: int
    facts: GGUFFacts
    float_params: int | None = None  # outside the block projections (None: not known)
    tensors: tuple[Tensor, ...] = ()  # a GGUF's tensors: each one's type in another file type

    def kv_bytes_per_token(self, kv_type: str = "f16") -> int:
        return self.facts.kv_bytes_per_token(KV_BYTES_PER_VALUE[kv_type])

    def weights_bytes_as(self, quant: str) -> int:
        """The weights' bytes in `quant`, as `quantize` writes them (PROJECTIONS_ONLY
        formats keep the rest float32)."""
        if quant == self.facts.quant_type:
            return self.weights_bytes
        if quant in PROJECTIONS_ONLY and self.float_params is not None:
            projections = self.n_params - self.float_params
            return round(projections * BITS_PER_WEIGHT[quant] / 8) + 4 * self.float_params
        if self.tensors and quant in BASE_TYPE:  # llama.cpp's own choice per tensor
            f = self.facts
            return planned_bytes(list(self.tensors), quant, arch=f.architecture,
                                 n_gqa=f.n_heads // max(1, f.n_kv_heads))
        return round(self.n_params * BITS_PER_WEIGHT[quant] / 8)


CACHE_TYPE_BYTES = {"f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32}  # llama.cpp's cache types, bytes per value


def default_cache_types(facts: GGUFFacts, on_cpu: bool = True,
                        exact: bool = False) -> tuple[str, str]:
    """llama.cpp's K and V cache types: its own default, f16 for both (the fastest on the CPU:
    ggml's tiled and split-KV flash attention), or with `exact` on the CPU the pair that keeps
    batching exact (executors/llamacpp.py says why): q8_0 K + f16 V, or f16 K + bf16 V where
    rows do not split into 32-value q8_0 blocks."""
    if not (on_cpu and exact):
        return "f16", "f16"
    return ("q8_0", "f16") if facts.head_dim % 32 == 0 else ("f16", "bf16")


def batches_exactly(k_type: str, v_type: str) -> bool:
    """Whether ggml's CPU flash attention stays on one kernel with these cache types, so a
    sequence computes the same bits alone, batched or verifying drafts: its tiled and split-KV
    kernels run only where K and V are both f16 (or f32)."""
    return not (k_type == v_type and k_type in ("f16", "f32"))


def chosen_cache_types(facts: GGUFFacts, asked: tuple[str | None, str | None],
                       on_cpu: bool = True, exact: bool = False) -> tuple[str, str]:
    """The K and V types llama.cpp runs with: those asked for, default_cache_types for the
    rest; a ConfigError where `exact` is asked with types that do not batch exactly."""
    chosen = tuple(t or d for t, d in zip(asked, default_cache_types(facts, on_cpu, exact)))
    if exact and not batches_exactly(*chosen):
        raise ConfigError("exact_batching", f"needs K and V cache types other than {chosen[0]} "
                          "for both (ggml's tiled and split-KV attention round by batch)")
    return chosen


def engine_kv_bytes_per_token(facts: GGUFFacts, engine: str = "llama.cpp",
                              cache_types: tuple[str, str] | None = None) -> int:
    """KV bytes one token costs as `engine` keeps it (llama.cpp: cache_types, by default
    default_cache_types on the CPU; torch: f16): the one figure the engines' gauges, the
    model picker and `plan` share."""
    if engine == "torch":
        return facts.kv_bytes_per_token(KV_BYTES_PER_VALUE["f16"])
    k_type, v_type = cache_types or default_cache_types(facts)
    return facts.kv_bytes_per_token(CACHE_TYPE_BYTES[k_type], CACHE_TYPE_BYTES[v_type])


def model_size(facts: GGUFFacts) -> ModelSize:
    if facts.path.is_dir():  # a Hugging Face directory: its safetensors headers
        from localchat.models.hf_files import tensor_totals

        return ModelSize(*tensor_totals(facts.path), facts)
    from localchat.models.gguf_reader import read_gguf  # gguf and numpy: only for a plan

    with read_gguf(facts.path) as f:
        tensors = list(f.tensors.items())
    float_params = sum(t.n_elements for name, t in tensors
                       if not (name.startswith("blk.") and len(t.shape) >= 2))
    return ModelSize(sum(t.n_bytes for _, t in tensors), sum(t.n_elements for _, t in tensors),
                     facts, float_params, tuple(Tensor(n, tuple(t.shape)) for n, t in tensors))


def context_that_fits(size: ModelSize, memory: int, kv_type: str) -> int:
    """Tokens of KV cache that fit beside the weights (0 if the weights alone do not)."""
    return max(0, (memory - size.weights_bytes) // size.kv_bytes_per_token(kv_type))


def build_plan(size: ModelSize, budgets: list[int], ctx: int) -> dict:
    f = size.facts
    return {
        "model": f.name, "quant": f.quant_type, "params": size.n_params,
        "weights_bytes": size.weights_bytes, "context": ctx, "model_context": f.context_length,
        "weights_bytes_by_quant": {q: size.weights_bytes_as(q) for q in BITS_PER_WEIGHT},
        "kv_bytes_per_token": {k: size.kv_bytes_per_token(k) for k in KV_BYTES_PER_VALUE},
        "budgets": [
            {"memory_bytes": m,
             "kv": {k: {"tokens": (t := context_that_fits(size, m, k)), "users_at_context": t // ctx}
                    for k in KV_BYTES_PER_VALUE}}
            for m in budgets
        ],
    }
