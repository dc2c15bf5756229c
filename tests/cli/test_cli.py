"""The real `localchat` command in a subprocess: one-shot runs and bad input."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from localchat.engine.base import Request, SamplingParams
from helpers.cli import assert_one_line_error, localchat

pytestmark = pytest.mark.subprocess  # runs the CLI or starts a process


def test_run_json_has_text_and_positive_stats():
    proc = localchat("run", "What is the capital of France?", "-n", "32", "--temp", "0", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["text"].strip()
    for key in ("ttft_s", "decode_tok_s", "prefill_tok_s",
                "kv_cache_capacity_bytes", "prompt_tokens", "completion_tokens"):
        assert out[key] > 0, key
    # finished: its full blocks stay cached for the conversation, which still holds them;
    # nothing else was ever cached in this process
    per_token = out["kv_cache_capacity_bytes"] // out["context_capacity"]
    assert out["kv_cache_bytes"] == out["context_tokens"] // 16 * 16 * per_token > 0
    assert out["kv_cache_cached_bytes"] == 0
    assert out["finish_reason"] in ("stop", "length")
    assert out["engine"] == "llama.cpp" and out["model"]
    assert out["cached_tokens"] == 0


def test_run_streams_reply_only_on_stdout_and_stats_on_stderr():
    proc = localchat("run", "Which city is the capital of France?", "-n", "32", "--temp", "0",
                     "--verbose")
    assert proc.returncode == 0, proc.stderr
    assert "France" in proc.stdout or "Paris" in proc.stdout  # on topic (its words vary
    # with the KV cache's rounding: a 135M model's near-ties)
    assert "eval rate" not in proc.stdout
    for field in ("time to first token", "prompt eval rate", "eval rate", "kv cache"):
        assert field in proc.stderr
    kv_line = next(line for line in proc.stderr.splitlines() if line.startswith("kv cache:"))
    assert not kv_line.split(":", 1)[1].strip().startswith("0 B")  # the conversation's KV


def test_stdin_comes_first_then_the_argument():
    proc = localchat("run", "-", "-n", "8", "--temp", "0", "--json",
                     stdin="The capital of France is Paris.\n")
    assert proc.returncode == 0, proc.stderr
    piped_only = json.loads(proc.stdout)["prompt_tokens"]
    proc2 = localchat("run", "Repeat it.", "-n", "8", "--temp", "0", "--json",
                      stdin="The capital of France is Paris.\n")
    both = json.loads(proc2.stdout)["prompt_tokens"]
    assert both > piped_only


def test_system_prompt_and_sampling_flags_are_accepted():
    proc = localchat("run", "Hi", "-sys", "Answer in one word.", "-n", "4", "--temp", "0.7",
                     "--top-k", "20", "--top-p", "0.9", "--min-p", "0.1",
                     "--repeat-penalty", "1.1", "--seed", "7", "-c", "256", "--threads", "1",
                     "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["kv_cache_capacity_bytes"] == 256 * 23040  # one KV slot: f16 K and V


def test_prompt_longer_than_context_is_a_clear_error():
    proc = localchat("run", "word " * 600, "-c", "256")
    assert_one_line_error(proc, "256 tokens")
    assert proc.returncode == 1


def test_a_tiny_context_is_honoured_or_refused_in_one_line():
    long = "Hello there, how are you today? Please tell me about your day in great detail."
    assert_one_line_error(localchat("run", "-c", "32", long), "context window is 32 tokens")
    proc = localchat("run", "-c", "40", "-n", "2", "--json", "Hi")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["context_capacity"] == 40  # not rounded up to 256


def test_a_prompt_beyond_the_templates_output_limit_says_its_tokens_and_the_context():
    proc = localchat("run", "-n", "4", stdin="word " * 1_000_000)  # 5 MB, over 4 MiB rendered
    assert_one_line_error(proc, "the prompt is 1000001 tokens", "context window is 4096 tokens")


@pytest.mark.parametrize("content, name", [
    (None, "missing.gguf"),
    (b"hello, I am not a model\n" * 10, "notes.gguf"),
    (b"\x80\x04\x95" + b"\x00" * 64, "evil.gguf"),
    (b"PK\x03\x04" + b"\x00" * 64, "model.gguf"),
    (b"\x00" * 64, "weights.pt"),
    (b"\x00" * 64, "pytorch_model.bin"),
])
def test_bad_model_files_are_one_line_errors(tmp_path, content, name):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    proc = localchat("run", "hi", "-m", str(path))
    assert_one_line_error(proc)


@pytest.mark.model
def test_truncated_gguf_is_a_one_line_error(tmp_path):
    from localchat.models.specs import resolve_model

    data = resolve_model("default").read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[: len(data) // 2])
    assert_one_line_error(localchat("run", "hi", "-m", str(path)), "cut.gguf")


@pytest.mark.parametrize("spec", ["owner/repo:../../etc/passwd.gguf", "owner/repo:/etc/x.gguf",
                                  "../repo:model.gguf"])
def test_hub_refs_escaping_the_cache_are_refused(spec):
    proc = localchat("run", "hi", "-m", spec)
    assert_one_line_error(proc)
    assert proc.returncode == 2


def test_no_prompt_is_a_usage_error():
    assert_one_line_error(localchat("run"), "no prompt")


def test_bad_sampling_value_is_a_usage_error():
    assert_one_line_error(localchat("run", "hi", "--temp", "-1"), "temperature")


@pytest.mark.parametrize("flag,value", [("--temp", "inf"), ("--temp", "nan"),
                                        ("--repeat-penalty", "inf"), ("--top-p", "nan")])
def test_non_finite_sampling_values_are_refused(flag, value):
    assert_one_line_error(localchat("run", "hi", flag, value), "got")


@pytest.mark.parametrize("args", [["run", "--seed", "abc", "hi"], ["run", "--bogus", "hi"],
                                  ["--bogus"]])
def test_a_bad_flag_is_one_line_naming_it(args):
    proc = localchat(*args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "error:" in lines[0] and "--help" in lines[0], proc.stderr
    assert ("--seed" if "--seed" in args else "--bogus") in lines[0]
    assert lines[0].startswith("localchat run: error:" if args[0] == "run" else "localchat: error:")


def test_llama_cpp_spellings_of_the_flags(tmp_path):
    """-s is the seed (not the system prompt), -sys the system prompt, -p/-f the prompt,
    -t threads, -ngl GPU layers, --n-predict the token limit: as llama.cpp users type them."""
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Name a colour.\n")
    common = ["-sys", "Answer in one word.", "--temp", "1.5", "-t", "2", "-ngl", "0", "--json"]
    runs = [localchat("run", *common, *args) for args in (
        ["-s", "7", "-f", str(prompt), "--n-predict", "6"],
        ["--seed", "7", "-p", "Name a colour.", "-n", "6"])]
    for proc in runs:
        assert proc.returncode == 0, proc.stderr
    first, second = (json.loads(p.stdout) for p in runs)
    assert first["text"] == second["text"] and first["completion_tokens"] <= 6
    assert_one_line_error(localchat("run", "-s", "abc", "hi"), "-s/--seed", "'abc'")
    assert_one_line_error(localchat("run", "-f", str(tmp_path / "none.txt")), "-f", "cannot read")
    assert_one_line_error(localchat("run", "-ngl", "-2", "hi"), "-ngl/--n-gpu-layers")


@pytest.mark.parametrize("url", ["http://[::1", "http://localhost:abc/v1"])
def test_an_unparsable_endpoint_url_is_one_line(url):
    assert_one_line_error(localchat("run", "--endpoint", url, "hi"), "--endpoint", "not a valid URL")


def test_stdin_that_is_not_utf8_is_replaced_and_said(tmp_path):
    done = subprocess.run([sys.executable, "-m", "localchat", "run", "-n", "2", "--temp", "0"],
                          input=b"\xff\xfe hello \xc3", capture_output=True, timeout=120)
    err = done.stderr.decode()
    assert done.returncode == 0 and "Traceback" not in err, err
    assert "not valid UTF-8; 3 invalid byte sequence(s) replaced" in err


def test_ctrl_c_stops_the_reply_keeps_the_text_and_exits_130():
    proc = subprocess.Popen(
        [sys.executable, "-m", "localchat", "run", "Write a long story about a dragon.",
         "-n", "2000", "--temp", "0", "--verbose"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stdout.read(20)  # the reply has started streaming
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert len(first + rest) >= 20
    assert "Traceback" not in err
    assert "finish reason:        cancelled" in err


@pytest.mark.slow
def test_bench_json_has_both_engines_side_by_side():
    proc = localchat("bench", "-p", "32", "-g", "8", "-r", "1", "-c", "512", "--json",
                     timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert set(report["engines"]) == {"torch", "llama.cpp"}
    for figures in report["engines"].values():
        for key in ("prefill_tok_s", "decode_tok_s", "ttft_s", "ttft_turn1_s", "ttft_turn8_s",
                    "weights_bytes", "kv_bytes_per_token"):
            assert figures[key] > 0, key
    assert report["engines"]["torch"]["kv_bytes_per_token"] == 23040  # f16 K and V
    assert report["engines"]["llama.cpp"]["kv_bytes_per_token"] == 23040  # f16 K and V too
    assert report["engines"]["torch"]["kernels"]["ffn_down 576x1536 Q4_1"] in (
        "int4pack", "q4q8", "q41x8")
    assert report["engines"]["llama.cpp"]["compute"].startswith("llama.cpp CPU ")  # the variant
    assert report["engines"]["torch"]["compute"].startswith("torch CPU capability ")
    limit = report["kernel_limit"]  # the bare llama_decode loop, same process
    assert limit["decode_tok_s"] > 0 and limit["decode_16_tok_s"] > 0
    assert limit["aggregate_16_tok_s"] > 0


# slow (three whole benches, ~50 s): bench's own hygiene (KV snapshots off unless asked for),
# a benchmark's concern rather than a user's path; `make test-all` and CI run it
@pytest.mark.slow
@pytest.mark.model
def test_bench_computes_every_prompt_it_times_not_an_earlier_runs_kv_from_disk(tmp_path):
    """A second bench over the same prompts (≥ 256 tokens: long enough for KV snapshots)
    must prefill them again: the torch executor's prefill was measured at 0.80x of
    llama-bench where two of three repeats restored 496 tokens an earlier run had saved."""
    env = {"LOCALCHAT_HOME": str(tmp_path)}
    for _ in range(2):
        proc = localchat("bench", "--engines", "llama.cpp", "-p", "300", "-g", "2", "-r", "1",
                         "-c", "1024", "--json", env_extra=env, timeout=300)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["engines"]["llama.cpp"]["cached_tokens"] == [0]
    assert not list(tmp_path.rglob("*.kv"))  # nothing saved either
    with_disk = localchat("bench", "--engines", "llama.cpp", "-p", "300", "-g", "2", "-r", "1",
                          "-c", "1024", "--kv-disk", "1GiB", "--json", env_extra=env, timeout=300)
    assert with_disk.returncode == 0, with_disk.stderr
    assert list(tmp_path.rglob("*.kv"))  # asked for: the snapshots are used


@pytest.mark.slow
def test_bench_concurrency_section_compares_batching_with_one_at_a_time():
    proc = localchat("bench", "--engines", "", "-c", "512", "--concurrency", "1,3", "--json",
                     timeout=600)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert set(report["concurrency"]) == {"1", "3"}
    modes = {"torch", "llama.cpp", "llama.cpp one at a time"}
    for level in report["concurrency"].values():
        assert set(level) == modes
        for figures in level.values():
            assert figures["aggregate_tok_s"] > 0
            assert 0 < figures["p50_latency_s"] <= figures["p95_latency_s"] <= figures["max_latency_s"]
    assert set(report["concurrency_knee"]) == modes


def test_bench_concurrency_levels_are_checked():
    proc = localchat("bench", "--concurrency", "4,x")
    assert proc.returncode == 2 and "--concurrency takes numbers" in proc.stderr


def test_knee_is_where_throughput_stops_growing_but_latency_does_not():
    from localchat.bench.concurrency import knee

    def row(tok_s, p50):
        return {"torch": {"aggregate_tok_s": tok_s, "p50_latency_s": p50}}

    table = {"1": row(60, 1.0), "4": row(200, 1.3), "16": row(220, 4.0), "64": row(225, 15.0)}
    assert knee(table, "torch") == 4
    assert knee({"1": row(60, 1.0), "4": row(200, 1.3)}, "torch") is None


def test_an_endpoint_that_accepts_and_never_answers_fails_in_one_line_after_timeout():
    silent = socket.create_server(("127.0.0.1", 0))  # listens; the kernel accepts, nobody reads
    try:
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/v1"
        proc = localchat("run", "--endpoint", url, "--timeout", "1", "hi", timeout=60)
        assert_one_line_error(proc, f"{url} did not answer within 1 s", "raise the timeout")
        proc = localchat("run", "--endpoint", url, "--timeout", "0", "hi", timeout=60)
        assert_one_line_error(proc, "--timeout must be more than 0 seconds")
    finally:
        silent.close()


def test_timeout_without_an_endpoint_is_refused():
    assert_one_line_error(localchat("run", "--timeout", "5", "hi"), "--timeout is for an endpoint")


@pytest.mark.parametrize("args", [["run"], ["run", "--engine", "torch"]])
def test_a_fifo_named_like_a_model_is_refused_not_read_forever(tmp_path, args):
    fifo = tmp_path / "x.gguf"
    os.mkfifo(fifo)
    proc = localchat(*args, "-m", str(fifo), "hi", timeout=60)  # the timeout guards a hang
    assert_one_line_error(proc, "is not a regular file")
    proc = localchat("quantize", str(fifo), "-o", str(tmp_path / "y.gguf"), "--type", "Q8_0",
                     timeout=60)
    assert_one_line_error(proc, "is not a regular file")
    assert not (tmp_path / "y.gguf").exists() and not list(tmp_path.glob(".y.gguf*"))


def test_a_context_beyond_the_trained_one_is_refused_before_allocating():
    proc = localchat("run", "-c", "1000000000", "hi", timeout=60)
    assert_one_line_error(proc, "-c/--ctx-size 1000000000 is more than", "trained context of 8192 tokens")


@pytest.mark.model  # loads the model before refusing its cache
@pytest.mark.parametrize("engine_name", ["llama.cpp", "torch"])
def test_a_kv_cache_the_memory_cannot_hold_is_refused_before_allocating(monkeypatch,
                                                                         engine_name):
    from localchat.engine import EngineConfig, open_engine
    from localchat.errors import UsageError

    monkeypatch.setattr("localchat.units.available_memory", lambda: 50 * 2**20)  # 50 MiB free
    with pytest.raises(UsageError, match=r"needs .* and 50\.0 MiB is available"):
        open_engine(EngineConfig("default", engine=engine_name, ctx_size=8192, parallel=1, threads=2))


def test_attached_text_feeds_prompt_lookup_drafts_and_the_stats_show_it(tmp_path):
    """An attached passage the reply copies is where prompt lookup finds its drafts. γ is
    fixed (--num-draft-tokens): the adaptive γ follows timings, which a loaded machine
    changes, and on llama.cpp the drafting pattern can move a near tie in the reply."""
    from localchat.bench.speculative import PASSAGE

    text = tmp_path / "passage.txt"
    text.write_text(PASSAGE)
    args = ("run", "--no-history", "--temp", "0", "-n", "60", "--draft", "ngram",
            "--num-draft-tokens", "4", "--json")
    quoted = localchat(*args, "--attach", str(text), "Repeat the attached text exactly.")
    unquoted = localchat(*args, "Write a story about a cat.")
    assert quoted.returncode == 0 and unquoted.returncode == 0, quoted.stderr + unquoted.stderr
    with_file, without = json.loads(quoted.stdout)["draft"], json.loads(unquoted.stdout)["draft"]
    assert with_file["source"] == "ngram" and with_file["accepted"] >= 30, with_file
    assert with_file["acceptance_rate"] > 0.9, with_file
    # a story's lookups match only what it wrote itself, and few of those drafts are kept
    assert without["acceptance_rate"] < with_file["acceptance_rate"] / 3, (with_file, without)


def test_attach_puts_a_named_text_file_before_the_prompt_and_refuses_binaries(tmp_path):
    code = tmp_path / "add.py"
    code.write_text("def add(a, b):\n    return a + b\n")
    with_file = localchat("run", "--attach", str(code), "--temp", "0", "-n", "2", "--json",
                          "What does it do?")
    alone = localchat("run", "--temp", "0", "-n", "2", "--json", "What does it do?")
    assert with_file.returncode == 0, with_file.stderr
    assert json.loads(with_file.stdout)["prompt_tokens"] > json.loads(alone.stdout)["prompt_tokens"] + 10
    from localchat.storage import ConversationStore

    store = ConversationStore.open()  # the run's history: titled from the typed words
    assert [c.title for c in store.list_conversations()] == ["What does it do?"] * 2
    store.close()
    (tmp_path / "blob.bin").write_bytes(b"\x7fELF\x00\x01")
    assert_one_line_error(localchat("run", "--attach", str(tmp_path / "blob.bin"), "hi"),
                          "cannot attach blob.bin: it is a binary file")


@pytest.mark.model
def test_a_model_before_the_prompt_is_taken_as_ollama_run_takes_it(tmp_path):
    """`localchat run MODEL PROMPT`: the first word is the model when it names one."""
    from localchat.models.specs import resolve_model

    bundled = str(resolve_model("default"))
    greedy = ("-n", "4", "--temp", "0", "--no-draft", "--no-history", "--json")
    by_flag = localchat("run", "-m", bundled, "Say hi.", *greedy)
    by_word = localchat("run", bundled, "Say hi.", *greedy)
    assert by_flag.returncode == by_word.returncode == 0, by_word.stderr
    assert json.loads(by_word.stdout)["text"] == json.loads(by_flag.stdout)["text"]
    assert json.loads(by_word.stdout)["model_path"] == bundled
    # a short name that is not downloaded: the hub's one-line answer, not "unrecognized"
    offline = localchat("run", "smollm2:360m", "hi")
    assert_one_line_error(offline, "not downloaded", "SmolLM2-360M")
    assert "unrecognized" not in offline.stderr
    assert_one_line_error(localchat("run", "hello", "there"), "[MODEL] PROMPT")
    assert_one_line_error(localchat("run", "-m", bundled, "default", "hi"), "two models")


def test_one_word_is_the_prompt_unless_it_names_a_model():
    import argparse

    from localchat.cli.run import take_model_word

    def split(*words, model="default"):
        args = argparse.Namespace(words=list(words), model=model)
        return take_model_word(args), args.model, args.prompt

    assert split("hi") == (False, "default", "hi")
    assert split("smollm2:360m") == (True, "smollm2:360m", None)
    assert split("default", "hi") == (True, "default", "hi")
    assert split("What is 2/3:4?") == (False, "default", "What is 2/3:4?")


def test_a_prompt_too_long_for_a_file_name_is_never_taken_for_a_model():
    import argparse

    from localchat.cli.run import take_model_word

    for words in ("word " * 5000, "a" * 300, "two\nlines.gguf"):
        args = argparse.Namespace(words=[words], model="default")
        assert take_model_word(args) is False and args.prompt == words


def test_a_base_model_is_said_once_and_run_raw_continues_plain_text(tmp_path, engine):
    """A GGUF without a chat template or chat tokens: `run` says once that it is a base model;
    `run --raw` sends the prompt as plain tokens, as llama.cpp gets them (the reference)."""
    from helpers.gguf_builder import base_model_copy, bundled_path

    base = base_model_copy(bundled_path(), tmp_path / "base.gguf")
    text = "The capital of France is"
    chat = localchat("run", "-m", str(base), text, "-n", "4", "--temp", "0")
    assert chat.returncode == 0, chat.stderr
    assert chat.stderr.count("this looks like a base model (no chat template): replies "
                             "continue your text") == 1
    raw = localchat("run", "-m", str(base), "--raw", text, "-n", "8", "--temp", "0", "--json")
    assert raw.returncode == 0, raw.stderr
    assert "base model" not in raw.stderr
    out = json.loads(raw.stdout)
    reference = engine.complete(Request(prompt_tokens=engine.tokenize_text(text),
                                        sampling=SamplingParams(temperature=0), max_tokens=8))
    assert out["prompt_tokens"] == len(engine.tokenize_text(text))
    assert out["text"] == reference.text and out["text"].strip()
    normal = localchat("run", text, "-n", "2", "--temp", "0")  # a chat model: nothing said
    assert normal.returncode == 0 and "base model" not in normal.stderr
    assert_one_line_error(localchat("run", "--raw", "--continue", text), "--raw")


def test_a_one_shot_run_restores_the_chat_templates_first_block_from_the_last_run():
    """Every full 16-token block is kept on disk (kv_disk.MIN_TOKENS): a second process's
    different prompt restores the system prompt's block the first one saved, and the same
    prompt again restores all of its full blocks and gives the same greedy reply."""
    args = ("run", "--engine", "llama.cpp", "--temp", "0", "-n", "8", "--json")
    runs = [json.loads(localchat(*args, prompt).stdout)
            for prompt in ("Say hi.", "Name a colour.", "Say hi.")]
    first, other, again = runs
    assert first["restored_tokens"] == 0 and first["kv_saved"].startswith("saved: ")
    assert other["restored_tokens"] == 16, other  # the template's system prompt, one block
    assert again["restored_tokens"] == first["prompt_tokens"] // 16 * 16 > 16, again
    assert again["text"] == first["text"]
