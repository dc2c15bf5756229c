"""EngineSwitcher (the app's `switcher`): changing what the engine runs with, live (F6
parameters, F7 model picker, F8 speculation, a reopened conversation's model). A new engine
loads in a worker while the chat goes on; one that fails to load leaves the old in place."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from textual.actions import SkipAction
from textual.app import App
from textual.message import Message as TextualMessage

from localchat.engine.base import Engine
from localchat.errors import LocalchatError
from localchat.settings import ChatSettings
from localchat.tui.params import ParamsScreen, ParamValues
from localchat.tui.picker import Choice, ModelPickerScreen
from localchat.tui.widgets import GaugeBar, RateSparkline


def draft_label(draft: str | None) -> str:
    if draft is None:
        return "off"
    return draft if draft == "ngram" or ":" in draft else Path(draft).name


def conversation_engine_settings(settings: ChatSettings, conv) -> ChatSettings:
    """`settings` with the model, context size and draft a stored conversation ran with
    (values a damaged record holds are ignored)."""
    params = conv.params
    ctx_size = params.get("ctx_size", settings.ctx_size)
    if not isinstance(ctx_size, int) or ctx_size < 16:
        ctx_size = settings.ctx_size
    draft, n_draft = params.get("draft"), params.get("num_draft_tokens")
    if not isinstance(draft, str) or not draft:  # ran without one: the flags' draft stays
        draft, n_draft = settings.draft, settings.num_draft_tokens
    if not isinstance(n_draft, int) or not 1 <= n_draft <= 32:
        n_draft = None
    return replace(settings, model=conv.model or settings.model, ctx_size=ctx_size,
                   draft=draft, num_draft_tokens=n_draft)


def engine_label(settings: ChatSettings) -> str:
    """model, ctx and draft, as the notices name them."""
    ctx = f", ctx {settings.ctx_size}" if settings.ctx_size else ""
    draft = f", draft {settings.draft}" if settings.draft else ""
    return f"model {settings.model}{ctx}{draft}"


class EngineSwitcher:
    """Sampling and max tokens apply to the next reply; a new model, context size or draft
    loads a new engine, which replaces the old one (then closed) once it is ready.
    `reloading` names what is loading now (None: nothing)."""

    @dataclass
    class Loaded(TextualMessage):
        """A worker loaded the engine for `settings` (or failed to: error); the app
        hands it back to its switcher."""

        engine: Engine | None
        settings: ChatSettings
        what: str
        error: str | None = None

    def __init__(self, app: App) -> None:
        self.app = app  # the ChatApp: its session, engine, settings and notices
        self.reloading: str | None = None
        self.last_draft: tuple[str, int | None] | None = None  # for F8 to turn back on
        self.load_started = 0.0
        self.timer = None

    def _on_chat_screen(self) -> None:
        """F6, F7, F8 are priority bindings: over a dialog, let the key through."""
        if self.app.screen is not self.app.screen_stack[0]:
            raise SkipAction()

    # -- parameters ------------------------------------------------------------------

    def parameters(self) -> None:
        self._on_chat_screen()
        s, engine = self.app.settings, self.app.engine
        n_ctx = engine.info.n_ctx if engine is not None else (s.ctx_size or 0)
        self.app.push_screen(ParamsScreen(s.sampling, s.max_tokens, n_ctx,
                                          note="Enter applies · Esc cancels"),
                             self._apply_params)

    def _apply_params(self, values: ParamValues | None) -> None:
        if values is None:
            return
        app = self.app
        app.settings = replace(app.settings, sampling=values.sampling,
                               max_tokens=values.max_tokens)
        app.session.save_settings()
        p = values.sampling
        app.info(f"next reply: temp {p.temperature}, top-k {p.top_k}, top-p {p.top_p}, "
                 f"min-p {p.min_p}, repeat {p.repeat_penalty}, max tokens "
                 f"{values.max_tokens or '–'}, seed {p.seed if p.seed is not None else '–'}")
        if values.ctx_size is not None:
            self.switch(replace(app.settings, ctx_size=values.ctx_size),
                        f"context {values.ctx_size or 'of the model'}")

    # -- models and drafts -----------------------------------------------------------

    def pick_model(self) -> None:
        self._on_chat_screen()
        s, engine = self.app.settings, self.app.engine
        if s.endpoint:  # the picker lists files here; a server knows its own models
            self.app.error(f"the model picker lists local files, but {s.endpoint} serves the "
                           "model: use /model NAME with a model it serves")
            return
        path = engine.info.path if engine is not None else None
        self.app.push_screen(ModelPickerScreen(s.model, s.draft, s.ctx_size, path, s.engine,
                                               s.parallel or kv_slots(engine)), self._picked)

    def _picked(self, choice: Choice | None) -> None:
        if choice is None:
            return
        kind, spec = choice
        s = self.app.settings
        if kind == "model":
            self.use_model(spec)
        elif spec == s.draft:
            self.app.info(f"the draft is already {draft_label(spec)}")
        else:
            self.switch(s.with_draft(spec, s.num_draft_tokens if spec else None),
                        f"draft {draft_label(spec)}" if spec else "without a draft")

    def use_model(self, model: str) -> None:
        """The picker's or /model's choice (the model in use: only says so)."""
        if model == self.app.settings.model:
            self.app.info(f"{model} is the model in use")
        else:
            self.switch(replace(self.app.settings, model=model), model)

    def toggle_speculation(self) -> None:
        self._on_chat_screen()
        s = self.app.settings
        if s.draft:
            self.last_draft = (s.draft, s.num_draft_tokens)
            self.switch(s.with_draft(None, None), "without a draft")
        else:
            draft, n = self.last_draft or ("ngram", None)
            self.switch(s.with_draft(draft, n), f"draft {draft_label(draft)}")

    def follow(self, conv) -> None:
        """A reopened conversation goes on with the model, context size and draft it used:
        before the first load (--continue) they are what loads; later they load live;
        while a model is loading it only says so."""
        app = self.app
        wanted = conversation_engine_settings(app.settings, conv)
        if wanted == app.settings:
            return
        if app.engine is None and not app.engine_requested:
            app.settings = wanted
            return
        if app.engine is None or self.reloading is not None or app.generating:
            app.notice(f"this conversation used {engine_label(wanted)}; it continues with "
                       f"{engine_label(app.settings)} (F7 or /model {wanted.model} switches)")
            return
        self.switch(wanted, f"{engine_label(wanted)} (this conversation's)")

    # -- reloading -------------------------------------------------------------------

    def switch(self, settings: ChatSettings, what: str) -> bool:
        """Load an engine for settings in a worker; it replaces the current one when ready."""
        app = self.app
        if app.generating:
            app.error("a reply is being generated (Esc stops it)")
            return False
        if self.reloading is not None or app.engine is None:
            app.error("the model is still loading")
            return False
        self.reloading = what
        self.load_started = time.monotonic()
        self._show_loading()
        self.timer = app.set_interval(0.5, self._show_loading)
        app.run_worker(partial(self._load, settings, what), thread=True, exclusive=True,
                       group="load")
        return True

    def _show_loading(self) -> None:
        if self.reloading is not None:
            seconds = time.monotonic() - self.load_started
            self.app.query_one(GaugeBar).state = f"loading {self.reloading}… {seconds:.0f} s"

    def _load(self, settings: ChatSettings, what: str) -> None:
        """In the worker thread."""
        old, owned = self.app.engine, self.app.owns_engine
        try:
            engine = settings.load_engine()
        except LocalchatError as exc:
            self.app.post_message(self.Loaded(None, settings, what, str(exc)))
            return
        if owned and old is not None:
            old.close()  # nothing uses it: sending and controls wait while reloading
        self.app.post_message(self.Loaded(engine, settings, what))

    def loaded(self, message: Loaded) -> None:
        app = self.app
        self.timer.stop()
        self.reloading = None
        gauges = app.query_one(GaugeBar)
        if message.error:
            gauges.state = "ready"
            app.error(f"could not load {message.what}: {message.error} (still using "
                      f"{app.settings.model})")
            return
        s = message.settings
        app.session.use_engine(message.engine, s)
        app.owns_engine = True
        gauges.stats = None
        app.query_one(RateSparkline).reset()
        app.show_engine()
        gauges.state = "ready"
        app.info(f"loaded {message.what}: ctx {app.engine.info.n_ctx}, draft "
                 f"{draft_label(s.draft)}")


def kv_slots(engine) -> int:
    """The contexts a loaded llama.cpp engine keeps KV for (its --parallel slots, as its
    gauge's capacity counts them); 1 for any other engine."""
    if engine is None or engine.name != "llama.cpp":
        return 1
    info = engine.info
    return max(1, engine.memory()["kv_cache_capacity_bytes"] // (info.n_ctx * info.kv_bytes_per_token))
