"""`bench --task serve` through the real CLI: it starts a real `localchat serve` (and, where
LOCALCHAT_LLAMA_SERVER names a llama-server binary, that peer), streams concurrent chat
completions, and reports usage-counted tokens; bad peer paths are one-line errors."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.cli import assert_one_line_error, localchat
from localchat.bench.serve_task import conversations
from localchat.bench.served import start_peer
from localchat.engine.base import Message, Request, SamplingParams
from localchat.errors import EngineError

pytestmark = pytest.mark.subprocess  # runs the CLI or starts a process

GEN = 8


def bench_serve(*flags: str, timeout: float = 600) -> dict:
    proc = localchat("bench", "--task", "serve", "-g", str(GEN), "--concurrency", "2",
                     "-r", "1", "--json", *flags, timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def check_run(run: dict, n: int) -> None:
    """Every client cut at -g tokens by the server's own count; the aggregate, wall and
    TTFT figures are what the clients' times say."""
    clients = run["clients"]
    assert len(clients) == n
    for c in clients:
        assert c["tokens_from"] == "usage" and c["finish_reason"] == "length"
        assert c["completion_tokens"] == GEN
        assert 1 <= c["content_deltas"] <= GEN
        assert 0 < c["ttft_s"] <= c["finished_s"] - c["sent_s"]
    assert run["completion_tokens"] == sum(c["completion_tokens"] for c in clients)
    wall = max(c["finished_s"] for c in clients) - min(c["sent_s"] for c in clients)
    assert run["wall_s"] == pytest.approx(wall)
    assert run["aggregate_tok_s"] == pytest.approx(run["completion_tokens"] / wall)
    assert run["ttft_p50_s"] == pytest.approx(statistics.median(c["ttft_s"] for c in clients))
    assert run["ttft_p90_s"] == max(c["ttft_s"] for c in clients)  # nearest rank of 2


def test_serve_bench_on_llama_cpp_matches_the_engine(engine):
    """--engine passes through to serve; each streamed reply is the engine's own greedy
    reply to that prompt, of the token count usage gave."""
    report = bench_serve("--engine", "llama.cpp", "-t", "1")
    ours = report["servers"]["localchat"]
    assert list(report["servers"]) == ["localchat"] and "ratio" not in report
    assert ours["engine"] == "llama.cpp" and ours["command"][-6:] == [
        "--engine", "llama.cpp", "-t", "1", "--kv-disk", "0"]  # each round computes its prompts
    (run,) = ours["runs"]
    check_run(run, 2)
    assert ours["median"]["aggregate_tok_s"] == run["aggregate_tok_s"]
    for messages, client in zip(conversations(2), run["clients"]):
        reply = engine.complete(Request(
            messages=[Message(m["role"], m["content"]) for m in messages],
            sampling=SamplingParams(temperature=0.0), max_tokens=GEN))
        assert client["text"] == reply.text
        assert client["completion_tokens"] == reply.stats.completion_tokens


@pytest.mark.slow
def test_serve_bench_with_serve_defaults():
    """No engine flag: serve picks its own, by the rule choose() applies for many streams."""
    from localchat.engine import choose
    from localchat.engine.config import EngineConfig

    report = bench_serve()
    ours = report["servers"]["localchat"]
    assert ours["engine"] == choose(EngineConfig("default", use="many")).engine
    command = ours["command"]
    assert ("-m", "default") in zip(command, command[1:]) and "--engine" not in command
    check_run(ours["runs"][0], 2)


@pytest.mark.skipif(not os.environ.get("LOCALCHAT_LLAMA_SERVER"),
                    reason="LOCALCHAT_LLAMA_SERVER names no llama-server binary")
def test_serve_bench_beside_llama_server():
    peer = os.environ["LOCALCHAT_LLAMA_SERVER"]
    report = bench_serve("--engine", "llama.cpp", "-t", "1", "--peer-server", peer)
    ours, theirs = report["servers"]["localchat"], report["servers"]["llama-server"]
    assert theirs["command"][:1] == [peer] and "-np" in theirs["command"]
    assert "-c" not in theirs["command"] and report["ctx_per_request"] is None  # its default
    for side in (ours, theirs):
        check_run(side["runs"][0], 2)
    assert report["ratio"]["aggregate_tok_s"] == pytest.approx(
        ours["median"]["aggregate_tok_s"] / theirs["median"]["aggregate_tok_s"])


