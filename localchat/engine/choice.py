"""Choose before building: choose(config) resolves the model, the executor, the context, the
threads, the draft, the chat template and every executor setting into a LoadPlan (one spec
per executor), with every check that needs no model loaded. load_engine(plan) then only
builds what the plan names; no executor resolves a default of its own."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from localchat.engine.config import DraftChoice, EngineConfig
from localchat.engine.engine_rule import default_engine, serve_slots
from localchat.errors import ConfigError
from localchat.models.facts import MIN_CTX, GGUFFacts, load_context

DEFAULT_PARALLEL = 4  # llama.cpp's KV slots when nothing asks (run: 1, the chat: 2)


@dataclass(frozen=True)
class LlamaCppSpec:
    """Everything the llama.cpp executor is built with. gpu_layers None: all where the
    build offloads; cache_types None: its default pair (exact_batching's where asked)."""

    n_ctx: int
    threads: int
    parallel: int = DEFAULT_PARALLEL
    gpu_layers: int | None = None
    cache_types: tuple[str | None, str | None] = (None, None)
    exact_batching: bool = False
    flash_attn: bool = True


@dataclass(frozen=True)
class TorchSpec:
    """Everything the torch executor is built with. kv_memory None: 10 % of available
    memory; a draft's executor runs eagerly but for its ahead-of-time layers."""

    n_ctx: int
    threads: int
    kv_memory: int | None = None
    device: str | None = None
    compiled: bool | None = None
    ahead_of_time: bool | None = None


@dataclass(frozen=True)
class RemoteSpec:
    """An OpenAI-compatible server: nothing loads here."""

    endpoint: str
    model: str | None
    api_key: str | None = None
    ctx_size: int | None = None
    timeout: float | None = None


ExecutorSpec = LlamaCppSpec | TorchSpec


@dataclass(frozen=True)
class DraftPlan:
    """What drafts tokens: prompt lookup (facts None) or a draft model with the target's
    vocabulary, on the target's executor built by `spec`; auto: chosen for the user
    (dropped where it cannot work); tokens: a fixed γ, None: adaptive."""

    facts: GGUFFacts | None = None
    auto: bool = False
    spec: ExecutorSpec | None = None
    tokens: int | None = None

    @property
    def source(self) -> str:
        return "ngram" if self.facts is None else self.facts.name


@dataclass(frozen=True)
class LoadPlan:
    """What load_engine() builds: facts (with the chat template prompts render with), the
    executor and its spec, the draft, the KV snapshot budget, whether threads adapt to a
    busy machine (no -t given); notes for the user, and why this executor."""

    facts: GGUFFacts | None  # None: a remote endpoint, nothing loads here
    engine: str  # "llama.cpp", "torch" or "remote"
    spec: ExecutorSpec | RemoteSpec
    draft: DraftPlan | None = None
    kv_disk: int = 0  # bytes of KV snapshots kept on disk (0: none)
    adapt_threads: bool = False
    notes: tuple[str, ...] = ()
    why: str = ""  # why this engine: "as asked", or the rule's reason (engine_rule.py)

    @property
    def ctx_size(self) -> int | None:
        return self.spec.ctx_size if isinstance(self.spec, RemoteSpec) else self.spec.n_ctx

    @property
    def threads(self) -> int | None:
        return None if isinstance(self.spec, RemoteSpec) else self.spec.threads


def choose(config: EngineConfig, measure=None) -> LoadPlan:
    """The LoadPlan for config: every default resolved and every check that needs no model
    loaded, in one place; measure: the default-engine rule's probe where it has no figures
    yet (engine/__init__.py passes engine_probe's)."""
    if config.endpoint is not None:
        return LoadPlan(None, "remote", RemoteSpec(
            config.endpoint, None if config.model == "default" else config.model,
            config.api_key, config.ctx_size, config.timeout))
    from localchat.models.specs import resolve_model_facts

    facts = with_chat_template(resolve_model_facts(config.model), config.chat_template)
    threads, notes = capped_threads(config.threads)
    engine, why = choose_executor(config, facts, threads or default_threads(), measure)
    ctx_size = load_context(config.ctx_size, facts.context_length)
    if ctx_size < MIN_CTX:
        raise ConfigError("ctx_size", f"must be at least {MIN_CTX} tokens, got {ctx_size}")
    if facts.context_length and ctx_size > facts.context_length:
        raise ConfigError("ctx_size", f"{ctx_size} is more than {facts.name}'s trained context "
                                      f"of {facts.context_length} tokens (0 uses all of it)")
    spec = executor_spec(engine, config, facts, ctx_size, threads or default_threads())
    draft = choose_draft(config.draft, facts)
    if draft is not None and draft.facts is not None:
        draft = replace(draft, spec=draft_spec(spec))
    from localchat.storage.kv_snapshots import DEFAULT_BUDGET

    return LoadPlan(facts, engine, spec, draft,
                    DEFAULT_BUDGET if config.kv_disk is None else config.kv_disk,
                    adapt_threads=threads is None, notes=notes, why=why)


def executor_spec(engine: str, config: EngineConfig, facts: GGUFFacts, n_ctx: int,
                  threads: int) -> ExecutorSpec:
    """The executor's settings from config, its defaults filled in (llama.cpp's slots for
    many streams: engine_rule.serve_slots)."""
    if engine == "torch":
        return TorchSpec(n_ctx, threads, config.kv_memory, config.device)
    parallel = config.parallel or (serve_slots(config, facts) if config.use == "many"
                                   else DEFAULT_PARALLEL)
    return LlamaCppSpec(n_ctx, threads, parallel,
                        0 if config.device == "cpu" else config.gpu_layers, config.cache_types,
                        config.exact_batching, config.flash_attn)


def draft_spec(target: ExecutorSpec) -> ExecutorSpec:
    """A draft model's executor: the target's settings; on torch the default KV memory, run
    eagerly but for its generated tokens' AOTInductor layers (torch.compile's graphs beside
    the target's would slow both, Dynamo checking every cached graph)."""
    if isinstance(target, TorchSpec):
        return replace(target, kv_memory=None, compiled=False, ahead_of_time=True)
    return target


def default_threads() -> int:
    """Threads when none are asked for: every CPU this process may use."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, cpus or 1)


def choose_executor(config: EngineConfig, facts: GGUFFacts, threads: int,
                    measure=None) -> tuple[str, str]:
    """The executor for this file, and why: as asked, else (None or auto) the rule's
    (engine_rule.py); settings that are the other executor's are refused."""
    engine, why = (None if config.engine == "auto" else config.engine), "as asked"
    if engine is None:
        engine, why = default_engine(config, facts, threads, measure)
    if facts.path.is_dir() and engine == "llama.cpp":
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
    return engine, why


def capped_threads(threads: int | None) -> tuple[int | None, tuple[str, ...]]:
    """More threads than CPUs only slows a model down: at most the CPU count, said once."""
    cpus = default_threads()
    if threads is not None and threads > cpus:
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
        return DraftPlan(tokens=draft.tokens)
    from localchat.models.vocab_match import check_same_vocabulary

    if draft.kind == "auto":
        kept = None if facts.path.is_dir() else kept_draft(facts)
        if kept is None:
            return DraftPlan(paired_draft_for(facts), auto=True, tokens=draft.tokens)
        draft = DraftChoice("model", str(kept), draft.tokens)
        auto = True
    else:
        auto = False
    from localchat.models.specs import resolve_model_facts

    draft_facts = resolve_model_facts(draft.spec)
    if facts.path.is_dir() or draft_facts.path.is_dir():
        raise ConfigError("draft", "cannot draft for or with a Hugging Face directory yet: use "
                                   "GGUF files for the model and the draft")
    check_same_vocabulary(facts.path, draft_facts.path, draft_facts.name)
    return DraftPlan(draft_facts, auto=auto, tokens=draft.tokens)


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
