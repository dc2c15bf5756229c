"""The remote engine against real OpenAI-compatible servers on loopback:
llama-cpp-python's own server on the bundled model (started once for the module), and
a few lines of stdlib HTTP for what a real server will not do on request (drop the
connection mid-reply)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from localchat.engine.base import (Delta, Message, Request, Result, SamplingParams, Tool,
                                   ToolCall)
from localchat.engine.remote import RemoteEngine
from localchat.engine.remote_http import split_endpoint
from localchat.engine.sse import sse_data
from localchat.errors import ContextOverflowError, EngineError, ModelNotFoundError, UsageError

from helpers.cli import assert_one_line_error, localchat

KEY = "test-key"
GREEDY = SamplingParams(temperature=0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, proc: subprocess.Popen, log, timeout: float = 60) -> None:
    import httpx2

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {log.read_text()[-2000:]}")
        try:
            httpx2.get(url, timeout=1)
            return
        except httpx2.HTTPError:
            time.sleep(0.2)
    raise RuntimeError(f"server at {url} did not come up")


@pytest.fixture(scope="module")
def server_url(tmp_path_factory):
    """llama-cpp-python's server on the bundled GGUF, with an API key, 2048 context, and
    flash attention on as in our llama.cpp executor (off, a near-tie token differed on AVX-512)."""
    from localchat.models.specs import bundled_model_path

    port = free_port()
    log = tmp_path_factory.mktemp("llama-server") / "log.txt"
    with open(log, "w") as out:  # a file, not a pipe: llama.cpp's load log would fill it
        proc = subprocess.Popen(
            [sys.executable, "-m", "llama_cpp.server", "--model", str(bundled_model_path()),
             "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "2048",
             "--n_threads", "2", "--api_key", KEY, "--flash_attn", "true"],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(f"http://127.0.0.1:{port}/v1/models", proc, log)
        yield f"http://127.0.0.1:{port}"  # no /v1: the engine adds it
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def remote(server_url):
    eng = RemoteEngine(server_url, api_key=KEY, ctx_size=2048)
    yield eng
    eng.close()


@pytest.fixture
def local():
    """The local reference: a llama.cpp engine of the bundled model, fresh for each test (a
    loaded one may hold a prompt's prefix from another test, the chat template's system
    prompt at least, computed in another batch, which its default f16 cache does not compute
    to the same bits: docs/architecture.md, "Exact batching"), with no snapshots and the
    server's 2 threads."""
    from localchat.engine import EngineConfig, open_engine

    eng = open_engine(EngineConfig("default", engine="llama.cpp", ctx_size=1024, threads=2,
                                   kv_disk=0))
    yield eng
    eng.close()


def ask(text: str, **options) -> Request:
    return Request(messages=[Message("user", text)], **{"sampling": GREEDY, **options})


@pytest.mark.subprocess
def test_streams_deltas_then_a_result_with_stats(remote):
    events = list(remote.generate(ask("What is the capital of France?", max_tokens=12)))
    deltas, result = events[:-1], events[-1]
    assert isinstance(result, Result) and all(isinstance(d, Delta) for d in deltas)
    assert result.text == "".join(d.text for d in deltas) and result.text.strip()
    assert result.finish_reason in ("stop", "length")
    s = result.stats
    assert s.completion_tokens == len(deltas) <= 12
    assert s.ttft_s > 0 and s.decode_tok_s > 0 and s.elapsed_s >= s.ttft_s
    assert s.prompt_tokens > 0 and s.context_tokens == s.prompt_tokens + s.completion_tokens
    assert s.context_capacity == 2048
    assert deltas[-1].stats.completion_tokens == len(deltas)
    assert remote.info.n_ctx == 2048 and remote.info.name.endswith(".gguf")
    assert remote.name == "remote"


@pytest.mark.subprocess
@pytest.mark.model
def test_greedy_is_stable_and_matches_the_local_llama_cpp_engine(remote, local):
    request = ask("Name three colors.", max_tokens=16)
    first, second = remote.complete(request), remote.complete(request)
    assert first.text.strip() and first.text == second.text
    assert first.text == local.complete(request).text


@pytest.mark.subprocess
def test_cancel_mid_stream_ends_promptly_and_the_engine_goes_on(remote):
    cancel = threading.Event()
    deltas = 0
    start = time.monotonic()
    for event in remote.generate(ask("Write a long essay about rivers.", max_tokens=1000),
                                 cancel):
        if isinstance(event, Delta):
            deltas += 1
            if deltas == 3:
                cancel.set()
    assert isinstance(event, Result) and event.finish_reason == "cancelled"
    assert event.stats.completion_tokens == 3
    assert time.monotonic() - start < 15
    assert remote.complete(ask("Hi", max_tokens=4)).text  # the server serves the next one


@pytest.mark.subprocess
def test_cancel_before_the_first_token_returns_at_once(remote):
    cancel = threading.Event()
    cancel.set()
    result = remote.complete(ask("Hi", max_tokens=4), cancel)
    assert result.finish_reason == "cancelled" and result.text == ""


