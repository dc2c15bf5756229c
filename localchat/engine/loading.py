"""Wiring a LoadPlan: the executor for a model file (from its spec), the draft source, and
the runtime over them. Executors load on the compute thread, where they will run, started
before the runtime's own imports, which then overlap the file's load."""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING

from localchat.engine.choice import ExecutorSpec, LoadPlan, TorchSpec
from localchat.engine.runtime.compute_thread import COMPUTE
from localchat.errors import ConfigError
from localchat.models.facts import GGUFFacts

if TYPE_CHECKING:
    from localchat.engine.runtime.engine import RuntimeEngine


def start_executor(facts: GGUFFacts, spec: ExecutorSpec) -> Future:
    """facts' executor, built from its spec whole on the compute thread (its module's
    imports too), started now; its future."""
    def build():
        if isinstance(spec, TorchSpec):
            from localchat.engine.executors.torch.executor import TorchExecutor

            return TorchExecutor(
                facts, n_ctx=spec.n_ctx, threads=spec.threads, kv_memory=spec.kv_memory,
                device=spec.device, compiled=spec.compiled, ahead_of_time=spec.ahead_of_time)
        from localchat.engine.executors.llamacpp import LlamaCppExecutor

        return LlamaCppExecutor(
            facts, n_ctx=spec.n_ctx, threads=spec.threads, parallel=spec.parallel,
            gpu_layers=spec.gpu_layers, cache_types=spec.cache_types,
            exact_batching=spec.exact_batching, flash_attn=spec.flash_attn)

    return COMPUTE.submit(build)


def load_executor(facts: GGUFFacts, spec: ExecutorSpec):
    """facts' executor, built from its spec whole, on the compute thread."""
    return start_executor(facts, spec).result()


def kv_store(budget: int):
    """The KV snapshot store with this many bytes (None: 0 bytes, snapshots off)."""
    from localchat.storage.kv_snapshots import KVSnapshotStore

    return KVSnapshotStore(budget=budget) if budget > 0 else None


def load_runtime(plan: LoadPlan) -> RuntimeEngine:
    """The runtime over the plan's executor and its draft (prompt lookup or a draft model
    on the same executor)."""
    loading = start_executor(plan.facts, plan.spec)
    from localchat.engine.runtime.engine import RuntimeEngine  # while the file loads
    from localchat.engine.runtime.speculative.drafts import LookupThenModel, ModelDraft, NgramDraft

    executor = loading.result()
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
