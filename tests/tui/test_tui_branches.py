"""Branches in the TUI on the real bundled model and a real history database: edits and
regenerations of any message become versions, Alt+arrows switch them, /fork copies one."""

from __future__ import annotations

from dataclasses import replace

from localchat.engine.base import SamplingParams
from localchat.storage.export import to_markdown
from localchat.tui.widgets import GaugeBar, PromptInput

from helpers.pilot import chat, make_app, ready, send, stored, wait_until


def labels(app) -> list[str]:
    return [str(e.view.query_one(".role").render()) for e in app.entries]


def on_screen(app) -> list[str]:
    return [e.content for e in app.entries]


async def settled(pilot, n: int) -> None:
    app = pilot.app
    await wait_until(pilot, lambda: not app.generating and len(app.entries) == n
                     and app.entries[-1].status == "complete")


async def test_an_edit_becomes_a_version_and_alt_arrows_switch_back(engine):
    app = make_app(engine, max_tokens=12)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await chat(pilot, "What is the capital of France?")
        france = on_screen(app)
        prompt = app.query_one(PromptInput)
        prompt.focus()
        await pilot.press("up")  # edit it
        prompt.text = "What is the capital of Italy?"
        await pilot.press("enter")
        await settled(pilot, 2)
        italy = on_screen(app)
        assert italy[0] == "What is the capital of Italy?" and stored(app)[0].version == (2, 2)
        assert "2/2" in labels(app)[0] and "/" not in labels(app)[1]
        cid = app.session.conversation.id
        assert app.session.store.message_count(cid) == 4  # the France turn was kept

        await pilot.press("alt+left")  # no selection: the lowest message with versions
        await wait_until(pilot, lambda: on_screen(app) == france)
        assert "1/2" in labels(app)[0]
        assert app.selected == 0  # the message just switched stays selected for Alt+Right
        assert [m.content for m in stored(app)] == france  # the branch on screen is stored

        await chat(pilot, "And of Spain?")  # goes on from the France branch
        reply = app.entries[-1]
        assert [m.content for m in stored(app)][:2] == france and len(stored(app)) == 4
        # the France reply's KV came back from the prefix cache, not only the shared start
        first_turn = engine.count_prompt_tokens(app.session.history[:3])
        assert reply.stats.cached_tokens >= first_turn - 16, (reply.stats, first_turn)
        assert "prompt tokens cached" in str(reply.view.status.render())

        spain_ctx = app.query_one(GaugeBar).stats.context_tokens
        assert spain_ctx == reply.stats.context_tokens
        await pilot.press("alt+right")
        await wait_until(pilot, lambda: on_screen(app) == italy)
        # the ctx gauge follows the branch on screen, not the last reply generated
        assert app.query_one(GaugeBar).stats.context_tokens == \
            app.entries[-1].stats.context_tokens < spain_ctx
        await pilot.press("alt+right")  # the last version: it stops there, and says so
        await pilot.pause()
        assert on_screen(app) == italy and "last version (2 of 2)" in app.last_error
        await pilot.press("alt+left")
        await wait_until(pilot, lambda: on_screen(app)[:2] == france and len(app.entries) == 4)
        assert app.query_one(GaugeBar).stats.context_tokens == spain_ctx

        md = to_markdown(app.session.conversation, stored(app))
        assert "France" in md and "Spain" in md and "Italy" not in md  # the branch on screen
        assert "## You (version 1 of 2)" in md


async def test_regenerating_a_selected_earlier_reply_keeps_the_later_turns(engine):
    app = make_app(engine, max_tokens=8)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await chat(pilot, "Name a colour.")
        await chat(pilot, "Name a fruit.")
        before = on_screen(app)
        await pilot.press("alt+up", "alt+up", "alt+up")  # the last reply, the fruit, the colour reply
        assert app.selected == 1 and app.entries[1].view.has_class("selected")
        app.session.set_params(replace(app.session.params, sampling=SamplingParams(temperature=1.5, seed=7)))
        await pilot.press("ctrl+r")
        await settled(pilot, 2)
        assert app.selected is None and on_screen(app)[0] == before[0]
        assert "2/2" in labels(app)[1]
        cid = app.session.conversation.id
        assert app.session.store.message_count(cid) == 5  # both later turns kept in the old branch
        await pilot.press("alt+up", "alt+left")
        await wait_until(pilot, lambda: on_screen(app) == before)
        await pilot.press("escape")
        assert app.selected is None and not app.query(".selected")

        await send(pilot, "/fork")
        await wait_until(pilot, lambda: app.session.conversation.id != cid)
        assert on_screen(app) == before and app.session.conversation.title.endswith("(fork)")
        assert [m.content for m in stored(app)] == before
        assert app.session.store.message_count(app.session.conversation.id) == 4
        assert app.session.store.message_count(cid) == 5


async def test_switching_has_a_one_line_reason_when_there_is_nothing_to_switch(engine):
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await pilot.press("alt+up")
        assert "no message to select" in app.last_error
        await chat(pilot, "Hi")
        await pilot.press("alt+left")
        assert "one version" in app.last_error
        cid = app.session.conversation.id
        await send(pilot, "/fork")
        await wait_until(pilot, lambda: app.session.conversation.id != cid)
        assert app.session.conversation.title == "Hi (fork)" and len(app.entries) == 2
