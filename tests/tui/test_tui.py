"""The chat TUI driven with Textual's Pilot against the real bundled model."""

from __future__ import annotations

import re

from textual import events

from helpers.pilot import chat_config
from localchat.tui.app import ChatApp
from localchat.tui.widgets import GaugeBar, MessageView, PromptInput, format_gauges

from helpers.pilot import GREEDY, send, wait_until



def replies(app) -> list[MessageView]:
    return [v for v in app.query(MessageView) if v.role == "assistant"]


async def test_send_message_streams_reply_and_gauges_move(engine):
    app = ChatApp(*chat_config(sampling=GREEDY, max_tokens=64), engine=engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: app.query_one(GaugeBar).state == "ready")
        gauges = app.query_one(GaugeBar)
        updates = []
        gauges.watch(gauges, "stats", lambda s: updates.append((s, app.generating)), init=False)
        await send(pilot, "Write a long story about a dragon.")
        await wait_until(pilot, lambda: len(app.session.history) == 2 and not app.generating)
        reply = replies(app)[-1]
        assert reply.markdown.source == app.session.history[-1].content != ""
        streaming = [s.completion_tokens for s, generating in updates if generating]
        assert len(set(streaming)) >= 3, "gauges did not update while tokens streamed"
        assert streaming == sorted(streaming)
        s = gauges.stats
        # finished: its KV stays cached for the next turn, and the gauge counts it as the
        # conversation's (its full blocks)
        assert s.ttft_s > 0 and s.context_tokens > 0
        assert s.kv_cache_bytes == s.context_tokens // 16 * 16 * engine.info.kv_bytes_per_token
        rendered = str(gauges.render())
        assert "TTFT" in rendered and "tok/s" in rendered and f"/{engine.info.n_ctx}" in rendered
        assert app.query_one(PromptInput).text == ""  # input cleared after sending
        assert [m.role for m in app.session.history] == ["user", "assistant"]
        await send(pilot, "Which city is the capital of France?")
        await wait_until(pilot, lambda: len(app.session.history) == 4 and not app.generating)
        assert "France" in replies(app)[-1].markdown.source or \
            "Paris" in replies(app)[-1].markdown.source  # on topic
        assert gauges.stats.cached_tokens > 0  # the second turn reused the first's KV prefix


async def test_escape_stops_generation_and_keeps_partial_reply(engine):
    app = ChatApp(*chat_config(sampling=GREEDY, max_tokens=400), engine=engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: app.query_one(GaugeBar).state == "ready")
        await send(pilot, "Write a very long story about a dragon and a knight.")
        gauges = app.query_one(GaugeBar)
        await wait_until(pilot, lambda: gauges.stats is not None and gauges.stats.completion_tokens >= 3)
        await send(pilot, "And then?")  # Enter while it streams: said, and the text kept
        assert app.last_error.startswith("a reply is being generated: Esc stops it")
        assert app.query_one(PromptInput).text == "And then?"
        await pilot.press("escape")
        await wait_until(pilot, lambda: not app.generating)
        reply = replies(app)[-1]
        assert "stopped" in str(reply.status.render())
        assert gauges.stats.completion_tokens < 400
        assert app.session.history[-1].role == "assistant" and app.session.history[-1].content


async def test_newline_key_does_not_send(engine):
    app = ChatApp(*chat_config(sampling=GREEDY, max_tokens=4), engine=engine)
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: app.query_one(GaugeBar).state == "ready")
        app.query_one(PromptInput).focus()
        await pilot.press("h", "i", "ctrl+j", "y", "o")
        assert app.query_one(PromptInput).text == "hi\nyo"
        assert not replies(app)


