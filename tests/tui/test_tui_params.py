"""The parameters panel (F6), the model picker (F7), speculation on/off (F8) and the
live gauges (decode tok/s sparkline, prefill vs decode), driven with Pilot against the
real bundled model on llama.cpp."""

from __future__ import annotations

import os
import shutil
import threading
from dataclasses import replace

import pytest
from rich.cells import cell_len
from textual.widgets import DataTable, Input

from localchat.engine.base import SamplingParams, Stats
from localchat.models.facts import load_context
from helpers.pilot import chat_config
from localchat.tui import switching
from localchat.tui.app import ChatApp
from localchat.tui.keymap import parse_keymap
from localchat.tui.palette import PALETTE_ACTIONS
from localchat.tui.params import ParamsScreen, check_values
from localchat.tui.picker import ModelPickerScreen, model_row
from localchat.tui.widgets import GaugeBar, RateSparkline, format_gauges, live_rate

from helpers.pilot import send, wait_until

GREEDY = SamplingParams(temperature=0.0)


def ready(app) -> bool:
    return app.query_one(GaugeBar).state == "ready" and app.switcher.reloading is None


def self_loading_app(max_tokens: int) -> ChatApp:
    """A greedy app that loads the default model itself (256-token context)."""
    return ChatApp(*chat_config(ctx_size=256, threads=2, sampling=GREEDY, max_tokens=max_tokens))


async def loaded(pilot) -> None:
    """Wait until the app's engine is loaded and no reload is under way."""
    await wait_until(pilot, lambda: ready(pilot.app) and pilot.app.session.engine is not None)


async def say_hello(pilot) -> None:
    """Send "Hello" as the first message and wait for the reply to finish."""
    await send(pilot, "Hello")
    await wait_until(pilot, lambda: len(pilot.app.session.history) == 2 and not pilot.app.generating)


async def open_screen(pilot, key, screen_class):
    await pilot.press(key)
    await wait_until(pilot, lambda: isinstance(pilot.app.screen, screen_class))
    await pilot.pause()
    return pilot.app.screen


async def fill(pilot, **values) -> None:
    for field, value in values.items():
        pilot.app.screen.query_one(f"#param-{field}", Input).value = str(value)


def errors(app) -> dict[str, str]:
    return {w.id.removeprefix("hint-"): str(w.render()) for w in app.screen.query(".param-hint")
            if w.has_class("error")}


# -- the parameters panel --------------------------------------------------------------


async def test_parameters_panel_rejects_bad_values_inline_and_applies_good_ones(engine):
    app = ChatApp(*chat_config(sampling=GREEDY, max_tokens=8), engine=engine)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: ready(app))
        await send(pilot, "Say hi.")  # a conversation in the history to store them with
        await wait_until(pilot, lambda: len(app.session.history) == 2 and not app.generating)
        await open_screen(pilot, "f6", ParamsScreen)
        await fill(pilot, temperature="hot", top_p="1.5", repeat_penalty="0", max_tokens="0",
                   ctx_size="8", seed="-3")
        await pilot.press("enter")
        await pilot.pause()
        shown = errors(app)
        assert isinstance(app.screen, ParamsScreen), "an invalid form must stay open"
        assert set(shown) == {"temperature", "top_p", "repeat_penalty", "max_tokens",
                              "ctx_size", "seed"}
        assert "✗ must be a number, got 'hot'" in shown["temperature"]
        assert "must be in (0, 1], got 1.5" in shown["top_p"]  # SamplingParams' own message
        assert "must be >= 1" in shown["max_tokens"]
        assert app.session.params.sampling == GREEDY and app.session.params.max_tokens == 8  # not applied
        await fill(pilot, temperature="0.7", top_k="12", top_p="0.9", min_p="0.1",
                   repeat_penalty="1.1", max_tokens="", ctx_size=str(engine.info.n_ctx),
                   seed="42")
        await pilot.click("#apply")
        await wait_until(pilot, lambda: not isinstance(app.screen, ParamsScreen))
        expected = SamplingParams(temperature=0.7, top_k=12, top_p=0.9, min_p=0.1,
                                  repeat_penalty=1.1, seed=42)
        assert app.session.params.sampling == expected and app.session.params.max_tokens is None
        assert app.session.engine is engine and app.switcher.reloading is None  # same context: no reload
        stored = app.session.store.get_conversation(app.session.conversation.id).params
        assert stored["temperature"] == 0.7 and stored["seed"] == 42 and stored["top_k"] == 12
        # the next reply runs with them, and keeps them
        await open_screen(pilot, "f6", ParamsScreen)
        await fill(pilot, max_tokens="6")
        await pilot.press("enter")
        await wait_until(pilot, lambda: not isinstance(app.screen, ParamsScreen))
        await send(pilot, "Tell me a story.")
        await wait_until(pilot, lambda: len(app.session.history) == 4 and not app.generating)
        assert app.entries[-1].stats.completion_tokens <= 6
        reply = app.session.store.messages(app.session.conversation.id)[-1]
        assert reply.params["temperature"] == 0.7 and reply.params["max_tokens"] == 6
        await open_screen(pilot, "f6", ParamsScreen)
        await pilot.press("escape")  # cancel changes nothing
        await wait_until(pilot, lambda: not isinstance(app.screen, ParamsScreen))
        assert not isinstance(app.screen, ParamsScreen) and app.session.params.max_tokens == 6


