"""`localchat run --batch FILE.jsonl` through the real command, on the bundled model:
results in input order, ids echoed, bad lines reported without stopping the rest."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from helpers.cli import localchat

pytestmark = pytest.mark.subprocess  # runs the CLI or starts a process

def jsonl(*objects) -> str:
    return "".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objects)


def records(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines()]


def test_order_ids_overrides_and_bad_lines_do_not_stop_the_rest(tmp_path):
    batch = tmp_path / "requests.jsonl"
    batch.write_text(jsonl(
        {"id": "long", "prompt": "Write a long story about a dragon.", "max_tokens": 40},
        {"prompt": "Hi"},  # no id: its line number, 2
        "",  # blank: skipped (but still counted as line 3)
        "{not json",
        {"id": "three", "prompt": "Count from one to ten.", "max_tokens": 3},
        {"id": "both", "prompt": "a", "messages": [{"role": "user", "content": "b"}]},
        {"id": "temp", "prompt": "a", "temperature": -1},
        {"id": "huge", "prompt": "hello " * 400},  # longer than -c 256
        {"id": "chat", "messages": [{"role": "system", "content": "Answer in one word."},
                                    {"role": "user", "content": "Capital of France?"}]},
    ))
    proc = localchat("run", "--batch", str(batch), "--temp", "0", "-n", "8", "-c", "256")
    assert proc.returncode == 1, proc.stderr  # some lines failed
    assert "Traceback" not in proc.stderr
    out = records(proc.stdout)
    assert [r["id"] for r in out] == ["long", 2, 4, "three", "both", "temp", "huge", "chat"]
    ok = {r["id"]: r for r in out if "error" not in r}
    errors = {r["id"]: r["error"] for r in out if "error" in r}
    assert set(ok) == {"long", 2, "three", "chat"}
    assert "line 4" in errors[4] and "JSON" in errors[4]
    assert "exactly one of 'prompt' or 'messages'" in errors["both"]
    assert "temperature must be >= 0" in errors["temp"]
    assert "context window" in errors["huge"]
    assert all("\n" not in e for e in errors.values())
    assert ok["long"]["stats"]["completion_tokens"] == 40  # the line's max_tokens, not -n
    assert ok["three"]["stats"]["completion_tokens"] <= 3
    assert ok[2]["stats"]["completion_tokens"] <= 8
    for r in ok.values():
        assert r["text"] and r["finish_reason"] in ("stop", "length")
        assert r["stats"]["prompt_tokens"] > 0


def test_a_lone_surrogate_or_non_utf8_line_is_that_lines_error_only(tmp_path):
    batch = tmp_path / "requests.jsonl"
    batch.write_bytes(b"".join([
        b'{"id": "a", "prompt": "Hi"}\n',
        b'{"id": "sur", "prompt": "bad \\ud800 half"}\n',  # valid JSON, not Unicode
        b'{"id": "bytes", "prompt": "caf\xe9"}\n',  # Latin-1, not UTF-8
        b'{"id": "b", "prompt": "Hello"}\n',
    ]))
    proc = localchat("run", "--batch", str(batch), "--temp", "0", "-n", "2")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    out = records(proc.stdout)
    assert [r["id"] for r in out] == ["a", "sur", "bytes", "b"]
    assert "text" in out[0] and "text" in out[3]
    for r, n in ((out[1], 2), (out[2], 3)):
        assert r["error"].startswith(f"line {n}: prompt is not valid Unicode")


def test_a_huge_seed_or_deep_nesting_is_that_lines_error_only(tmp_path):
    """Issue 39 #14/#15: a seed >= 2^64 (OverflowError) or a line nested 5,000 deep
    (RecursionError) aborted the whole batch, losing the valid lines."""
    batch = tmp_path / "requests.jsonl"
    batch.write_text(jsonl(
        {"id": "a", "prompt": "Hi", "seed": 2**64 - 1},
        {"id": "seed", "prompt": "Hi", "seed": 99999999999999999999999},
        "[" * 5000 + "]" * 5000,
        '{"id": "deep", "prompt": "Hi", "x": ' + "[" * 5000 + "]" * 5000 + "}",
        {"id": "b", "prompt": "Hello"},
    ))
    proc = localchat("run", "--batch", str(batch), "--temp", "0", "-n", "2")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    out = records(proc.stdout)
    assert [r["id"] for r in out] == ["a", "seed", 3, 4, "b"]
    assert "text" in out[0] and "text" in out[4]
    assert out[1]["error"] == ("line 2: seed must be in [0, 18446744073709551615], "
                               "got 99999999999999999999999")
    assert out[2]["error"] == out[3]["error"].replace("4", "3") == "line 3: JSON nested too deeply"


@pytest.mark.parametrize("engine", ["llama.cpp", "torch"])
def test_a_seed_past_64_bits_is_a_one_line_error(engine):
    proc = localchat("run", "--engine", engine, "-s", "99999999999999999999999", "-n", "2", "Hi")
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "localchat: error: seed must be in [0, 18446744073709551615], "
        "got 99999999999999999999999"]


def test_stdin_and_all_good_exits_0():
    proc = localchat("run", "--batch", "-", "--temp", "0", "-n", "4",
                     stdin=jsonl({"prompt": "Hello"}, {"id": "x", "prompt": "Bye"}))
    assert proc.returncode == 0, proc.stderr
    out = records(proc.stdout)
    assert [r["id"] for r in out] == [1, "x"]
    assert all(r["stats"]["completion_tokens"] <= 4 for r in out)


# torch slow: --batch is the chat layer's, the same for both engines; torch's greedy replies
# repeat in-process (test_torch_engine.py) and through `run --json` (test_speculative_engine.py)
@pytest.mark.parametrize("engine", ["llama.cpp", pytest.param("torch", marks=pytest.mark.slow)])
def test_greedy_batch_line_equals_run(engine, tmp_path):
    prompt = "What is the capital of France?"
    flags = ["--engine", engine, "--temp", "0", "-n", "8", "-sys", "Be brief."]
    if engine == "llama.cpp":  # a batched reply's bits are its alone's (llama.cpp's f16 KV: nearly)
        flags.append("--exact-batching")
    single = localchat("run", *flags, "--json", prompt)
    assert single.returncode == 0, single.stderr
    batch = localchat("run", "--batch", "-", *flags,
                      stdin=jsonl({"prompt": prompt}, {"prompt": "Tell me a joke."}))
    assert batch.returncode == 0, batch.stderr
    assert records(batch.stdout)[0]["text"] == json.loads(single.stdout)["text"]


def test_missing_file_is_a_one_line_error():
    proc = localchat("run", "--batch", "/nonexistent/requests.jsonl")
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "localchat: error: cannot read /nonexistent/requests.jsonl: No such file or directory"]


def test_a_prompt_with_batch_is_a_usage_error(tmp_path):
    proc = localchat("run", "--batch", "-", "hello")
    assert proc.returncode == 2 and "give no PROMPT" in proc.stderr


def test_ctrl_c_cancels_in_flight_lines(tmp_path):
    batch = tmp_path / "requests.jsonl"
    batch.write_text(jsonl({"id": "first", "prompt": "Hi", "max_tokens": 1},
                           *({"prompt": "Write a very long essay about rivers.",
                              "max_tokens": 2000} for _ in range(3))))
    proc = subprocess.Popen([sys.executable, "-m", "localchat", "run", "--batch", str(batch), "-n", "8"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    first = json.loads(proc.stdout.readline())  # generation is under way
    assert first["id"] == "first"
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "cancelled" in stderr
    rest = records(stdout)
    assert len(rest) <= 3
    assert all(r["finish_reason"] == "cancelled" for r in rest)