@pytest.mark.subprocess
def test_too_long_prompt_is_a_context_overflow(remote):
    with pytest.raises(ContextOverflowError, match="2048"):
        remote.complete(ask("hello " * 3000, max_tokens=4))
    assert remote.complete(ask("Hi", max_tokens=2)).text  # and the connection recovers


@pytest.mark.subprocess
def test_continuing_a_reply_is_refused_not_garbled(remote):
    with pytest.raises(UsageError, match="continuing a stopped reply"):
        remote.complete(ask("Hi", assistant_prefix="Hello"))


@pytest.mark.subprocess
def test_tools_are_refused_not_dropped(remote):
    with pytest.raises(UsageError, match="tools are not supported with a remote endpoint"):
        remote.complete(ask("Weather?", tools=(Tool("get_weather"),)))
    answered = Request(messages=[Message("user", "Hi"), Message("assistant", "", tool_calls=(
        ToolCall("call_1", "get_weather"),)), Message("tool", "18 C", tool_call_id="call_1")])
    with pytest.raises(UsageError, match="tools are not supported"):
        remote.complete(answered)


@pytest.mark.subprocess
def test_count_prompt_tokens_uses_the_server_tokenizer(remote):
    short = remote.count_prompt_tokens([Message("user", "Hi")])
    longer = remote.count_prompt_tokens([Message("system", "Be brief."),
                                         Message("user", "hello " * 100)])
    assert 0 < short < 12
    assert 100 <= longer - short <= 115  # "hello" x100 is 100 tokens, plus one message


@pytest.mark.subprocess
def test_bad_key_and_unknown_model_are_typed_errors(server_url):
    with pytest.raises(UsageError, match="401"):
        RemoteEngine(server_url + "/v1/", api_key="wrong")
    with pytest.raises(ModelNotFoundError, match="no model 'nope'"):
        RemoteEngine(server_url, model="nope", api_key=KEY)


@pytest.mark.subprocess
@pytest.mark.model
def test_cli_run_through_the_endpoint_equals_the_local_engine(server_url, local):
    prompt = "What is the capital of France?"
    proc = localchat("run", "--endpoint", server_url + "/v1", "--temp", "0", "-n", "8",
                     "--json", prompt, env_extra={"LOCALCHAT_API_KEY": KEY})
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["engine"] == "remote" and out["completion_tokens"] <= 8
    assert out["text"] == local.complete(ask(prompt, max_tokens=8)).text


@pytest.mark.subprocess
def test_cli_errors_are_one_line(server_url):
    assert_one_line_error(localchat("run", "--endpoint", "http://127.0.0.1:1/v1", "hi"),
                          "cannot reach http://127.0.0.1:1/v1")
    proc = localchat("run", "--endpoint", server_url, "--api-key", "wrong", "hi")
    assert_one_line_error(proc, "401")
    assert proc.returncode == 2
    assert_one_line_error(localchat("run", "--endpoint", "127.0.0.1:1", "hi"),
                          "http:// or https://")


# --- a scripted server for what a real one will not do on request --------------------

class Scripted(BaseHTTPRequestHandler):
    chunks: list[str] = []  # SSE data lines sent before the connection is dropped
    refuse_extensions = False
    bodies: list[dict] = []  # the chat completion requests the client sent

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        if self.path != "/v1/models":
            self.send_error(404)
            return
        body = json.dumps({"data": [{"id": "scripted", "max_model_len": 512}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path.endswith("/chat/completions"):
            Scripted.bodies.append(body)
        if self.refuse_extensions and "top_k" in body:  # as OpenAI's own API does
            error = json.dumps({"error": {
                "message": "Unrecognized request argument supplied: top_k",
                "type": "invalid_request_error"}}).encode()
            self.send_response(400)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(error)))
            self.end_headers()
            self.wfile.write(error)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for data in self.chunks:
            self.wfile.write(f"data: {data}\n\n".encode())
        self.wfile.flush()  # and close: no finish_reason, no [DONE]


@pytest.fixture()
def scripted():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def chunk(**delta) -> str:
    return json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": None}]})


def test_a_dropped_connection_mid_reply_is_an_engine_error(scripted, monkeypatch):
    monkeypatch.setattr(Scripted, "chunks", [chunk(role="assistant"), chunk(content="Hel")])
    eng = RemoteEngine(scripted)
    assert eng.info.n_ctx == 512 and eng.info.name == "scripted"  # vLLM's max_model_len
    # no tokenize endpoint: counted by the documented estimate
    assert eng.count_prompt_tokens([Message("user", "x" * 30)]) == 10 + 5 + 3
    with pytest.raises(EngineError, match="closed mid-reply"):
        list(eng.generate(ask("Hi")))
    eng.close()


def test_usage_and_an_error_event_in_the_stream(scripted, monkeypatch):
    usage = {"prompt_tokens": 21, "completion_tokens": 2,
             "prompt_tokens_details": {"cached_tokens": 7}}
    monkeypatch.setattr(Scripted, "chunks", [
        chunk(content="A"), chunk(content="B"),
        json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}),
        json.dumps({"choices": [], "usage": usage}), "[DONE]"])
    eng = RemoteEngine(scripted)
    result = eng.complete(ask("Hi"))
    assert (result.text, result.finish_reason) == ("AB", "length")
    s = result.stats
    assert (s.prompt_tokens, s.cached_tokens, s.completion_tokens) == (21, 7, 2)
    monkeypatch.setattr(Scripted, "chunks", [json.dumps(
        {"error": {"message": "the request exceeds the available context size",
                   "type": "exceed_context_size_error"}})])
    with pytest.raises(ContextOverflowError):
        eng.complete(ask("Hi"))
    eng.close()


