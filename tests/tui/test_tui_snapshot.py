"""Layout snapshots at 80x24. A scripted engine makes the screen deterministic; it is
a layout fixture only -- behaviour is tested on the real model in test_tui.py."""

from __future__ import annotations

from textual.widgets import DataTable

from localchat.engine.base import Delta, Engine, ModelInfo, Result, Stats
from helpers.pilot import chat_config
from localchat.tui.app import ChatApp
from localchat.tui.widgets import PromptInput

REPLY = ["The capital ", "of France is **Paris**.\n\n", "```python\nprint('Paris')\n```\n"]


class ScriptedEngine(Engine):
    name = "scripted"
    info = ModelInfo(name="scripted", path="-", architecture="llama", quant_type="Q4_1",
                     file_size=0, n_ctx_train=8192, n_ctx=4096, n_layers=30, n_kv_heads=3,
                     head_dim=64, kv_bytes_per_token=23040)

    draft: dict | None = None  # set: the second piece "was drafted" (speculative decoding)

    def count_prompt_tokens(self, messages):
        return sum(len(m.content.split()) + 4 for m in messages)

    def generate(self, request, cancel=None):
        prompt = self.count_prompt_tokens(request.messages)
        for i, piece in enumerate(REPLY, 1):
            stats = Stats(prompt_tokens=prompt, completion_tokens=i, ttft_s=0.125,
                          decode_tok_s=42.0, kv_cache_bytes=(prompt + i) * 23040,
                          kv_cache_capacity_bytes=4096 * 23040, context_tokens=prompt + i,
                          context_capacity=4096, draft=self.draft)
            yield Delta(text=piece, token_ids=(i,), stats=stats,
                        from_draft=self.draft is not None and i == 2)
        yield Result(text="".join(REPLY), finish_reason="stop", stats=stats)


class DraftScriptedEngine(ScriptedEngine):
    draft = {"source": "ngram", "proposed": 8, "accepted": 7, "acceptance_rate": 0.875,
             "gamma": 4}


def make_app(engine_class=ScriptedEngine):
    return ChatApp(*chat_config(), engine=engine_class())


async def _chat_once(pilot):
    app = pilot.app
    prompt = app.query_one(PromptInput)
    prompt.text = "What is the capital of France?"
    await pilot.press("enter")
    for _ in range(1500):  # up to 30 s: a loaded CI machine can take seconds
        await pilot.pause(0.02)
        if not app.generating and len(app.session.history) == 2:
            break
    prompt.blur()
    await pilot.pause(0.1)


def test_empty_screen_80x24(snap_compare):
    assert snap_compare(make_app(), terminal_size=(80, 24))


def test_after_one_reply_80x24(snap_compare):
    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=_chat_once)


def make_app_with_history():
    from localchat.storage import ConversationStore

    store = ConversationStore.open()
    for title in ("Dragons and knights", "A haiku about the sea"):
        c = store.create_conversation(title, model="default")
        store.add_message(c.id, "user", title)
    store.close()
    return make_app()


async def _chat_then_open_sidebar(pilot):
    await _chat_once(pilot)
    await pilot.press("ctrl+b")  # the new conversation is listed first, marked current
    await pilot.pause(0.1)


def test_sidebar_open_80x24(snap_compare):
    assert snap_compare(make_app_with_history(), terminal_size=(80, 24),
                        run_before=_chat_then_open_sidebar)


async def _chat_then_colour_drafts(pilot):
    await _chat_once(pilot)
    await pilot.press("f4")  # the reply as text, the drafted run in the draft colour
    pilot.app.clear_notifications()  # the toast would cover the gauge bar
    await pilot.pause(0.1)


def test_draft_colours_80x24(snap_compare):
    assert snap_compare(make_app(DraftScriptedEngine), terminal_size=(80, 24),
                        run_before=_chat_then_colour_drafts)


# -- the parameters panel, the model picker, the live gauges ---------------------------


async def _chat_then_bad_parameters(pilot):
    from textual.widgets import Input

    await _chat_once(pilot)
    await pilot.press("f6")
    await pilot.pause(0.2)
    screen = pilot.app.screen
    screen.query_one("#param-temperature", Input).value = "0.7"
    screen.query_one("#param-top_p", Input).value = "1.5"  # out of (0, 1]
    screen.query_one("#param-seed", Input).value = "-1"
    await pilot.press("enter")  # stays open: the errors replace the fields' hints
    await pilot.pause(0.2)


def test_parameters_panel_with_errors_80x24(snap_compare):
    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=_chat_then_bad_parameters)


async def _open_model_picker(pilot):
    await _chat_once(pilot)
    await pilot.press("f7")
    for _ in range(600):  # the files are read in a worker (up to 30 s on a loaded machine)
        await pilot.pause(0.05)
        if getattr(pilot.app.screen, "rows", None):
            break
    table = pilot.app.screen.query_one(DataTable)
    for _ in range(600):  # column widths follow the rows only when the table is next idle
        await pilot.pause(0.05)
        if not table._require_update_dimensions:
            break
    # a header line drawn before the widths changed can stay in DataTable's line cache
    # (captured in two CI runs on a loaded machine): draw the table again from scratch
    table._clear_caches()
    table.refresh()
    await pilot.pause(0.1)


def test_model_picker_80x24(snap_compare, monkeypatch, tmp_path):
    """The bundled model only (an empty hub cache), judged against a fixed 8 GiB."""
    from huggingface_hub import constants

    monkeypatch.setattr("localchat.tui.picker.available_memory", lambda: 8 * 2**30)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=_open_model_picker)


# token i's engine clock (elapsed_s): decode rates between updates of 20..50 tok/s
TIMES = [0.20, 0.24, 0.265, 0.29, 0.33, 0.35, 0.375, 0.41, 0.43]


class PacedEngine(ScriptedEngine):
    """Tokens at a fixed pace in wall time (each its own UI update) with engine-clock
    times from TIMES, so the sparkline's rates do not depend on the machine."""

    def generate(self, request, cancel=None):
        import time

        prompt = self.count_prompt_tokens(request.messages)
        text = ""
        for i, t in enumerate(TIMES, 1):
            time.sleep(0.15)  # > the UI interval: no two tokens merge
            piece = f"word{i} "
            text += piece
            stats = Stats(prompt_tokens=prompt, completion_tokens=i, ttft_s=TIMES[0],
                          prefill_tok_s=prompt / TIMES[0], decode_tok_s=(i - 1) / (t - TIMES[0]) if i > 1 else 0.0,
                          elapsed_s=t, kv_cache_bytes=(prompt + i) * 23040,
                          kv_cache_capacity_bytes=4096 * 23040, context_tokens=prompt + i,
                          context_capacity=4096)
            yield Delta(text=piece, token_ids=(i,), stats=stats)
        yield Result(text=text, finish_reason="stop", stats=stats)


def test_gauges_with_rate_sparkline_80x24(snap_compare):
    assert snap_compare(make_app(PacedEngine), terminal_size=(80, 24), run_before=_chat_once)