def test_bad_peer_paths_are_one_line_errors(tmp_path):
    plain = tmp_path / "plain"
    plain.write_text("not a program")
    broken = tmp_path / "broken"
    broken.write_text("#!/bin/sh\necho 'error: libggml.so: cannot open' >&2\nexit 127\n")
    broken.chmod(0o755)
    for path, needle in ((tmp_path / "missing", "no such file"),
                         (plain, "not an executable file"),
                         (broken, "libggml.so: cannot open")):
        proc = localchat("bench", "--task", "serve", "--peer-server", str(path))
        assert_one_line_error(proc, "--peer-server", needle)
        assert proc.returncode == 2
    assert_one_line_error(localchat("bench", "--peer-server", str(broken)), "--task serve")


def test_a_refused_request_is_a_one_line_error_naming_the_server():
    proc = localchat("bench", "--task", "serve", "--engine", "llama.cpp", "-t", "1", "-c", "256",
                     "-g", "1000", "--concurrency", "1", "-r", "1")
    assert proc.returncode == 1 and proc.stdout == "" and "Traceback" not in proc.stderr
    progress, error = proc.stderr.strip().splitlines()  # the round's line, then the error
    assert progress.startswith("round 1/1: localchat")
    assert error.startswith("localchat: error: localchat: client 0: POST /v1/chat/completions "
                            "answered 400") and "max_tokens" in error


def test_a_peer_that_fails_to_start_names_its_last_line(tmp_path):
    fake = tmp_path / "llama-server"
    fake.write_text("#!/bin/sh\necho 'loading model'\n"
                    "echo 'error: failed to load model' >&2\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(EngineError, match=r"llama-server exited \(1\) before it was ready: "
                                          r"error: failed to load model$"):
        start_peer(fake, tmp_path / "model.gguf", 2, 1, tmp_path)


def children(pid: int) -> set[int]:
    found = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found |= {int(c) for c in (task / "children").read_text().split()}
    return found


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs /proc")
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stopped_bench_stops_its_server(sig, code):
    """Ctrl+C (or SIGTERM) while the server starts or the clients run: the bench exits
    130 (143) and the server it started is gone."""
    proc = subprocess.Popen([sys.executable, "-m", "localchat", "bench", "--task", "serve",
                             "--engine", "llama.cpp", "-t", "1", "-g", "4000",
                             "--concurrency", "1", "-r", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        server = None
        while server is None and time.monotonic() < deadline:
            kids = children(proc.pid)
            for kid in kids:
                cmdline = Path(f"/proc/{kid}/cmdline").read_bytes().split(b"\0")
                if b"serve" in cmdline:
                    server = kid
            time.sleep(0.2)
        assert server is not None
        time.sleep(3)  # started: up, or the bench waiting for it
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            if server is not None and Path(f"/proc/{server}").exists():
                os.kill(server, signal.SIGKILL)  # an orphan would answer later tests' `ps`
    assert proc.returncode == code, err
    assert "Traceback" not in err
    assert not Path(f"/proc/{server}").exists() or \
        "Z" in Path(f"/proc/{server}/stat").read_text().split()[2]


def test_the_peer_runs_with_its_own_defaults_unless_a_context_is_asked_for():
    """As its users run it: -np N and -t, llama-server's own context; -c N per request is
    N × slots."""
    from localchat.bench.served import peer_command

    plain = peer_command(Path("/b/llama-server"), Path("/m.gguf"), 16, 2, 8080)
    assert plain == ["/b/llama-server", "-m", "/m.gguf", "-np", "16", "-t", "2", "--host",
                     "127.0.0.1", "--port", "8080"]
    sized = peer_command(Path("/b/llama-server"), Path("/m.gguf"), 16, 2, 8080, 512)
    assert sized[sized.index("-c") + 1] == "8192"
