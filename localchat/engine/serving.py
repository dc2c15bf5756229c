"""What `serve` runs when its flags do not say: the executor that serves the model file
faster, and enough llama.cpp KV slots for the requests it admits. serving_config() fills
only the settings left at None, and says what it chose and why."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from localchat.cpu_features import has_avx2
from localchat.engine.choice import TORCH_ARCHITECTURES, choose_executor
from localchat.engine.config import EngineConfig
from localchat.models.facts import GGUFFacts, load_context

# File types whose every weight the torch executor computes with its own block kernels
# (q4q8.py: llama.cpp's x86 arithmetic) or as floats; other types (IQ*, TQ*) it can only
# dequantize, and llama.cpp runs them natively.
TORCH_NATIVE_TYPES = frozenset({
    "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L",
    "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "F16", "BF16", "F32"})
LLAMA_CPP_SETTINGS = ("cache_type_k", "cache_type_v", "gpu_layers")
SERVE_SLOTS = 16  # llama.cpp slots by default: llama-server -np 16's peer (docs/benchmarks.md)
SLOT_MEMORY_SHARE = 0.5  # of the memory available at start: the most default slots may take
SLOT_ROUND = 256  # llama.cpp sizes each slot in multiples of 256 cells (executors/llamacpp.py)


@dataclass(frozen=True)
class ServingChoice:
    config: EngineConfig  # with the engine and slots filled in
    why: str  # for the start-up line: why this engine (and slots)


def serving_config(config: EngineConfig, max_queue: int) -> ServingChoice:
    """config with serve's defaults where it leaves the engine or -np unset: the torch
    executor for Llama-family GGUF files of a type its kernels run (it batches many
    requests faster than llama.cpp's executor), else llama.cpp with min(max_queue, 16)
    slots (fewer where their KV would pass half the available memory)."""
    if config.endpoint is not None:
        return ServingChoice(config, "")
    from localchat.models.specs import resolve_model_facts

    facts = resolve_model_facts(config.model)
    why = "as asked"
    if config.engine is None:
        engine, why = serving_engine(config, facts)
        why = f"chosen: {why}"
        config = replace(config, engine=engine)
    if choose_executor(config, facts) == "llama.cpp" and config.parallel is None:
        slots = default_slots(config, facts, max_queue)
        config = replace(config, parallel=slots)
        why += f"; {slots} KV slots"
    return ServingChoice(config, why)


def serving_engine(config: EngineConfig, facts: GGUFFacts) -> tuple[str, str]:
    """The executor serve defaults to for this file, and why (one clause)."""
    if facts.path.is_dir():
        return "torch", "it runs Hugging Face directories"
    asked = [name for name in LLAMA_CPP_SETTINGS if getattr(config, name) is not None]
    if asked:
        return "llama.cpp", f"llama.cpp's own settings are given ({', '.join(asked)})"
    if config.device not in (None, "auto", "cpu"):
        return "torch", f"device {config.device} is the torch executor's"
    if facts.architecture not in TORCH_ARCHITECTURES:
        return "llama.cpp", f"the torch executor does not run {facts.architecture} models"
    if facts.quant_type not in TORCH_NATIVE_TYPES:
        return "llama.cpp", f"the torch executor has no kernel of its own for {facts.quant_type}"
    if not has_avx2():
        return "llama.cpp", "the torch executor's block kernels need an x86-64 CPU with AVX2"
    return "torch", (f"its kernels run {facts.quant_type} {facts.architecture} files and batch "
                     "requests faster than the llama.cpp executor")


def default_slots(config: EngineConfig, facts: GGUFFacts, max_queue: int) -> int:
    """min(max_queue, SERVE_SLOTS), fewer where each slot's context of KV would take the
    slots past SLOT_MEMORY_SHARE of the memory available now; at least 1."""
    from localchat.models.planner import chosen_cache_types, engine_kv_bytes_per_token
    from localchat.units import available_memory

    cells = math.ceil(load_context(config.ctx_size, facts.context_length) / SLOT_ROUND) * SLOT_ROUND
    types = chosen_cache_types(facts, config.cache_types, exact=config.exact_batching)
    slot_bytes = engine_kv_bytes_per_token(facts, "llama.cpp", types) * cells
    fitting = int(SLOT_MEMORY_SHARE * available_memory() // max(1, slot_bytes))
    return max(1, min(max_queue, SERVE_SLOTS, fitting))
