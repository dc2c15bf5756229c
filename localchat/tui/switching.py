"""EngineSwitcher (the app's `switcher`): changing what the engine runs with, live (F6
parameters, F7 model picker, F8 speculation, a reopened conversation's model). A new engine
loads in a worker while the chat goes on; one that fails to load leaves the old in place."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from functools import partial

from textual.actions import SkipAction
from textual.app import App
from textual.message import Message as TextualMessage

from localchat.engine import open_engine
from localchat.engine.base import Engine
from localchat.engine.config import DraftChoice, EngineConfig
from localchat.errors import LocalchatError
from localchat.tui.params import ParamsScreen, ParamValues
from localchat.tui.picker import Choice, ModelPickerScreen
from localchat.tui.widgets import GaugeBar, RateSparkline


def engine_label(config: EngineConfig) -> str:
    """model, ctx and draft, as the notices name them."""
    ctx = f", ctx {config.ctx_size}" if config.ctx_size else ""
    draft = f", draft {config.draft.label()}" if config.draft.enabled else ""
    return f"model {config.model}{ctx}{draft}"


class EngineSwitcher:
    """Sampling and max tokens apply to the next reply; a new model, context size or draft
    loads a new engine, which replaces the old one (then closed) once it is ready.
    `reloading` names what is loading now (None: nothing)."""

    @dataclass
    class Loaded(TextualMessage):
        """A worker loaded the engine for `config` (or failed to: error); the app
        hands it back to its switcher."""

        engine: Engine | None
        config: EngineConfig
        what: str
        error: str | None = None

    def __init__(self, app: App) -> None:
        self.app = app  # the ChatApp: its session, engine, config, params and notices
        self.reloading: str | None = None
        self.last_draft: DraftChoice | None = None  # for F8 to turn back on
        self.load_started = 0.0
        self.timer = None

    def _on_chat_screen(self) -> None:
        """F6, F7, F8 are priority bindings: over a dialog, let the key through."""
        if self.app.screen is not self.app.screen_stack[0]:
            raise SkipAction()

    # -- parameters ------------------------------------------------------------------

    def parameters(self) -> None:
        self._on_chat_screen()
        p, engine = self.app.session.params, self.app.session.engine
        n_ctx = engine.info.n_ctx if engine is not None else (self.app.session.config.ctx_size or 0)
        self.app.push_screen(ParamsScreen(p.sampling, p.max_tokens, n_ctx,
                                          note="Enter applies · Esc cancels"),
                             self._apply_params)

    def _apply_params(self, values: ParamValues | None) -> None:
        if values is None:
            return
        app = self.app
        app.session.set_params(replace(app.session.params, sampling=values.sampling,
                                       max_tokens=values.max_tokens))
        p = values.sampling
        app.info(f"next reply: temp {p.temperature}, top-k {p.top_k}, top-p {p.top_p}, "
                 f"min-p {p.min_p}, repeat {p.repeat_penalty}, max tokens "
                 f"{values.max_tokens or '–'}, seed {p.seed if p.seed is not None else '–'}")
        if values.ctx_size is not None:
            self.switch(replace(app.session.config, ctx_size=values.ctx_size),
                        f"context {values.ctx_size or 'of the model'}")

    # -- models and drafts -----------------------------------------------------------

    def pick_model(self) -> None:
        self._on_chat_screen()
        s, engine = self.app.session.config, self.app.session.engine
        if s.endpoint:  # the picker lists files here; a server knows its own models
            self.app.error(f"the model picker lists local files, but {s.endpoint} serves the "
                           "model: use /model NAME with a model it serves")
            return
        path = engine.info.path if engine is not None else None
        self.app.push_screen(ModelPickerScreen(
            s.model, s.draft.record(), s.ctx_size, path,
            engine.name if engine is not None else (s.engine or "llama.cpp"),
            s.parallel or kv_slots(engine)), self._picked)

    def _picked(self, choice: Choice | None) -> None:
        if choice is None:
            return
        kind, spec = choice
        s = self.app.session.config
        draft = DraftChoice.parse(spec)
        if kind == "model":
            self.use_model(spec)
        elif draft == s.draft:
            self.app.info(f"the draft is already {draft.label()}")
        else:
            if draft.enabled:  # the fixed γ asked for goes on with the new draft
                draft = replace(draft, tokens=s.draft.tokens)
            self.switch(replace(s, draft=draft),
                        f"draft {draft.label()}" if draft.enabled else "without a draft")

    def use_model(self, model: str) -> None:
        """The picker's or /model's choice (the model in use: only says so)."""
        if model == self.app.session.config.model:
            self.app.info(f"{model} is the model in use")
        else:
            self.switch(replace(self.app.session.config, model=model), model)

    def toggle_speculation(self) -> None:
        self._on_chat_screen()
        s = self.app.session.config
        if s.draft.enabled:
            self.last_draft = s.draft
            self.switch(s.without_draft(), "without a draft")
        else:
            draft = self.last_draft or DraftChoice("ngram")
            self.switch(replace(s, draft=draft), f"draft {draft.label()}")

    def follow(self, conv) -> None:
        """A reopened conversation goes on with the model, context size and draft it used:
        before the first load (--continue) they are what loads; later they load live;
        while a model is loading it only says so."""
        app = self.app
        wanted = app.session.stored_config(conv)
        if wanted == app.session.config:
            return
        if app.session.engine is None and not app.engine_requested:
            app.session.config = wanted
            return
        if app.session.engine is None or self.reloading is not None or app.generating:
            app.notice(f"this conversation used {engine_label(wanted)}; it continues with "
                       f"{engine_label(app.session.config)} (F7 or /model {wanted.model} switches)")
            return
        self.switch(wanted, f"{engine_label(wanted)} (this conversation's)")

    # -- reloading -------------------------------------------------------------------

    def switch(self, config: EngineConfig, what: str) -> bool:
        """Load an engine for config in a worker; it replaces the current one when ready."""
        app = self.app
        if app.generating:
            app.error("a reply is being generated (Esc stops it)")
            return False
        if self.reloading is not None or app.session.engine is None:
            app.error("the model is still loading")
            return False
        self.reloading = what
        self.load_started = time.monotonic()
        self._show_loading()
        self.timer = app.set_interval(0.5, self._show_loading)
        app.run_worker(partial(self._load, config, what), thread=True, exclusive=True,
                       group="load")
        return True

    def _show_loading(self) -> None:
        if self.reloading is not None:
            seconds = time.monotonic() - self.load_started
            self.app.query_one(GaugeBar).state = f"loading {self.reloading}… {seconds:.0f} s"

    def _load(self, config: EngineConfig, what: str) -> None:
        """In the worker thread."""
        old, owned = self.app.session.engine, self.app.owns_engine
        try:
            engine = open_engine(config, say=self.app.say_from_worker)
        except LocalchatError as exc:
            self.app.post_message(self.Loaded(None, config, what, str(exc)))
            return
        if owned and old is not None:
            old.close()  # nothing uses it: sending and controls wait while reloading
        self.app.post_message(self.Loaded(engine, config, what))

    def loaded(self, message: Loaded) -> None:
        app = self.app
        self.timer.stop()
        self.reloading = None
        gauges = app.query_one(GaugeBar)
        if message.error:
            gauges.state = "ready"
            app.error(f"could not load {message.what}: {message.error} (still using "
                      f"{app.session.config.model})")
            return
        s = message.config
        app.session.use_engine(message.engine, s)
        app.owns_engine = True
        gauges.stats = None
        app.query_one(RateSparkline).reset()
        app.show_engine()
        gauges.state = "ready"
        app.info(f"loaded {message.what}: ctx {app.session.engine.info.n_ctx}, draft "
                 f"{s.draft.label()}")
        app.say_engine_choice()


def kv_slots(engine) -> int:
    """The contexts a loaded llama.cpp engine keeps KV for (its --parallel slots, as its
    gauge's capacity counts them); 1 for any other engine."""
    if engine is None or engine.name != "llama.cpp":
        return 1
    info = engine.info
    return max(1, engine.memory()["kv_cache_capacity_bytes"] // (info.n_ctx * info.kv_bytes_per_token))
