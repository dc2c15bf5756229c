"""The parameters panel (F6): sampling, max tokens, context size and seed in one form,
checked by the same code as `/set`; it answers ParamValues (None: cancelled) and applies
nothing itself."""

from __future__ import annotations

from dataclasses import dataclass

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from localchat.chat.commands import apply_set, parse_set
from localchat.engine.base import SamplingParams
from localchat.errors import UsageError
from localchat.models.facts import MIN_CTX
from localchat.sampling_fields import FIELD, SAMPLING_FIELDS


# (field, label, `/set` name, hint shown as the input's placeholder): SAMPLING_FIELDS,
# with the context size before the seed
FIELDS = [(f.name, f.label, f.set_names[0], f.hint) for f in SAMPLING_FIELDS]
FIELDS.insert([f for f, *_ in FIELDS].index("seed"),
              ("ctx_size", "context size", None, "tokens; reloads"))


@dataclass(frozen=True)
class ParamValues:
    """What the panel gives back: all fields valid. ctx_size None: unchanged."""

    sampling: SamplingParams
    max_tokens: int | None
    ctx_size: int | None


def _text(value) -> str:
    return "" if value is None else str(value)


def check_values(texts: dict[str, str], sampling: SamplingParams, max_tokens: int | None,
                 n_ctx: int) -> tuple[ParamValues | None, dict[str, str]]:
    """(the new values, {}) or (None, {field: error}) for the panel's texts."""
    errors: dict[str, str] = {}
    for field, label, set_name, _ in FIELDS:
        raw = texts.get(field, "").strip()
        if field == "ctx_size":
            continue
        if " " in raw:
            errors[field] = f"{label}: one value, without spaces"
            continue
        if not raw:
            if not FIELD[field].nullable:
                errors[field] = f"{label} needs a value"
                continue
            raw = "none"
        try:  # the `/set` path: type check, then SamplingParams' own range checks
            name, value = parse_set(f"{set_name} {raw}")
            sampling, max_tokens = apply_set(sampling, max_tokens, name, value)
        except UsageError as exc:
            errors[field] = str(exc).replace(f"{set_name} must", f"{label} must")
    ctx_size = None
    raw = texts.get("ctx_size", "").strip()
    if raw:
        try:
            ctx = int(raw)
        except ValueError:
            errors["ctx_size"] = f"context size must be a whole number, got {raw!r}"
        else:
            if ctx != 0 and ctx < MIN_CTX or ctx < 0:  # 0: the model's full context
                errors["ctx_size"] = (f"context size must be at least {MIN_CTX} tokens "
                                      "(0: the model's full context)")
            elif ctx != n_ctx:
                ctx_size = ctx
    if errors:
        return None, errors
    return ParamValues(sampling, max_tokens, ctx_size), {}


class ParamsScreen(ModalScreen["ParamValues | None"]):
    """The form. Enter (in a field) or Apply checks and applies; Esc cancels."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, sampling: SamplingParams, max_tokens: int | None, n_ctx: int,
                 note: str = "") -> None:
        super().__init__(classes="modal")
        self.sampling, self.max_tokens, self.n_ctx, self.note = sampling, max_tokens, n_ctx, note

    def _value(self, field: str):
        if field == "max_tokens":
            return self.max_tokens
        if field == "ctx_size":
            return self.n_ctx
        return getattr(self.sampling, field)

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog params"):
            yield Static("Parameters · for the next reply, kept with this conversation",
                         classes="question")
            for field, label, _, hint in FIELDS:
                with Horizontal(classes="param-row"):
                    yield Label(label, classes="param-label")
                    yield Input(_text(self._value(field)), id=f"param-{field}",
                                classes="param-input", compact=True)
                    yield Label(hint, id=f"hint-{field}", classes="param-hint")
            if self.note:
                yield Static(self.note, classes="hint")
            with Horizontal(classes="buttons"):
                yield Button("Apply", variant="primary", id="apply", compact=True)
                yield Button("Cancel", id="cancel", compact=True)

    def on_mount(self) -> None:
        self.query_one("#param-temperature", Input).focus()

    def texts(self) -> dict[str, str]:
        return {field: self.query_one(f"#param-{field}", Input).value for field, *_ in FIELDS}

    def apply(self) -> None:
        values, errors = check_values(self.texts(), self.sampling, self.max_tokens, self.n_ctx)
        for field, label, _, hint in FIELDS:  # an error takes the place of the field's hint
            bad = field in errors
            message = errors.get(field, "").removeprefix(f"{label} ")
            self.query_one(f"#hint-{field}", Label).update(f"✗ {message}" if bad else hint)
            self.query_one(f"#hint-{field}", Label).set_class(bad, "error")
            self.query_one(f"#param-{field}", Input).set_class(bad, "bad")
        if values is not None:
            self.dismiss(values)
        else:
            first = next(f for f, *_ in FIELDS if f in errors)
            self.query_one(f"#param-{first}", Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.apply()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.apply() if event.button.id == "apply" else self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)
