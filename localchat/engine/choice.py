"""Choose before building: choose(config) resolves the model, the executor, the context, the
draft and the chat template into a LoadPlan, with every check that needs no model loaded.
load_engine() then only builds what the plan names."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from localchat.engine.config import DraftChoice, EngineConfig
from localchat.errors import ConfigError
from localchat.models.facts import MIN_CTX, GGUFFacts, load_context

# The torch executor's Llama-family architectures (executors/torch/weights.py checks the
# same list when it loads; "auto" picks torch for these).
TORCH_ARCHITECTURES = ("llama", "qwen2")


@dataclass(frozen=True)
class DraftPlan:
    """What drafts tokens: prompt lookup (facts None) or a draft model with the target's
    vocabulary; auto: chosen for the user (dropped where it cannot work)."""

    facts: GGUFFacts | None = None
    auto: bool = False

    @property
    def source(self) -> str:
        return "ngram" if self.facts is None else self.facts.name


@dataclass(frozen=True)
class LoadPlan:
    """What load_engine() builds: facts (with the chat template prompts render with), the
    executor, the context and threads it runs with, the draft; notes for the user."""

    facts: GGUFFacts | None  # None: a remote endpoint, nothing loads here
    engine: str  # "llama.cpp", "torch" or "remote"
    ctx_size: int | None
    threads: int | None
    draft: DraftPlan | None = None
    notes: tuple[str, ...] = ()


def choose(config: EngineConfig) -> LoadPlan:
    """The LoadPlan for config: every check that needs no model loaded, in one place."""
    if config.endpoint is not None:
        return LoadPlan(None, "remote", config.ctx_size, config.threads)
    from localchat.models.specs import resolve_model_facts

    facts = with_chat_template(resolve_model_facts(config.model), config.chat_template)
    engine = choose_executor(config, facts)
    ctx_size = load_context(config.ctx_size, facts.context_length)
    if ctx_size < MIN_CTX:
        raise ConfigError("ctx_size", f"must be at least {MIN_CTX} tokens, got {ctx_size}")
    if facts.context_length and ctx_size > facts.context_length:
        raise ConfigError("ctx_size", f"{ctx_size} is more than {facts.name}'s trained context "
                                      f"of {facts.context_length} tokens (0 uses all of it)")
    threads, notes = capped_threads(config.threads)
    return LoadPlan(facts, engine, ctx_size, threads, choose_draft(config.draft, facts), notes)


def choose_executor(config: EngineConfig, facts: GGUFFacts) -> str:
    """The executor for this file: as configured, else by the file (a Hugging Face
    directory on torch, a GGUF on llama.cpp); 'auto': torch where it runs the architecture."""
    hf_directory = facts.path.is_dir()
    engine = config.engine
    if engine is None:
        engine = "torch" if hf_directory else "llama.cpp"
    elif engine == "auto":
        engine = "torch" if hf_directory or facts.architecture in TORCH_ARCHITECTURES \
            else "llama.cpp"
    if hf_directory and engine == "llama.cpp":
        raise ConfigError("engine", f"llama.cpp needs a GGUF file, and {facts.path.name} is a "
                                    "Hugging Face directory: use the torch engine")
    if engine == "torch":
        for name in ("cache_type_k", "cache_type_v", "gpu_layers"):
            if getattr(config, name) is not None:
                raise ConfigError(name, "is for the llama.cpp engine; the torch engine keeps "
                                        "its float16 KV cache and whole model on its device")
    elif config.device not in (None, "auto", "cpu"):
        raise ConfigError("device", f"{config.device} is for the torch engine; the llama.cpp "
                                    "engine offloads to the GPU its build supports (or cpu "
                                    "for none)")
    return engine


def capped_threads(threads: int | None) -> tuple[int | None, tuple[str, ...]]:
    """More threads than CPUs only slows a model down: at most the CPU count, said once."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if threads is not None and cpus and threads > cpus:
        return cpus, (f"threads capped at {cpus}, the CPUs this process may use "
                      f"(asked for {threads})",)
    return threads, ()


def choose_draft(draft: DraftChoice, facts: GGUFFacts) -> DraftPlan | None:
    """auto: the distilled draft kept for this model, else its family's paired draft where
    that is on disk (and shares the vocabulary), else prompt lookup; a draft model must
    share the target's vocabulary."""
    from localchat.models.drafts import kept_draft

    if draft.kind == "none":
        return None
    if draft.kind == "ngram":
        return DraftPlan()
    from localchat.models.vocab_match import check_same_vocabulary

    if draft.kind == "auto":
        kept = None if facts.path.is_dir() else kept_draft(facts)
        if kept is None:
            return DraftPlan(paired_draft_for(facts), auto=True)
        draft = DraftChoice("model", str(kept))
        auto = True
    else:
        auto = False
    from localchat.models.specs import resolve_model_facts

    draft_facts = resolve_model_facts(draft.spec)
    if facts.path.is_dir() or draft_facts.path.is_dir():
        raise ConfigError("draft", "cannot draft for or with a Hugging Face directory yet: use "
                                   "GGUF files for the model and the draft")
    check_same_vocabulary(facts.path, draft_facts.path, draft_facts.name)
    return DraftPlan(draft_facts, auto=auto)


def paired_draft_for(facts: GGUFFacts) -> GGUFFacts | None:
    """The family's paired draft (models/draft_pairs.py) if it is on disk, is another file
    and shares the vocabulary; None otherwise (auto then looks up the prompt instead)."""
    from localchat.models.draft_pairs import paired_draft_on_disk
    from localchat.models.vocab_match import check_same_vocabulary

    if facts.path.is_dir():
        return None
    paired = paired_draft_on_disk(facts)
    if paired is None or paired.path.resolve() == facts.path.resolve():
        return None
    try:
        check_same_vocabulary(facts.path, paired.path, paired.name)
    except ConfigError:
        return None
    return paired


def with_chat_template(facts: GGUFFacts, override: str | None) -> GGUFFacts:
    """The facts with the chat template prompts render with (prompt/builtin_templates.py)."""
    from localchat.prompt.builtin_templates import choose_template

    chosen = choose_template(facts.chat_template, facts.architecture, facts.chat_markers,
                             override)
    return replace(facts, chat_template=chosen.source, chat_template_name=chosen.name,
                   base_model=not facts.chat_template and not facts.chat_markers)
