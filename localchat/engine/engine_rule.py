"""The default executor, one rule for run, the chat and serve: where only one executor can run
the file with the settings given, that one; where both can, $LOCALCHAT_ENGINE's, else the one
this machine measured faster on this file (engine_probe.py the first time, engine_figures.py
keeps it) for the use: a one-shot reply (its start included), a chat reply (a tenth of the
start), or many streams at once."""

from __future__ import annotations

import importlib.util
import math
import os

from localchat.cpu_features import has_avx2
from localchat.engine.config import ENGINE_ENV, EngineConfig
from localchat.errors import ConfigError
from localchat.models.facts import GGUFFacts, load_context

# The torch executor's Llama-family architectures (executors/torch/weights.py checks the
# same list when it loads).
TORCH_ARCHITECTURES = ("llama", "qwen2")
# File types whose every weight the torch executor computes with its own block kernels
# (q4q8.py: llama.cpp's x86 arithmetic) or as floats; other types (IQ*, TQ*) it can only
# dequantize, and llama.cpp runs them natively.
TORCH_NATIVE_TYPES = frozenset({
    "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L",
    "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "F16", "BF16", "F32"})
LLAMA_CPP_SETTINGS = ("cache_type_k", "cache_type_v", "gpu_layers")
# A typical reply, for the one-stream uses: this prompt prefilled and this many tokens out.
REPLY_PROMPT_TOKENS = 128
REPLY_TOKENS = 128
CHAT_REPLIES = 10  # a chat's start is shared by this many replies (a one-shot's by one)
TORCH_MARGIN = 1.05  # torch must be this much faster: a tie goes to llama.cpp's quicker start
SERVE_SLOTS = 16  # llama.cpp slots for many streams: llama-server -np 16's peer
SLOT_MEMORY_SHARE = 0.5  # of the memory available at start: the most default slots may take
SLOT_ROUND = 256  # llama.cpp sizes each slot in multiples of 256 cells (executors/llamacpp.py)


def preferred_engine() -> str | None:
    """$LOCALCHAT_ENGINE: the executor to use where both run a file; None (or auto): the
    measured one."""
    engine = os.environ.get(ENGINE_ENV) or None
    if engine not in (None, "auto", "llama.cpp", "torch"):
        raise ConfigError("engine", f"${ENGINE_ENV} must be llama.cpp, torch or auto, "
                                    f"got {engine!r}")
    return None if engine == "auto" else engine


def only_executor(config: EngineConfig, facts: GGUFFacts) -> tuple[str | None, str]:
    """The one executor that can run this file with these settings, and why; (None, '')
    where both can."""
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
    if importlib.util.find_spec("torch") is None:  # found, not imported (a second's start)
        return "llama.cpp", "torch is not installed"
    return None, ""


def default_engine(config: EngineConfig, facts: GGUFFacts, threads: int,
                   measure=None) -> tuple[str, str]:
    """The rule's executor for this file and use, and why (one clause): the only one that
    runs it, else $LOCALCHAT_ENGINE's, else the faster by the kept figures, or by what
    measure(facts, threads, engines) measures the first time (engine_probe.py); without
    either, llama.cpp."""
    only, why = only_executor(config, facts)
    if only is not None:
        return only, why
    preferred = preferred_engine()
    if preferred is not None:
        return preferred, f"${ENGINE_ENV}"
    from localchat.engine import engine_figures

    engines = ("llama.cpp", "torch")
    figures = engine_figures.cached(facts, threads, engines)
    if figures is None and measure is None:
        return "llama.cpp", "not measured here yet"
    figures = figures or measure(facts, threads, engines)
    return faster(figures["llama.cpp"], figures["torch"], config.use)


def faster(llama, torch, use: str) -> tuple[str, str]:
    """The executor whose figures (engine_figures.Figures) are better for the use, and why;
    torch only where it is TORCH_MARGIN better (a tie goes to llama.cpp's quicker start)."""
    if llama.failed and torch.failed:  # llama.cpp then says what is wrong with the file
        return "llama.cpp", f"both failed to load it here ({llama.failed})"
    if llama.failed or torch.failed:
        name, failed = ("torch", llama) if llama.failed else ("llama.cpp", torch)
        other = "llama.cpp" if name == "torch" else "torch"
        return name, f"{other} failed to load it here ({failed.failed})"
    if use == "many":
        what, unit = "many streams at once", "tok/s"
        values = {"llama.cpp": llama.many_tok_s, "torch": torch.many_tok_s}
        ratio = torch.many_tok_s / llama.many_tok_s
    else:
        share = 1.0 if use == "one-shot" else 1.0 / CHAT_REPLIES
        what, unit = ("a one-shot reply, start included" if use == "one-shot" else
                      f"a chat reply, 1/{CHAT_REPLIES} of the start included"), "s"
        values = {"llama.cpp": reply_seconds(llama, share), "torch": reply_seconds(torch, share)}
        ratio = values["llama.cpp"] / values["torch"]
    name = "torch" if ratio >= TORCH_MARGIN else "llama.cpp"
    other = "llama.cpp" if name == "torch" else "torch"
    digits = 0 if unit == "tok/s" else 2
    return name, (f"measured here for {what}: {name} {values[name]:.{digits}f} {unit}, "
                  f"{other} {values[other]:.{digits}f} {unit}")


def reply_seconds(figures, start_share: float) -> float:
    """A typical reply's time on these figures (REPLY_PROMPT_TOKENS in, REPLY_TOKENS out),
    with this share of the start."""
    seconds = REPLY_PROMPT_TOKENS / figures.prefill_tok_s + REPLY_TOKENS / figures.decode_tok_s
    return seconds + start_share * figures.start_s


def serve_slots(config: EngineConfig, facts: GGUFFacts) -> int:
    """llama.cpp's KV slots for many streams: SERVE_SLOTS, fewer where each slot's context of
    KV would take the slots past SLOT_MEMORY_SHARE of the memory available now; at least 1."""
    from localchat.models.planner import chosen_cache_types, engine_kv_bytes_per_token
    from localchat.units import available_memory

    cells = math.ceil(load_context(config.ctx_size, facts.context_length) / SLOT_ROUND) * SLOT_ROUND
    types = chosen_cache_types(facts, config.cache_types, exact=config.exact_batching)
    slot_bytes = engine_kv_bytes_per_token(facts, "llama.cpp", types) * cells
    fitting = int(SLOT_MEMORY_SHARE * available_memory() // max(1, slot_bytes))
    return max(1, min(SERVE_SLOTS, fitting))