async def test_context_size_change_reloads_the_engine_without_blocking_the_ui(monkeypatch):
    app = self_loading_app(4)
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot)
        old = app.session.engine
        gate, real_load = threading.Event(), switching.open_engine
        monkeypatch.setattr(switching, "open_engine",
                            lambda config, **kw: gate.wait(60) and real_load(config, **kw))  # slow
        await open_screen(pilot, "f6", ParamsScreen)
        await fill(pilot, ctx_size="512")
        await pilot.press("enter")
        gauges = app.query_one(GaugeBar)
        await wait_until(pilot, lambda: gauges.state.startswith("loading context 512… "))
        await wait_until(pilot, lambda: gauges.state.endswith("1 s"))  # the count moves
        await send(pilot, "typed while loading")  # the UI answers; nothing is sent yet
        assert app.session.history == [] and "typed while loading" in app.query_one("#prompt").text
        assert app.session.engine is old
        gate.set()
        await wait_until(pilot, lambda: ready(app))
        assert app.session.engine is not old and app.session.engine.info.n_ctx == 512
        assert app.session.config.ctx_size == 512 and "ctx 512" in str(app.query_one("#title").render())
        app.query_one("#prompt").clear()
        await send(pilot, "Hi")
        await wait_until(pilot, lambda: len(app.session.history) == 2 and not app.generating)
        assert app.entries[-1].stats.context_capacity == 512
        assert app.session.store.get_conversation(app.session.conversation.id).params["ctx_size"] == 512


async def test_palette_opens_the_parameters_panel_and_the_model_picker(engine):
    app = ChatApp(*chat_config(sampling=GREEDY), engine=engine)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: ready(app))
        for title, screen in (("Parameters", ParamsScreen), ("Choose model", ModelPickerScreen)):
            await pilot.press("ctrl+p")
            await pilot.pause(0.2)
            await pilot.press(*title)
            await pilot.pause(0.3)
            await pilot.press("enter")
            await wait_until(pilot, lambda: isinstance(app.screen, screen))
            await pilot.press("escape")
            await wait_until(pilot, lambda: not isinstance(app.screen, screen))


def test_check_values_uses_the_set_rules_and_reports_every_bad_field():
    texts = {"temperature": "0.5", "top_k": "40", "top_p": "0.95", "min_p": "0.05",
             "repeat_penalty": "1.0", "max_tokens": "", "ctx_size": "1024", "seed": ""}
    values, errs = check_values(texts, SamplingParams(), None, 1024)
    assert errs == {} and values.sampling.temperature == 0.5 and values.ctx_size is None
    values, errs = check_values({**texts, "ctx_size": "0"}, SamplingParams(), None, 1024)
    assert values.ctx_size == 0  # the model's full context
    values, errs = check_values({**texts, "top_k": "1.5", "min_p": "2", "temperature": "0 .5",
                                 "ctx_size": "big"}, SamplingParams(), None, 1024)
    assert values is None and set(errs) == {"top_k", "min_p", "temperature", "ctx_size"}
    assert "whole number" in errs["top_k"] and "min-p must be in [0, 1]" in errs["min_p"]