async def test_fast_typing_then_enter_sends_everything_typed(engine):
    """Keys arrive in a burst (paste-speed typing, tmux send-keys): Enter must not
    overtake characters still queued for the input box."""
    app = ChatApp(*chat_config(sampling=GREEDY, max_tokens=4), engine=engine)
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: app.query_one(GaugeBar).state == "ready")
        app.query_one(PromptInput).focus()
        text = "Write a haiku about the sea."
        for ch in text:
            app.post_message(events.Key(ch, ch))
        app.post_message(events.Key("enter", "\r"))
        await wait_until(pilot, lambda: len(app.session.history) == 2 and not app.generating)
        assert app.session.history[0].content == text
        assert app.query_one(PromptInput).text == ""


async def test_history_longer_than_context_drops_oldest_turns_and_says_so(small_engine):
    app = ChatApp(*chat_config(system="Be brief.", sampling=GREEDY, max_tokens=8),
                  engine=small_engine)
    async with app.run_test(size=(100, 40)) as pilot:
        await wait_until(pilot, lambda: app.query_one(GaugeBar).state == "ready")
        for i in range(4):  # ~60 tokens a turn against a 256-token context: the 4th drops one
            await send(pilot, f"Fact {i}: " + "the ocean is deep and the sky is wide. " * 5)
            await wait_until(pilot, lambda: not app.generating and len(app.session.history) == 2 * (i + 1) + 1)
        notices = [str(n.render()) for n in app.query(".notice")]
        assert any(re.search(r"\d+ earlier turn\(s\) dropped", n) for n in notices), notices
        assert app.session.history[0].role == "system"
        assert all(m.content for m in app.session.history if m.role == "assistant")


async def test_message_longer_than_the_context_is_an_error_not_a_crash(small_engine):
    app = ChatApp(*chat_config(sampling=GREEDY, max_tokens=8), engine=small_engine)
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: app.query_one(GaugeBar).state == "ready")
        await send(pilot, "word " * 600)
        reply = replies(app)[-1]
        await wait_until(pilot, lambda: "error" in str(reply.status.render()))
        assert re.search(r"prompt is \d+ tokens but the context window is \d+", str(reply.status.render()))
        assert app.session.history == [] and not app.generating
        await send(pilot, "Hi")  # the chat still works
        await wait_until(pilot, lambda: len(app.session.history) == 2 and not app.generating)


async def test_ctrl_q_quits_cleanly(engine):
    app = ChatApp(*chat_config(sampling=GREEDY), engine=engine)
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: app.query_one(GaugeBar).state == "ready")
        await pilot.press("ctrl+q")
        await pilot.pause()
    assert app.return_code == 0


async def test_app_loads_the_model_itself_without_blocking(tmp_path):
    """No engine passed in: the app loads `default` in a worker and shows progress."""
    app = ChatApp(*chat_config(ctx_size=256))
    async with app.run_test() as pilot:
        gauges = app.query_one(GaugeBar)
        assert gauges.state in ("loading model…", "ready")
        await wait_until(pilot, lambda: gauges.state == "ready")
        assert "SmolLM2" in str(app.query_one("#title").render()) or app.session.engine.info.name
        await pilot.press("ctrl+q")


