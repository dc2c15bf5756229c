"""Small things a new user met on a first hour (issue 56), without a model: a one-token
reply's status line, the bench's words for the bare llama.cpp loop and the weights, cache ls
with a long model name, distill's time left, serve's compile note only when it compiles."""

from __future__ import annotations

import io

from localchat.chat.session import Entry
from localchat.engine.base import Stats
from localchat.tui.chat_log import status_line


def test_a_one_token_reply_says_one_token_and_no_rate():
    line = status_line(Entry("assistant", "Hi", stats=Stats(completion_tokens=1, ttft_s=0.1)))
    assert line.startswith("1 token · TTFT 100 ms") and "tok/s" not in line
    many = status_line(Entry("assistant", "Hi there", stats=Stats(completion_tokens=2,
                                                                  decode_tok_s=50.0)))
    assert many.startswith("2 tokens · 50.0 tok/s")


def test_the_bare_loop_is_not_called_a_limit_and_the_weights_are_explained():
    from localchat.cli.bench import format_table

    spread = {"prefill_tok_s": {"median": 300.0, "min": 290, "max": 310},
              "decode_tok_s": {"median": 20.0, "min": 19, "max": 21}}
    engine = {"prefill_tok_s": 300.0, "decode_tok_s": 20.0, "ttft_s": 0.1, "ttft_turn1_s": 0.1,
              "ttft_turn8_s": 0.1, "kv_bytes_per_token": 23040, "spread": spread}
    report = {"model": "m", "repeats": 1, "prompt_tokens": 16, "gen_tokens": 8,
              "engines": {"torch": {**engine, "weights_bytes": 98_300_000},
                          "llama.cpp": {**engine, "weights_bytes": 96_600_000}},
              "kernel_limit": {"decode_tok_s": 13.1, "sequences": 4, "decode_4_tok_s": 30.0,
                               "aggregate_4_tok_s": 40.0}}
    text = format_table(report)
    assert "kernel limit" not in text and "bare llama_decode loop" in text
    assert "above it is noise" in text and "weights: llama.cpp maps the file" in text


def test_cache_ls_shows_a_long_model_name_whole(capsys):
    from localchat.cli import main
    from localchat.storage.kv_snapshots import KVSnapshotStore

    name = "/models/Meta-Llama-3.1-8B-Instruct-abliterated-Q4_K_M.gguf"
    store = KVSnapshotStore()
    assert store.put(name, "llama.cpp|1|2|f16", list(range(32)), [b"a" * 16, b"b" * 16], b"x" * 10)
    store.flush()
    assert main(["cache", "ls"]) == 0
    assert "Meta-Llama-3.1-8B-Instruct-abliterated-Q4_K_M.gguf" in capsys.readouterr().out


def test_progress_says_the_time_left_at_this_runs_pace():
    from quantize.progress import Progress

    bar = Progress("distilling", 10, stream=io.StringIO())
    bar.advance(3)  # a resumed run's first advance: its earlier work, not this run's pace
    assert bar.eta() is None
    bar._counted_from = (3, 0.0)  # this run's pace counts from there, at t = 0
    bar.advance(2)
    assert round(bar.eta(now=4.0)) == 10  # 2 steps in 4 s: 5 left take 10 s


def test_serve_says_it_compiles_only_before_any_layers_are_compiled(tmp_path, monkeypatch):
    from localchat.server import run as server_run

    monkeypatch.setattr("localchat.paths.cache_dir", lambda: tmp_path)
    assert server_run._first_torch_start()
    (tmp_path / "aot").mkdir()
    (tmp_path / "aot" / "decode-layer-abc.pt2").write_bytes(b"")
    assert not server_run._first_torch_start()