def test_sampling_extensions_are_dropped_for_a_server_that_refuses_them(scripted,
                                                                         monkeypatch):
    monkeypatch.setattr(Scripted, "refuse_extensions", True)
    monkeypatch.setattr(Scripted, "bodies", [])
    monkeypatch.setattr(Scripted, "chunks", [chunk(content="ok"), json.dumps(
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}), "[DONE]"])
    eng = RemoteEngine(scripted)
    assert eng.complete(ask("Hi")).text == "ok"
    assert eng.complete(ask("Hi")).text == "ok"
    assert ["top_k" in b for b in Scripted.bodies] == [True, False, False]  # asked once
    assert Scripted.bodies[-1]["temperature"] == 0 and Scripted.bodies[-1]["stream"] is True
    eng.close()


@pytest.mark.parametrize("url, base, root", [
    ("http://h:1", "http://h:1/v1", "http://h:1"),
    ("http://h:1/", "http://h:1/v1", "http://h:1"),
    ("http://h:1/v1/", "http://h:1/v1", "http://h:1"),
    ("https://h/openai/v1", "https://h/openai/v1", "https://h/openai"),
])
def test_endpoint_urls_with_or_without_v1(url, base, root):
    assert split_endpoint(url) == (base, root)


def test_sse_parsing():
    lines = [": comment", "event: x", "data: a", "data:b", "", "", "data: [DONE]", ""]
    assert list(sse_data(lines)) == ["a\nb", "[DONE]"]


# --- localchat's own server ------------------------------------------------------------

@pytest.fixture(scope="module")
def serve_url(tmp_path_factory):
    """`localchat serve` on the bundled model (llama.cpp, 1024 context), no key."""
    log = tmp_path_factory.mktemp("serve") / "log.txt"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "localchat", "serve", "-m", "default", "--port", "0",
             "--engine", "llama.cpp", "-c", "1024", "--threads", "2"],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            env={k: v for k, v in os.environ.items() if k != "LOCALCHAT_API_KEY"})
    try:
        deadline = time.monotonic() + 60
        while "serving" not in log.read_text():  # it prints its URL once it listens
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        url = log.read_text().split(" on ", 1)[1].split()[0]
        wait_for(url + "/models", proc, log)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@pytest.mark.subprocess
@pytest.mark.model
def test_against_localchat_serve(serve_url, local):
    eng = RemoteEngine(serve_url)
    try:
        assert eng.info.n_ctx == 1024  # from the model card's meta
        request = ask("What is the capital of France?", max_tokens=8)
        result, here = eng.complete(request), local.complete(request)
        assert result.text == here.text and result.text.strip()
        assert result.stats.prompt_tokens == here.stats.prompt_tokens  # usage from the server
        assert result.stats.completion_tokens == here.stats.completion_tokens
        cancel = threading.Event()
        for event in eng.generate(ask("Write a long essay about rivers.", max_tokens=500),
                                  cancel):
            cancel.set()
        assert event.finish_reason == "cancelled"
        with pytest.raises(ContextOverflowError):
            eng.complete(ask("hello " * 1500, max_tokens=4))
    finally:
        eng.close()


@pytest.mark.subprocess
async def test_the_chat_ui_runs_on_the_endpoint(server_url):
    """The TUI loads the remote engine from its settings and streams a reply."""
    from helpers.pilot import chat_config
    from localchat.tui.app import ChatApp
    from localchat.tui.widgets import GaugeBar, PromptInput

    app = ChatApp(*chat_config(sampling=GREEDY, max_tokens=16, endpoint=server_url,
                               api_key=KEY, ctx_size=2048))
    async with app.run_test(size=(100, 30)) as pilot:
        deadline = time.monotonic() + 30
        while app.query_one(GaugeBar).state != "ready":
            assert time.monotonic() < deadline
            await pilot.pause(0.05)
        assert app.session.engine.name == "remote"
        prompt = app.query_one(PromptInput)
        prompt.text = "Which city is the capital of France?"
        prompt.focus()
        await pilot.press("enter")
        while len(app.session.history) < 2 or app.generating:
            assert time.monotonic() < deadline + 30
            await pilot.pause(0.05)
        assert app.session.history[-1].content.strip()
        gauges = str(app.query_one(GaugeBar).render())
        assert "/2048" in gauges and "KV n/a" in gauges and "0 B" not in gauges
        title = str(app.query_one("#title").render())
        assert "remote · remote" not in title and app.session.engine.info.path in title