async def test_unloadable_model_is_reported_in_the_ui(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a model")
    app = ChatApp(*chat_config(model=str(bad)))
    async with app.run_test() as pilot:
        gauges = app.query_one(GaugeBar)
        await wait_until(pilot, lambda: gauges.state == "model failed to load")
        notices = [str(n.render()) for n in app.query(".notice")]
        assert any("not a GGUF" in n for n in notices), notices


async def test_screenshot_without_a_downloads_folder_saves_in_cwd(engine, tmp_path, monkeypatch):
    import platformdirs

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(platformdirs, "user_downloads_dir", lambda: str(tmp_path / "missing"))
    app = ChatApp(*chat_config(), engine=engine)
    async with app.run_test() as pilot:
        app.action_screenshot()
        await wait_until(pilot, lambda: list(tmp_path.glob("*.svg")))
        await wait_until(pilot, lambda: len(app._notifications) > 0)  # the save thread is done
    assert "localchat" in next(tmp_path.glob("*.svg")).read_text()


async def test_chat_on_the_torch_engine(torch_engine):
    app = ChatApp(*chat_config(sampling=GREEDY, max_tokens=16), engine=torch_engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: app.query_one(GaugeBar).state == "ready")
        await send(pilot, "Hello! Who are you?")
        await wait_until(pilot, lambda: len(app.session.history) == 2 and not app.generating)
        assert replies(app)[-1].markdown.source.strip()
        assert "torch" in str(app.query_one("#title").render())
        stats = app.query_one(GaugeBar).stats  # the reply is done: its blocks are cached now,
        # still held for the conversation, and the gauge shows them (it read 0 before)
        assert stats.kv_cache_bytes == stats.context_tokens // 16 * 16 * 23040 > 0
        assert "KV 0.0/" not in format_gauges(stats, "ready")


def test_kv_bar_shows_used_cached_and_free():
    from localchat.tui.widgets import kv_bar

    assert kv_bar(used=2, capacity=8, cached=4) == "██▒▒▒▒░░"
    assert kv_bar(used=0, capacity=8) == "░" * 8
    assert kv_bar(used=1, capacity=1000) == "█" + "░" * 7  # in use is never drawn as empty


async def test_a_reply_keeps_its_single_line_breaks():
    """Unfenced code (or any lines) in a reply is not joined into one paragraph line."""
    from textual.app import App
    from textual.widgets._markdown import MarkdownParagraph

    class OneMessage(App):
        def compose(self):
            yield MessageView("assistant", "Here:\nimport os\nprint(os.getcwd())\n\nDone.")

    app = OneMessage()
    async with app.run_test() as pilot:
        await pilot.pause()
        view = app.query_one(MessageView)
        await view.markdown.append("\nBye.")  # streamed text goes through the same parser
        await pilot.pause()
        paragraphs = [p._content.plain for p in app.query(MarkdownParagraph)]
        assert paragraphs == ["Here:\nimport os\nprint(os.getcwd())", "Done.\nBye."]


async def test_a_base_model_is_said_once_in_the_chat(tmp_path):
    """A GGUF with no chat template and no chat tokens: one notice when it loads."""
    from helpers.gguf_builder import base_model_copy, bundled_path

    base = base_model_copy(bundled_path(), tmp_path / "base.gguf")
    app = ChatApp(*chat_config(model=str(base), ctx_size=256, threads=1))
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: app.query_one(GaugeBar).state == "ready", timeout=120)
        app.show_engine()  # shown again (as after a reload): still said once
        await pilot.pause()
        notices = [str(n.render()) for n in app.query(".notice")]
        assert sum("this looks like a base model (no chat template): replies continue "
                   "your text" in n for n in notices) == 1, notices


async def test_the_chat_says_it_measures_the_engines_and_which_it_chose(monkeypatch):
    """Where both executors run the file and nothing is measured yet, the chat's first load
    says it measures them, then which it took and on what figures (the probe's own timing
    is stood in for here: test_engine_rule.py runs it for real)."""
    from localchat.engine import engine_probe
    from localchat.engine.engine_figures import Figures

    measured = {"llama.cpp": Figures(1.0, 400.0, 100.0, 100.0),
                "torch": Figures(5.0, 300.0, 90.0, 300.0)}
    monkeypatch.delenv("LOCALCHAT_ENGINE")
    monkeypatch.setattr(engine_probe, "measure", lambda facts, engine, threads: measured[engine])
    app = ChatApp(*chat_config(ctx_size=256, threads=1))
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: app.query_one(GaugeBar).state == "ready", timeout=120)
        notices = [str(n.render()) for n in app.query(".notice")]
        assert app.session.engine.name == "llama.cpp"
        assert any(n.startswith("measuring llama.cpp and torch on SmolLM2-135M-Instruct to "
                                "choose the faster (once for this file and CPU; kept in ")
                   for n in notices), notices
        assert ("engine llama.cpp: measured here for a chat reply, 1/10 of the start "
                "included: llama.cpp 1.70 s, torch 2.35 s") in notices, notices
