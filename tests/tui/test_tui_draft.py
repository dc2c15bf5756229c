"""Speculative decoding in the TUI, driven with Pilot against the real bundled model on
the torch engine with a prompt-lookup (ngram) draft: the gauge bar shows the draft's
acceptance, F4 colours the tokens the draft proposed, /stats has the draft section."""

from __future__ import annotations

from dataclasses import replace

import re

import pytest
from rich.cells import cell_len

from localchat.engine.base import SamplingParams, Stats
from helpers.pilot import chat_config
from localchat.engine.config import DraftChoice
from localchat.engine import open_engine
from localchat.tui.app import ChatApp
from localchat.tui.drafts import draft_markdown
from localchat.chat.runs import add_run
from localchat.tui.help import help_markdown
from localchat.tui.keymap import parse_keymap
from localchat.tui.palette import PALETTE_ACTIONS
from localchat.tui.screens import InfoScreen
from localchat.tui.widgets import DraftRuns, GaugeBar, format_gauges

from helpers.pilot import send, wait_until

GREEDY = SamplingParams(temperature=0.0)
# The reply quotes the prompt, so prompt lookup finds what comes next.
QUOTE = "Repeat exactly: the quick brown fox jumps over the lazy dog. the quick brown fox"


def draft_settings(**changes):
    """(config, params): torch engine, ngram draft with a fixed γ of 3 (adaptive γ may
    switch speculation off on a busy machine), greedy."""
    return chat_config(engine="torch", draft=DraftChoice("ngram", tokens=3), ctx_size=1024,
                       threads=2, kv_memory=2048 * 23040, sampling=GREEDY, **changes)


@pytest.fixture(scope="module")
def draft_engine():
    eng = open_engine(draft_settings()[0])
    yield eng
    eng.close()


async def reply_to(pilot, text: str):
    app = pilot.app
    n = len(app.entries)
    await send(pilot, text)
    await wait_until(pilot, lambda: not app.generating and len(app.entries) == n + 2
                     and app.entries[-1].status != "streaming")
    return app.entries[-1]


def shown(view) -> tuple[bool, bool]:
    """(Markdown visible, draft-coloured text visible)."""
    return view.markdown.display, view.query_one(DraftRuns).display


@pytest.mark.model
async def test_gauges_show_draft_acceptance_and_f4_colours_drafted_tokens(draft_engine):
    app = ChatApp(*draft_settings(max_tokens=24), engine=draft_engine)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: app.query_one(GaugeBar).state == "ready")
        entry = await reply_to(pilot, QUOTE)
        gauges = app.query_one(GaugeBar)
        draft = gauges.stats.draft
        assert draft is not None and draft["source"] == "ngram" and draft["proposed"] > 0
        line = str(gauges.render())
        assert f"ngram {draft['acceptance_rate']:.0%} γ{draft['gamma']}" in line, line
        assert cell_len(line) <= gauges.content_size.width  # fits at 80 columns

        # the reply's runs are its text, split by source; the ngram draft fired
        assert "".join(t for t, _ in entry.runs) == entry.content
        drafted = [t for t, d in entry.runs if d]
        assert drafted and not entry.runs[0][1]  # the first token is never drafted
        assert shown(entry.view) == (True, False)

        await pilot.press("f4")
        assert shown(entry.view) == (False, True)
        text = entry.view.query_one(DraftRuns).render()
        assert text.plain == entry.content.rstrip()
        assert [text.plain[s.start:s.end] for s in text.spans] == drafted
        colour = entry.view.query_one(DraftRuns).get_component_rich_style("draft-runs--draft")
        assert all(s.style == colour for s in text.spans) and colour.color is not None

        # a reply finished while colours are on is shown coloured
        second = await reply_to(pilot, QUOTE.replace("fox", "cat"))
        assert shown(second.view) == (False, True)

        await pilot.press("f4")  # back to Markdown, with the whole text
        for e in (entry, second):
            assert shown(e.view) == (True, False)
            assert e.view.markdown.source == e.content

        await send(pilot, "/stats")
        assert isinstance(app.screen, InfoScreen)
        assert "Speculative decoding" in app.screen.body
        assert f"| proposed | {second.stats.draft['proposed']} |" in app.screen.body
        assert "| draft |" not in app.screen.body.split("Speculative decoding")[0]
        await pilot.press("escape")

        # reopened from the history: no flags, so it stays Markdown with colours on
        first_id = app.session.conversation.id
        await pilot.press("ctrl+n")
        assert await app.open_conversation(first_id)
        await pilot.press("f4")
        assert app.draft_colours
        reopened = app.entries[1]
        assert reopened.runs is None and reopened.stats.draft is not None
        assert shown(reopened.view) == (True, False)