def test_new_actions_are_documented_rebindable_and_in_the_palette():
    from localchat.tui.help import help_markdown

    for action in ("parameters", "pick_model", "toggle_speculation"):
        assert parse_keymap({"keys": {action: "f9"}}) == {action: "f9"}
        assert any(a == action for _, _, a in PALETTE_ACTIONS)
    assert all(key in help_markdown() for key in ("| F6 |", "| F7 |", "| F8 |"))


# -- the model picker and speculation ---------------------------------------------------


@pytest.fixture
def local_copy(tmp_path):
    """A second model file (the bundled one, copied), remembered like a used local file."""
    from localchat.models.specs import bundled_model_path, resolve_model

    target = tmp_path / "models" / "smollm2-copy.gguf"
    target.parent.mkdir()
    try:
        os.link(bundled_model_path(), target)
    except OSError:
        shutil.copyfile(bundled_model_path(), target)
    resolve_model(str(target))
    return target


@pytest.mark.model
async def test_model_picker_lists_models_and_switches_model_and_draft_live(local_copy):
    app = self_loading_app(12)
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot)
        await say_hello(pilot)

        picker = await open_screen(pilot, "f7", ModelPickerScreen)
        assert isinstance(picker, ModelPickerScreen)
        await wait_until(pilot, lambda: len(picker.rows) >= 2)
        specs = [r.entry.spec for r in picker.rows]
        assert specs[0] == "default" and str(local_copy) in specs
        bundled = picker.rows[0]
        assert bundled.fits is True and bundled.ctx == 256
        # SmolLM2: 30 layers, 3 KV heads, 64 dims, as the llama.cpp engine keeps them on the
        # CPU (f16 K and V, llama.cpp's default), for each of the chat's KV slots: the gauge's capacity
        assert bundled.kv_bytes_per_token == 23040 == app.session.engine.info.kv_bytes_per_token
        assert bundled.kv_bytes == app.session.engine.memory()["kv_cache_capacity_bytes"]
        table = picker.query_one(DataTable)
        assert [str(c) for c in table.get_row_at(0)][2:] == [
            "Q4_1", "93.8 MiB", "8192", "22.5 KiB", "yes"]
        detail = str(picker.query_one("#model-detail").render())
        assert "at ctx 256" in detail and "fits in" in detail

        # n: prompt lookup as the draft, loaded live
        await pilot.press("n")
        await wait_until(pilot, lambda: ready(app) and app.session.config.draft.record() == "ngram")
        assert "draft ngram" in str(app.query_one("#title").render())
        await send(pilot, "Repeat exactly: the quick brown fox jumps over the lazy dog.")
        await wait_until(pilot, lambda: len(app.session.history) == 4 and not app.generating)
        assert app.entries[-1].stats.draft is not None

        # F8: speculation off, and back on with the same draft
        await pilot.press("f8")
        await wait_until(pilot, lambda: ready(app) and app.session.config.draft.record() is None)
        assert "draft" not in str(app.query_one("#title").render())
        await pilot.press("f8")
        await wait_until(pilot, lambda: ready(app) and app.session.config.draft.record() == "ngram")

        # Enter on the other file: the model switches, the conversation records it
        picker = await open_screen(pilot, "f7", ModelPickerScreen)
        await wait_until(pilot, lambda: len(picker.rows) >= 2)
        picker.query_one(DataTable).move_cursor(row=specs.index(str(local_copy)))
        await pilot.press("enter")
        await wait_until(pilot, lambda: ready(app) and app.session.config.model == str(local_copy))
        assert app.session.engine.info.path == str(local_copy) and app.session.engine.info.n_ctx == 256
        assert app.session.store.get_conversation(app.session.conversation.id).model == str(local_copy)
        await send(pilot, "Hi again")
        await wait_until(pilot, lambda: len(app.session.history) == 6 and not app.generating)
        assert app.entries[-1].content

        # d: the bundled file as a draft model for the copy
        picker = await open_screen(pilot, "f7", ModelPickerScreen)
        await wait_until(pilot, lambda: len(picker.rows) >= 2)
        picker.query_one(DataTable).move_cursor(row=0)
        await pilot.press("d")
        await wait_until(pilot, lambda: ready(app) and app.session.config.draft.record() == "default")
        await send(pilot, "Say one word.")
        try:
            await wait_until(pilot, lambda: len(app.session.history) == 8 and not app.generating,
                             timeout=90)
        except AssertionError:
            raise AssertionError(
                f"no reply with the draft model: {app.query_one(GaugeBar).state!r}, "
                f"{[(e.role, e.status, e.content[:40]) for e in app.entries]}, "
                f"{app.last_error!r}") from None
        assert app.entries[-1].stats.draft is not None

        # o: speculation off from the picker
        await open_screen(pilot, "f7", ModelPickerScreen)
        await pilot.press("o")
        await wait_until(pilot, lambda: ready(app) and app.session.config.draft.record() is None)
        assert app.session.config.model == str(local_copy)


