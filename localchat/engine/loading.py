"""Wiring a LoadPlan: the executor for a model file, the draft source, and the runtime over
them. Executors load on the compute thread, where they will run."""

from __future__ import annotations

from localchat.engine.choice import LoadPlan
from localchat.engine.config import EngineConfig
from localchat.engine.runtime.compute_thread import COMPUTE
from localchat.engine.runtime.engine import RuntimeEngine
from localchat.errors import ConfigError
from localchat.models.facts import GGUFFacts


def load_executor(facts: GGUFFacts, engine: str, plan: LoadPlan, config: EngineConfig, *,
                  draft: bool = False, flash_attn: bool = True):
    """facts' executor ("torch" or "llama.cpp") with the plan's context and threads;
    draft: it drafts for another model (on torch it then takes the default KV memory and runs
    eagerly but for its generated tokens' AOTInductor layers: torch.compile's graphs beside
    the target's would slow both, Dynamo checking every cached graph)."""
    if engine == "torch":
        from localchat.engine.executors.torch.executor import TorchExecutor

        return COMPUTE.call(lambda: TorchExecutor(
            facts, n_ctx=plan.ctx_size, threads=plan.threads,
            kv_memory=None if draft else config.kv_memory, device=config.device,
            compiled=False if draft else None, ahead_of_time=True if draft else None))
    from localchat.engine.executors.llamacpp import LlamaCppExecutor

    return COMPUTE.call(lambda: LlamaCppExecutor(
        facts, n_ctx=plan.ctx_size, threads=plan.threads, parallel=config.parallel,
        gpu_layers=0 if config.device == "cpu" else config.gpu_layers,
        cache_types=config.cache_types, exact_batching=config.exact_batching,
        flash_attn=flash_attn))


def kv_store(config: EngineConfig):
    """The KV snapshot store config.kv_disk asks for (None: 0 bytes, snapshots off)."""
    from localchat.storage.kv_snapshots import DEFAULT_BUDGET, KVSnapshotStore

    budget = DEFAULT_BUDGET if config.kv_disk is None else config.kv_disk
    return KVSnapshotStore(budget=budget) if budget > 0 else None


def load_runtime(plan: LoadPlan, config: EngineConfig, *,
                 flash_attn: bool = True) -> RuntimeEngine:
    """The runtime over the plan's executor and its draft (prompt lookup or a draft model
    on the same executor); flash_attn: the llama.cpp executor's."""
    from localchat.engine.runtime.speculative.drafts import LookupThenModel, ModelDraft, NgramDraft

    executor = load_executor(plan.facts, plan.engine, plan, config, flash_attn=flash_attn)
    source, draft = None, plan.draft
    try:
        if draft is not None and draft.auto and not executor.supports_rollback:
            draft = None  # drafts need the KV cut back after a rejection
        if draft is not None and draft.facts is None:
            source = NgramDraft()
        elif draft is not None:
            if not executor.supports_rollback:
                raise ConfigError("draft", f"cannot be used with {plan.facts.name}: it keeps a "
                                           "recurrent state that cannot be rolled back to "
                                           "verify drafts")
            source = ModelDraft(load_executor(draft.facts, plan.engine, plan, config,
                                              draft=True, flash_attn=flash_attn),
                                draft.facts.name)
            if draft.auto:  # a kept distilled draft: lookup first where the text repeats
                source = LookupThenModel(NgramDraft(), source)
        if source is not None:
            source.auto = draft.auto
        return RuntimeEngine(executor, plan.facts, draft=source,
                             num_draft_tokens=config.num_draft_tokens,
                             kv_store=kv_store(config), adapt_threads=plan.threads is None)
    except BaseException:
        if source is not None:
            COMPUTE.call(source.close)
        COMPUTE.call(executor.close)
        raise
