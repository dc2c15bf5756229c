"""The model picker (F7): the models `localchat models` lists, with size, context and
whether each fits in memory; it answers a Choice (a model, or a draft: a file, "ngram"
or None for off) and loads nothing itself."""

from __future__ import annotations

from dataclasses import dataclass, replace

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Static

from localchat.errors import LocalchatError
from localchat.models.facts import load_context
from localchat.models.planner import engine_kv_bytes_per_token, model_size
from localchat.models.specs import ModelEntry, list_models
from localchat.units import available_memory, human_bytes

Choice = tuple[str, "str | None"]  # ("model", spec) or ("draft", spec | "ngram" | None)


@dataclass(frozen=True)
class ModelRow:
    """One model as the picker shows it. fits None: not known (unreadable file)."""

    entry: ModelEntry
    ctx: int = 0  # the context it would load with now
    weights_bytes: int = 0
    kv_bytes_per_token: int = 0  # as the engine keeps it (planner.engine_kv_bytes_per_token)
    fits: bool | None = None
    problem: str | None = None
    slots: int = 1  # contexts the engine keeps KV for (the chat's --parallel)

    @property
    def kv_bytes(self) -> int:
        """The KV cache it would load with: what the gauge's capacity then reads."""
        return self.ctx * self.slots * self.kv_bytes_per_token

    @property
    def needs_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes


def model_row(entry: ModelEntry, ctx_size: int | None, memory: int,
              engine: str = "llama.cpp", slots: int = 1) -> ModelRow:
    if entry.facts is None:
        return ModelRow(entry, problem=entry.error)
    ctx = load_context(ctx_size, entry.facts.context_length)
    try:
        size = model_size(entry.facts)
    except (LocalchatError, OSError, ValueError) as exc:
        return ModelRow(entry, ctx, problem=str(exc))
    row = ModelRow(entry, ctx, size.weights_bytes,
                   engine_kv_bytes_per_token(entry.facts, engine), slots=slots)
    return replace(row, fits=row.needs_bytes <= memory)


def model_rows(ctx_size: int | None, memory: int | None = None, engine: str = "llama.cpp",
               slots: int = 1) -> tuple[list[ModelRow], int]:
    """Every known model as a row, and the memory they were judged against (available
    now: the current model stays loaded until its replacement is ready)."""
    memory = available_memory() if memory is None else memory
    return [model_row(e, ctx_size, memory, engine, slots) for e in list_models()], memory


def _name(entry: ModelEntry) -> str:
    """A local file by its name (the detail line has the rest), others by their SPEC."""
    return _short(entry.path.name if entry.source == "local" else entry.spec)


def _short(spec: str, width: int = 26) -> str:
    return spec if len(spec) <= width else spec[: width // 2 - 1] + "…" + spec[-(width // 2):]


class ModelPickerScreen(ModalScreen["Choice | None"]):
    """The table of models; its answer is a Choice for the app to load."""

    BINDINGS = [
        Binding("escape", "cancel", "Close"),
        Binding("d", "choose('draft')", "Use as draft"),
        Binding("n", "ngram", "ngram draft"),
        Binding("o", "draft_off", "Speculation off"),
    ]

    def __init__(self, model: str, draft: str | None, ctx_size: int | None,
                 current_path: str | None = None, engine: str = "llama.cpp",
                 slots: int = 1) -> None:
        super().__init__(classes="modal")
        self.model, self.draft, self.ctx_size = model, draft, ctx_size
        self.engine, self.slots = engine, slots
        self.current_path = current_path
        self.rows: list[ModelRow] = []
        self.memory = 0

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog picker"):
            yield Static("Models · Enter: switch · d: draft · n: ngram draft · o: no draft",
                         classes="question")
            yield DataTable(id="models", cursor_type="row", zebra_stripes=True)
            yield Static("reading the model files…", id="model-detail", classes="hint")
            draft = self.draft or "off"
            yield Static(f"now: {_short(self.model, 30)} · draft: {_short(draft, 24)} · Esc closes",
                         id="model-now", classes="hint")

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns(" ", "model", "quant", "size", "ctx", "KV/tok", "fits")
        table.focus()
        self._read_models()

    @work(thread=True, exclusive=True)
    def _read_models(self) -> None:
        rows, memory = model_rows(self.ctx_size, engine=self.engine, slots=self.slots)
        self.app.call_from_thread(self.show_rows, rows, memory)

    def _is_current(self, row: ModelRow) -> bool:
        return row.entry.spec == self.model or str(row.entry.path) == self.current_path

    def show_rows(self, rows: list[ModelRow], memory: int) -> None:
        self.rows, self.memory = rows, memory
        table = self.query_one(DataTable)
        table.clear()
        for i, row in enumerate(rows):
            mark = "●" if self._is_current(row) else ("◆" if row.entry.spec == self.draft else "")
            f = row.entry.facts
            if f is None or row.problem:
                cells = [mark, _name(row.entry), "–", "–", "–", "–", Text("error", "red")]
            else:
                fits = Text("yes", "green") if row.fits else Text("no", "bold red")
                cells = [mark, _name(row.entry), f.quant_type, human_bytes(f.file_size),
                         str(f.context_length), human_bytes(row.kv_bytes_per_token), fits]
            table.add_row(*cells, key=str(i))
        if not rows:
            self.query_one("#model-detail", Static).update(
                "no models found; try `localchat pull OWNER/REPO:QUANT`")
        else:
            current = next((i for i, r in enumerate(rows) if self._is_current(r)), 0)
            table.move_cursor(row=current)
            self._show_detail(current)

    def _show_detail(self, index: int) -> None:
        if not 0 <= index < len(self.rows):
            return
        row = self.rows[index]
        f = row.entry.facts
        if f is None or row.problem:
            text = f"{row.entry.spec}: {row.problem}"
        else:
            verdict = "fits" if row.fits else "does NOT fit"
            where = row.entry.source if row.entry.source != "local" else str(row.entry.path)
            text = (f"{f.name} · {f.architecture} · {where} · at ctx {row.ctx}: "
                    f"weights {human_bytes(row.weights_bytes)} + KV "
                    f"{human_bytes(row.kv_bytes)} = "
                    f"{human_bytes(row.needs_bytes)}, {verdict} in "
                    f"{human_bytes(self.memory)} available")
        self.query_one("#model-detail", Static).update(text)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_detail(event.cursor_row)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_choose("model")

    def _highlighted(self) -> ModelRow | None:
        index = self.query_one(DataTable).cursor_row
        return self.rows[index] if 0 <= index < len(self.rows) else None

    def action_choose(self, kind: str) -> None:
        row = self._highlighted()
        if row is None:
            return
        if row.entry.facts is None or row.problem:
            self.app.bell()
            self.query_one("#model-detail", Static).update(
                f"✗ cannot use {row.entry.spec}: {row.problem}")
            return
        self.dismiss((kind, row.entry.spec))

    def action_ngram(self) -> None:
        self.dismiss(("draft", "ngram"))

    def action_draft_off(self) -> None:
        self.dismiss(("draft", None))

    def action_cancel(self) -> None:
        self.dismiss(None)