async def test_a_model_that_fails_to_load_keeps_the_old_one(engine, tmp_path):
    app = ChatApp(*chat_config(sampling=GREEDY, max_tokens=4), engine=engine)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: ready(app))
        from dataclasses import replace

        assert app.switch_engine(replace(app.session.config, model=str(tmp_path / "gone.gguf")), "gone")
        await wait_until(pilot, lambda: ready(app))
        assert app.session.engine is engine and app.session.config.model == "default"
        assert "could not load gone" in app.last_error
        await send(pilot, "Hi")
        await wait_until(pilot, lambda: len(app.session.history) == 2 and not app.generating)


def test_picker_rows_size_weights_and_kv_as_the_loaded_engines_hold_them(engine, torch_engine):
    """The picker's figures are the gauge's: the weights the engine holds, and a KV cache of
    the engine's own type (llama.cpp on the CPU: q8_0 K + f16 V) for each of its slots."""
    from localchat.models.specs import list_models

    entry = next(e for e in list_models() if e.spec == "default")
    assert load_context(None, 8192) == 4096 and load_context(0, 8192) == 8192
    slots = engine.executor.layout.pools
    row = model_row(entry, engine.info.n_ctx, 10 * 2**30, "llama.cpp", slots)
    assert row.weights_bytes == engine.info.weights_bytes
    assert row.kv_bytes == engine.memory()["kv_cache_capacity_bytes"]
    assert row.fits and row.needs_bytes == row.weights_bytes + row.kv_bytes
    torch_row = model_row(entry, torch_engine.info.n_ctx, 10 * 2**30, "torch")
    assert torch_row.kv_bytes_per_token == torch_engine.info.kv_bytes_per_token
    assert model_row(entry, 8192, row.needs_bytes - 1, "llama.cpp", slots).fits is False
    assert model_row(entry, None, 10 * 2**30).ctx == 4096


# -- gauges ------------------------------------------------------------------------------


async def test_sparkline_and_prefill_decode_rates_while_streaming(engine):
    app = ChatApp(*chat_config(sampling=GREEDY, max_tokens=40), engine=engine)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: ready(app))
        spark = app.query_one(RateSparkline)
        seen = []
        spark.watch(spark, "data", lambda d: seen.append((len(d or []), app.generating)),
                    init=False)
        await send(pilot, "Write a long story about a dragon.")
        await wait_until(pilot, lambda: len(app.session.history) == 2 and not app.generating,
                         timeout=180)  # 40 tokens at a few tok/s on a busy 2-core machine
        assert any(n >= 2 and generating for n, generating in seen), "no live samples"
        assert spark.display and len(spark.samples) >= 2 and all(r > 0 for r in spark.samples)
        gauges = app.query_one(GaugeBar)
        assert gauges.stats.prefill_tok_s > 0 and gauges.stats.decode_tok_s > 0
        line = str(gauges.render())
        assert cell_len(line) <= gauges.content_size.width  # fits beside the sparkline at 80
        assert "pp " in line or "prefill " in line
    wide = ChatApp(*chat_config(sampling=GREEDY, max_tokens=8), engine=engine)
    async with wide.run_test(size=(160, 30)) as pilot:
        await wait_until(pilot, lambda: ready(wide))
        await send(pilot, "Hi")
        await wait_until(pilot, lambda: len(wide.session.history) == 2 and not wide.generating)
        assert "prefill " in str(wide.query_one(GaugeBar).render())
        assert " · decode " in str(wide.query_one(GaugeBar).render())


