"""Engines behind one interface (base.py). choose() (choice.py) decides what an EngineConfig
(config.py) loads; load_engine() builds that plan; open_engine() does both. The UI and CLI
never import an engine's heavy dependencies themselves."""

from __future__ import annotations

from localchat.engine import choice
from localchat.engine.base import Engine
from localchat.engine.choice import LoadPlan
from localchat.engine.config import EngineConfig
from localchat.errors import EngineError, ModelFormatError


def choose(config: EngineConfig, say=None) -> LoadPlan:
    """choice.choose(), measuring both executors on the file where the default-engine rule
    has no figures for it yet (engine_probe.py; say(line) announces it, else stderr)."""
    def measure(facts, threads: int, engines: tuple[str, ...]):
        from localchat.engine.engine_probe import measure_engines

        return measure_engines(facts, threads, engines, say)

    return choice.choose(config, measure=measure)


def load_engine(plan: LoadPlan) -> Engine:
    """Build what the plan names: a remote engine (nothing loads), or the runtime over the
    plan's executor and draft."""
    if plan.engine == "remote":
        from localchat.engine.remote import RemoteEngine

        spec = plan.spec
        return RemoteEngine(spec.endpoint, model=spec.model, api_key=spec.api_key,
                            ctx_size=spec.ctx_size, timeout=spec.timeout)
    from localchat.engine.loading import load_runtime

    return load_runtime(plan)


def open_engine(config: EngineConfig, plan: LoadPlan | None = None, say=None) -> Engine:
    """choose() (unless the plan is given), then load_engine(), the engine saying why it was
    chosen; a file that validated but fails to load is forgotten (`models` stops listing it)."""
    plan = plan or choose(config, say)
    try:
        engine = load_engine(plan)
        engine.why = plan.why
        return engine
    except (EngineError, ModelFormatError):
        if plan.facts is not None:
            from localchat.models.specs import forget

            forget(plan.facts.path)
        raise