@pytest.mark.model
async def test_f4_colours_drafted_tokens_on_the_llama_cpp_executor_too():
    settings = chat_config(draft=DraftChoice("ngram", tokens=3), ctx_size=1024, threads=2,
                           parallel=1, sampling=GREEDY, max_tokens=24)
    engine = open_engine(settings[0])
    try:
        app = ChatApp(*settings, engine=engine)
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_until(pilot, lambda: app.query_one(GaugeBar).state == "ready")
            entry = await reply_to(pilot, QUOTE)
            drafted = [t for t, d in entry.runs if d]
            assert drafted and entry.stats.draft["accepted"] > 0
            await pilot.press("f4")
            text = entry.view.query_one(DraftRuns).render()
            assert shown(entry.view) == (False, True)
            assert [text.plain[s.start:s.end] for s in text.spans] == drafted
    finally:
        engine.close()


async def test_without_a_draft_f4_leaves_replies_as_markdown(torch_engine):
    app = ChatApp(*chat_config(sampling=GREEDY, max_tokens=8), engine=torch_engine)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: app.query_one(GaugeBar).state == "ready")
        entry = await reply_to(pilot, "Say hello.")
        assert entry.runs and not any(d for _, d in entry.runs)
        assert entry.stats.draft is None and "draft" not in str(app.query_one(GaugeBar).render())
        await pilot.press("f4")
        assert app.draft_colours and shown(entry.view) == (True, False)


def stats_with(draft: dict | None) -> Stats:
    return Stats(prompt_tokens=500, completion_tokens=300, ttft_s=0.125, decode_tok_s=142.0,
                 kv_cache_bytes=900 * 23040, kv_cache_capacity_bytes=100_000 * 23040,
                 context_tokens=900, context_capacity=4096, draft=draft)


def test_format_gauges_with_a_draft_fits_80_columns():
    draft = {"source": "ngram", "proposed": 40, "accepted": 32, "acceptance_rate": 0.8,
             "gamma": 4, "measured_speedup": None}
    full = format_gauges(stats_with(draft), "generating")
    assert full.endswith(" │ ngram 80% γ4") and "19.8 MiB/2.1 GiB" in full and "TTFT 125 ms" in full
    fitted = format_gauges(stats_with(draft), "generating", width=78)  # 80 minus padding
    assert cell_len(fitted) <= 78 < cell_len(full)
    assert "ngram 80% γ4" in fitted and "ctx 900/4096" in fitted and "142.0 tok/s" in fitted
    narrow = format_gauges(stats_with(draft), "generating", width=49)  # sidebar open
    assert cell_len(narrow) <= 49 and "ngram 80% γ4" in narrow

    assert "draft" not in format_gauges(stats_with(None), "ready")
    plain = format_gauges(stats_with(None), "ready")
    assert format_gauges(stats_with(None), "ready", width=90) == plain  # fits: unchanged
    # at 78 columns the KV bar is halved first; its bytes stay
    assert format_gauges(stats_with(None), "ready", width=78) == plain.replace(
        "█░░░░░░░", "█░░░")
    # at 120 columns with prefill, a draft and snapshots on disk: the cache and the rates'
    # words go, the KV bytes stay (they once went first)
    busy = replace(stats_with(draft), prefill_tok_s=312.4, kv_cache_cached_bytes=3 << 20,
                   kv_disk_bytes=50 << 20)
    line = format_gauges(busy, "generating", width=118)
    assert "19.8 MiB/2.1 GiB" in line and "pp 312" in line and "ngram 80% γ4" in line
    # nothing proposed yet; llama.cpp's dict has fewer keys
    assert "draft – γ4" in format_gauges(stats_with({"proposed": 0, "gamma": 4}), "ready")
    assert "draft 50%" in format_gauges(
        stats_with({"proposed": 2, "accepted": 1, "acceptance_rate": 0.5}), "ready")


def test_runs_merge_by_source_and_stats_table():
    runs: list = []
    for text, d in [("The", False), (" quick", False), ("", True), (" brown", True),
                    (" fox", True), (".", False)]:
        add_run(runs, text, d)
    assert runs == [("The quick", False), (" brown fox", True), (".", False)]
    table = draft_markdown({"source": "ngram", "acceptance_rate": 0.75,
                            "accepted_run_histogram": {"2": 3}, "measured_speedup": None})
    assert "| acceptance_rate | 75.0% |" in table and "| measured_speedup | – |" in table
    assert "2 kept: 3×" in table


def test_draft_colours_key_is_documented_rebindable_and_in_the_palette():
    assert "F4" in help_markdown()
    assert parse_keymap({"keys": {"toggle_draft_colours": "f6"}}) == {"toggle_draft_colours": "f6"}
    assert any(action == "toggle_draft_colours" for _, _, action in PALETTE_ACTIONS)
    assert re.search(r"\| F4 \|", help_markdown())


def test_gauge_warns_before_the_context_overflows():
    from localchat.engine.base import Stats

    def line(used: int) -> str:
        return format_gauges(Stats(context_tokens=used, context_capacity=4096,
                                   kv_cache_capacity_bytes=1 << 20), "generating", width=78)

    assert "⚠" not in line(3600)
    assert "ctx 3700/4096 ⚠" in line(3700) and "ctx 4095/4096 ⚠" in line(4095)