def test_live_rate_and_prefill_in_the_gauge_line():
    s = lambda n, t: Stats(completion_tokens=n, elapsed_s=t)  # noqa: E731
    rate, mark = live_rate(None, s(1, 0.5))  # first token: its interval is the prefill
    assert rate is None and mark == (1, 0.5)
    rate, mark = live_rate(mark, s(5, 0.6))
    assert rate == pytest.approx(40.0) and mark == (5, 0.6)
    assert live_rate(mark, s(5, 0.7)) == (None, (5, 0.6))  # no new tokens: keep the mark
    stats = Stats(prompt_tokens=500, completion_tokens=300, ttft_s=0.125, prefill_tok_s=312.4,
                  decode_tok_s=61.3, kv_cache_bytes=900 * 23040,
                  kv_cache_capacity_bytes=4096 * 23040, context_tokens=900,
                  context_capacity=4096)
    full = format_gauges(stats, "generating")
    assert "prefill 312 · decode 61.3 tok/s" in full
    for width in (78, 66, 52, 40):  # 80 columns, then beside the sparkline, the sidebar
        line = format_gauges(stats, "generating", width=width)
        assert cell_len(line) <= width and "61.3 tok/s" in line
    assert "pp 312 · 61.3 tok/s" in format_gauges(stats, "generating", width=66)
    no_prefill = format_gauges(Stats(decode_tok_s=42.0), "ready")
    assert "prefill" not in no_prefill and "42.0 tok/s" in no_prefill
    assert "KV n/a" in no_prefill and "0 B" not in no_prefill  # no KV cache here (--endpoint)
    small = replace(stats, kv_cache_bytes=337 * 23040, kv_cache_capacity_bytes=2_500_000_000)
    assert "7.4 MiB/2.3 GiB" in format_gauges(small, "ready")  # not 0.0/2.3 GiB


@pytest.mark.model
async def test_model_slash_command_switches_the_model_and_refuses_a_bad_one(local_copy, tmp_path):
    app = self_loading_app(8)
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot)
        await send(pilot, f"/model {tmp_path / 'missing.gguf'}")
        await wait_until(pilot, lambda: ready(app) and app.last_error is not None)
        assert "missing.gguf" in app.last_error and app.session.config.model == "default"
        await send(pilot, f"/model {local_copy}")
        await wait_until(pilot, lambda: ready(app) and app.session.config.model == str(local_copy))
        assert app.session.engine.info.path == str(local_copy)
        await say_hello(pilot)
        assert app.entries[-1].content
        await send(pilot, "/model")
        await wait_until(pilot, lambda: isinstance(app.screen, ModelPickerScreen))


@pytest.mark.model
async def test_reopening_a_conversation_goes_back_to_its_model(local_copy):
    app = self_loading_app(6)
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot)
        await say_hello(pilot)
        first = app.session.conversation.id
        await app.action_new_conversation()
        await send(pilot, f"/model {local_copy}")
        await wait_until(pilot, lambda: ready(app) and app.session.config.model == str(local_copy))
        await send(pilot, "Hi")
        await wait_until(pilot, lambda: len(app.session.history) == 2 and not app.generating)
        assert app.session.conversation.id != first
        assert app.session.store.get_conversation(app.session.conversation.id).model == str(local_copy)
        await app.open_conversation(first)
        await wait_until(pilot, lambda: ready(app) and app.session.config.model == "default")
        assert app.session.engine.info.path != str(local_copy) and app.session.engine.info.n_ctx == 256


async def test_model_picker_is_refused_on_a_remote_endpoint(engine):
    """With --endpoint the server serves the model: local files are not choices."""
    app = ChatApp(*chat_config(endpoint="http://127.0.0.1:9/v1", sampling=GREEDY), engine=engine)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: ready(app))
        await pilot.press("f7")
        await wait_until(pilot, lambda: app.last_error is not None)
        assert "/model NAME" in app.last_error
        assert not isinstance(app.screen, ModelPickerScreen)
