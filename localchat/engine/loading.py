"""Wiring a LoadPlan: the executor for a model file (from its spec), the draft source, and
the runtime over them. Executors load on the compute thread, where they will run."""

from __future__ import annotations

from localchat.engine.choice import ExecutorSpec, LoadPlan, TorchSpec
from localchat.engine.runtime.compute_thread import COMPUTE
from localchat.engine.runtime.engine import RuntimeEngine
from localchat.errors import ConfigError
from localchat.models.facts import GGUFFacts


def load_executor(facts: GGUFFacts, spec: ExecutorSpec):
    """facts' executor, built from its spec whole, on the compute thread."""
    if isinstance(spec, TorchSpec):
        from localchat.engine.executors.torch.executor import TorchExecutor

        return COMPUTE.call(lambda: TorchExecutor(
            facts, n_ctx=spec.n_ctx, threads=spec.threads, kv_memory=spec.kv_memory,
            device=spec.device, compiled=spec.compiled, ahead_of_time=spec.ahead_of_time))
    from localchat.engine.executors.llamacpp import LlamaCppExecutor

    return COMPUTE.call(lambda: LlamaCppExecutor(
        facts, n_ctx=spec.n_ctx, threads=spec.threads, parallel=spec.parallel,
        gpu_layers=spec.gpu_layers, cache_types=spec.cache_types,
        exact_batching=spec.exact_batching, flash_attn=spec.flash_attn))


def kv_store(budget: int):
    """The KV snapshot store with this many bytes (None: 0 bytes, snapshots off)."""
    from localchat.storage.kv_snapshots import KVSnapshotStore

    return KVSnapshotStore(budget=budget) if budget > 0 else None


def load_runtime(plan: LoadPlan) -> RuntimeEngine:
    """The runtime over the plan's executor and its draft (prompt lookup or a draft model
    on the same executor)."""
    from localchat.engine.runtime.speculative.drafts import LookupThenModel, ModelDraft, NgramDraft

    executor = load_executor(plan.facts, plan.spec)
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
            source = ModelDraft(load_executor(draft.facts, draft.spec), draft.facts.name)
            if draft.auto:  # a kept distilled draft: lookup first where the text repeats
                source = LookupThenModel(NgramDraft(), source)
        if source is not None:
            source.auto = draft.auto
        return RuntimeEngine(executor, plan.facts, draft=source,
                             num_draft_tokens=draft.tokens if draft is not None else None,
                             kv_store=kv_store(plan.kv_disk), adapt_threads=plan.adapt_threads)
    except BaseException:
        if source is not None:
            COMPUTE.call(source.close)
        COMPUTE.call(executor.close)
        raise
