"""Changing what the engine runs with, live, mixed into ChatApp: the parameters panel
(F6), the model picker (F7) and speculation on/off (F8).

Sampling and max tokens apply to the next reply without a reload. A new model, context
size or draft needs a new engine: it loads in a worker thread (the UI keeps running
and the gauge bar counts the seconds), and only once it is ready does it replace the
old one, which is then closed. A load that fails leaves the old engine in place.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

from textual import work
from textual.actions import SkipAction
from textual.message import Message as TextualMessage

from localchat.engine.base import Engine
from localchat.errors import LocalchatError
from localchat.settings import ChatSettings
from localchat.tui.params import ParamsScreen, ParamValues
from localchat.tui.picker import Choice, ModelPickerScreen
from localchat.tui.widgets import GaugeBar, RateSparkline


@dataclass
class EngineSwitched(TextualMessage):
    """A worker loaded the engine for `settings` (or failed to: error)."""

    engine: Engine | None
    settings: ChatSettings
    what: str
    error: str | None = None


def draft_label(draft: str | None) -> str:
    if draft is None:
        return "off"
    return draft if draft == "ngram" or ":" in draft else Path(draft).name


class SwitchingMixin:
    """The engine side of ChatApp's controls (uses its engine, settings, conversation)."""

    _reloading: str | None = None  # what is loading now
    _last_draft: tuple[str, int | None] | None = None  # for F8 to turn back on

    # -- parameters ------------------------------------------------------------------

    def _on_chat_screen(self) -> None:
        """These keys are priority bindings: over a dialog, let the key through."""
        if self.screen is not self.screen_stack[0]:
            raise SkipAction()

    def action_parameters(self) -> None:
        self._on_chat_screen()
        s = self.settings
        n_ctx = self.engine.info.n_ctx if self.engine is not None else (s.ctx_size or 0)
        self.push_screen(ParamsScreen(s.sampling, s.max_tokens, n_ctx,
                                      note="Enter applies · Esc cancels"),
                         self._apply_params)

    def _apply_params(self, values: ParamValues | None) -> None:
        if values is None:
            return
        self.settings = replace(self.settings, sampling=values.sampling,
                                max_tokens=values.max_tokens)
        self.session.save_settings()
        p = values.sampling
        self._info(f"next reply: temp {p.temperature}, top-k {p.top_k}, top-p {p.top_p}, "
                   f"min-p {p.min_p}, repeat {p.repeat_penalty}, max tokens "
                   f"{values.max_tokens or '–'}, seed {p.seed if p.seed is not None else '–'}")
        if values.ctx_size is not None:
            self.switch_engine(replace(self.settings, ctx_size=values.ctx_size),
                               f"context {values.ctx_size or 'of the model'}")

    # -- models and drafts -----------------------------------------------------------

    def action_pick_model(self) -> None:
        self._on_chat_screen()
        s = self.settings
        if s.endpoint:  # the picker lists files here; a server knows its own models
            self._error(f"the model picker lists local files, but {s.endpoint} serves the "
                        "model: use /model NAME with a model it serves")
            return
        path = self.engine.info.path if self.engine is not None else None
        self.push_screen(ModelPickerScreen(s.model, s.draft, s.ctx_size, path), self._picked)

    def _picked(self, choice: Choice | None) -> None:
        if choice is None:
            return
        kind, spec = choice
        s = self.settings
        if kind == "model":
            if spec == s.model:
                self._info(f"{spec} is the model in use")
                return
            self.switch_engine(replace(s, model=spec), spec)
        elif spec == s.draft:
            self._info(f"the draft is already {draft_label(spec)}")
        else:
            self.switch_engine(s.with_draft(spec, s.num_draft_tokens if spec else None),
                               f"draft {draft_label(spec)}" if spec else "without a draft")

    def action_toggle_speculation(self) -> None:
        self._on_chat_screen()
        s = self.settings
        if s.draft:
            self._last_draft = (s.draft, s.num_draft_tokens)
            self.switch_engine(s.with_draft(None, None), "without a draft")
        else:
            draft, n = self._last_draft or ("ngram", None)
            self.switch_engine(s.with_draft(draft, n), f"draft {draft_label(draft)}")

    # -- reloading -------------------------------------------------------------------

    def switch_engine(self, settings: ChatSettings, what: str) -> bool:
        """Load an engine for settings in a worker; it replaces the current one when ready."""
        if self._generating:
            self._error("a reply is being generated (Esc stops it)")
            return False
        if self._reloading is not None or self.engine is None:
            self._error("the model is still loading")
            return False
        self._reloading = what
        self._load_started = time.monotonic()
        self._show_loading()
        self._load_timer = self.set_interval(0.5, self._show_loading)
        self._load_in_worker(settings, what)
        return True

    def _show_loading(self) -> None:
        if self._reloading is not None:
            seconds = time.monotonic() - self._load_started
            self.query_one(GaugeBar).state = f"loading {self._reloading}… {seconds:.0f} s"

    @work(thread=True, exclusive=True, group="load")
    def _load_in_worker(self, settings: ChatSettings, what: str) -> None:
        old, owned = self.engine, self._owns_engine
        try:
            engine = settings.load_engine()
        except LocalchatError as exc:
            self.post_message(EngineSwitched(None, settings, what, str(exc)))
            return
        if owned and old is not None:
            old.close()  # nothing uses it: sending and controls wait while _reloading
        self.post_message(EngineSwitched(engine, settings, what))

    def _on_engine_switched(self, message: EngineSwitched) -> None:
        self._load_timer.stop()
        self._reloading = None
        gauges = self.query_one(GaugeBar)
        if message.error:
            gauges.state = "ready"
            self._error(f"could not load {message.what}: {message.error} (still using "
                        f"{self.settings.model})")
            return
        s = message.settings
        self.session.use_engine(message.engine, s)
        self._owns_engine = True
        gauges.stats = None
        self.query_one(RateSparkline).reset()
        self._show_engine()
        gauges.state = "ready"
        self._info(f"loaded {message.what}: ctx {self.engine.info.n_ctx}, draft "
                   f"{draft_label(s.draft)}")
