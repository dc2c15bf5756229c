"""Wiring: the executor for a model file, the draft source, and the runtime over them.
Executors load on the compute thread, where they will run."""

from __future__ import annotations

from localchat.engine.runtime.compute_thread import COMPUTE
from localchat.engine.runtime.engine import RuntimeEngine
from localchat.models.facts import GGUFFacts


def load_executor(facts: GGUFFacts, engine: str, *, n_ctx: int, threads: int | None,
                  kv_memory: int | None, device: str | None, parallel: int | None,
                  gpu_layers: int | None = None,
                  cache_types: tuple[str | None, str | None] = (None, None),
                  flash_attn: bool = True, draft: bool = False):
    """draft: it drafts for another model (on torch it then runs eagerly: its compiled
    graphs beside the target's would slow both, as Dynamo checks every cached graph)."""
    if engine == "torch":
        from localchat.engine.executors.torch.executor import TorchExecutor

        return COMPUTE.call(lambda: TorchExecutor(facts, n_ctx=n_ctx, threads=threads,
                                                  kv_memory=kv_memory, device=device,
                                                  compiled=False if draft else None))
    from localchat.engine.executors.llamacpp import LlamaCppExecutor

    return COMPUTE.call(lambda: LlamaCppExecutor(
        facts, n_ctx=n_ctx, threads=threads, parallel=parallel,
        gpu_layers=0 if device == "cpu" else gpu_layers, cache_types=cache_types,
        flash_attn=flash_attn))


def load_runtime(facts: GGUFFacts, engine: str, *, n_ctx: int, threads: int | None,
                 kv_memory: int | None, device: str | None, parallel: int | None,
                 draft: GGUFFacts | str | None, num_draft_tokens: int | None,
                 gpu_layers: int | None = None, auto_draft: bool = False,
                 cache_types: tuple[str | None, str | None] = (None, None),
                 flash_attn: bool = True) -> RuntimeEngine:
    """draft: a draft model's facts (vocabulary already checked), "ngram" or None;
    auto_draft: the draft was chosen for the user (dropped where it cannot work, skipped
    for seeded requests);
    gpu_layers, cache_types, flash_attn: the llama.cpp executor's (LlamaCppExecutor)."""
    from localchat.engine.runtime.speculative.drafts import LookupThenModel, ModelDraft, NgramDraft

    options = dict(n_ctx=n_ctx, threads=threads, kv_memory=kv_memory, device=device,
                   parallel=parallel, gpu_layers=gpu_layers, cache_types=cache_types,
                   flash_attn=flash_attn)
    executor = load_executor(facts, engine, **options)
    source = None
    try:
        if auto_draft and not executor.supports_rollback:
            draft = None  # drafts need the KV cut back after a rejection
        if draft == "ngram":
            source = NgramDraft()
        elif draft is not None:
            if not executor.supports_rollback:
                from localchat.errors import UsageError

                raise UsageError(f"{facts.name} keeps a recurrent state that cannot be rolled "
                                 "back, so it cannot verify drafts: run it without a draft")
            source = ModelDraft(load_executor(draft, engine, **{**options, "kv_memory": None},
                                              draft=True), draft.name)
            if auto_draft:  # a kept distilled draft: lookup first where the text repeats
                source = LookupThenModel(NgramDraft(), source)
        if source is not None:
            source.auto = auto_draft
        return RuntimeEngine(executor, facts, draft=source, num_draft_tokens=num_draft_tokens)
    except BaseException:
        if source is not None:
            COMPUTE.call(source.close)
        COMPUTE.call(executor.close)
        raise
