"""`localchat serve` as a user runs it: a real server process on loopback, a real HTTP
client, the bundled SmolLM2-135M. One llama.cpp server (with an API key and
--max-queue 2) and one torch server (no key) are started per module. Everything runs
on one thread: llama.cpp's threads spin-wait for each other, which on a busy 2-core
machine makes two threads several times slower than one."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import httpx2
import pytest

from localchat.engine import engine_figures
from localchat.engine.base import Message, Request, SamplingParams
from localchat.engine.engine_figures import Figures
from localchat.models.specs import resolve_model_facts
from helpers.server import (LOCALCHAT, ServerProcess, first_text_chunk, health,
                                  server_env, sse_payloads, wait_for)

pytestmark = pytest.mark.subprocess  # runs the CLI or starts a process

KEY = "test-key-123"
REPO = str(Path(__file__).resolve().parents[2])
CHAT = [{"role": "user", "content": "Say hi"}]
COUNTING = "1, 2, 3, 4, 5,"  # greedy SmolLM2 keeps counting: a generation that does not stop
GREEDY = {"temperature": 0, "max_tokens": 16}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc = ServerProcess(["-m", "default", "--engine", "llama.cpp", "-c", "1024",
                          "--threads", "1", "--max-queue", "2", "--api-key", KEY],
                         tmp_path_factory.mktemp("llama-server"))
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def engine():
    """The same model and settings in this process: what the server must reproduce."""
    from localchat.engine import EngineConfig, open_engine

    eng = open_engine(EngineConfig("default", ctx_size=1024, threads=1))
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def client(server):
    with httpx2.Client(base_url=server.url, headers={"Authorization": f"Bearer {KEY}"},
                       timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def torch_server(tmp_path_factory):
    proc = ServerProcess(["-m", "default", "--engine", "torch", "-c", "512", "--threads", "1",
                          "--kv-memory", "24MB"], tmp_path_factory.mktemp("torch-server"))
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def torch_client(torch_server):
    with httpx2.Client(base_url=torch_server.url, timeout=120) as c:
        yield c


def assert_error(response: httpx2.Response, status: int, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert "Traceback" not in error["message"] and REPO not in error["message"]
    if param is not None:
        assert error["param"] == param
    return error


# -- startup and information ---------------------------------------------------------

def test_startup_line_names_model_url_and_engine(server):
    lines = server.stderr().splitlines()
    assert lines[0] == (f"localchat: serving {server.model} on {server.url}/v1 "
                        f"(engine llama.cpp), as asked; 2 KV slots")  # min(--max-queue 2, 16)
    assert server.port > 0


def test_health_reports_requests_and_memory_without_a_key(server):
    body = httpx2.get(server.url + "/health").json()  # no Authorization header
    assert body["status"] == "ok" and body["engine"] == "llama.cpp"
    assert body["active"] == 0 and body["queued"] == 0 and body["max_queue"] == 2
    assert body["memory"]["context_capacity"] == 1024
    assert "kv_cache_bytes" in body["memory"]


def test_models_lists_the_loaded_model(client, server):
    body = client.get("/v1/models").json()
    assert body["object"] == "list"
    (card,) = body["data"]
    assert card["id"] == server.model and card["object"] == "model"
    assert card["meta"]["n_ctx"] == 1024
    assert client.get(f"/v1/models/{server.model}").json()["id"] == server.model
    assert_error(client.get("/v1/models/other"), 404)


# -- completions: the same text as the engine, in OpenAI's shapes --------------------

def engine_text(engine, request: Request) -> str:
    return engine.complete(request).text


def test_chat_completion_matches_the_engine_streamed_and_not(client, server, engine):
    reference = engine.complete(Request(messages=[Message("user", "Say hi")],
                                        sampling=SamplingParams(temperature=0), max_tokens=16))
    expected, n = reference.text, reference.stats.completion_tokens
    finish = reference.finish_reason  # "length", unless this CPU's greedy reply ends by then
    assert finish == ("length" if n == 16 else "stop")
    response = client.post("/v1/chat/completions", json={"messages": CHAT, **GREEDY})
    assert response.status_code == 200
    body = response.json()
    assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
    assert body["model"] == server.model and isinstance(body["created"], int)
    (choice,) = body["choices"]
    assert choice["index"] == 0 and choice["message"]["role"] == "assistant"
    assert choice["message"]["content"] == expected
    assert choice["finish_reason"] == finish
    usage = body["usage"]
    assert usage["completion_tokens"] == n and usage["prompt_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + n
    timings = body["timings"]
    assert timings["predicted_n"] == n and timings["predicted_per_second"] > 0
    assert timings["ttft_ms"] > 0 and timings["prompt_n"] + timings["cache_n"] \
        == usage["prompt_tokens"]

    with client.stream("POST", "/v1/chat/completions",
                       json={"messages": CHAT, "stream": True, **GREEDY}) as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        payloads = sse_payloads(stream)
    assert payloads[-1] == "[DONE]"
    chunks = payloads[:-1]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"]
               for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == expected
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == finish
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert chunks[-1]["timings"]["predicted_n"] == n
    assert "usage" not in chunks[-1]  # only with stream_options.include_usage


def test_text_completion_matches_the_engine_with_usage_chunk(client, engine):
    expected = engine_text(engine, Request(prompt_tokens=engine.tokenize_text(COUNTING),
                                           sampling=SamplingParams(temperature=0),
                                           max_tokens=8))
    body = client.post("/v1/completions", json={"prompt": COUNTING, "temperature": 0,
                                                "max_tokens": 8}).json()
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["choices"][0]["text"] == expected
    assert body["usage"]["completion_tokens"] == 8

    with client.stream("POST", "/v1/completions",
                       json={"prompt": COUNTING, "temperature": 0, "max_tokens": 8,
                             "stream": True, "stream_options": {"include_usage": True}}
                       ) as stream:
        payloads = sse_payloads(stream)
    assert payloads[-1] == "[DONE]"
    *chunks, usage_chunk = payloads[:-1]
    assert "".join(c["choices"][0]["text"] for c in chunks) == expected
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] == 8


def test_stop_strings_end_the_reply_with_finish_reason_stop(client):
    body = client.post("/v1/completions", json={"prompt": COUNTING, "temperature": 0,
                                                "max_tokens": 16, "stop": [" 8", "zzz"]})
    choice = body.json()["choices"][0]
    assert choice["text"] == " 6, 7,"
    assert choice["finish_reason"] == "stop"


def test_max_completion_tokens_n_1_and_a_single_stop_string(client):
    body = client.post("/v1/completions", json={
        "prompt": COUNTING, "temperature": 0, "max_completion_tokens": 3, "n": 1,
        "stop": "zzz", "model": "default", "frequency_penalty": 0, "user": "ignored"})
    assert body.status_code == 200, body.text
    assert body.json()["usage"]["completion_tokens"] == 3


def chat_reply(client: httpx2.Client, content, **params) -> str:
    body = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": content}], "max_tokens": 6, **params})
    assert body.status_code == 200, body.text
    return body.json()["choices"][0]["message"]["content"]


def test_text_parts_are_joined(client):
    parts = [{"type": "text", "text": "Say "}, {"type": "text", "text": "hi"}]
    assert chat_reply(client, parts, temperature=0) == chat_reply(client, "Say hi",
                                                                  temperature=0)


# -- invalid requests: 400 with an OpenAI error, never a traceback -------------------

@pytest.mark.parametrize("change, param", [
    ({"n": 2}, "n"),
    ({"max_tokens": -1}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 10 ** 12}, "max_tokens"),
    ({"max_tokens": "16"}, "max_tokens"),
    ({"max_tokens": True}, "max_tokens"),
    ({"max_completion_tokens": 2000}, "max_completion_tokens"),
    ({"temperature": "hot"}, "temperature"),
    ({"temperature": -0.5}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_k": -1}, "top_k"),
    ({"seed": 1.5}, "seed"),
    ({"seed": 2 ** 64}, "seed"),  # once folded into another seed, silently
    ({"seed": 10 ** 400}, "seed"),
    ({"ignore_eos": True}, "ignore_eos"),  # llama.cpp's field: once accepted and ignored
    ({"frequency_penalty": 0.5}, "frequency_penalty"),
    ({"presence_penalty": 10 ** 400}, "presence_penalty"),
    ({"stop": 5}, "stop"),
    ({"stop": ["a"] * 17}, "stop"),
    ({"stream": "yes"}, "stream"),
    ({"model": 7}, "model"),
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "user", "content": "hi"}] * 1025}, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "tool", "content": "hi"}]}, "messages[0].tool_call_id"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content"),
    ({"messages": ["hi"]}, "messages[0]"),
    ({"logprobs": True}, "logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),
])
def test_invalid_chat_parameters_are_400(client, change, param):
    assert_error(client.post("/v1/chat/completions",
                             json={"messages": CHAT, "max_tokens": 4, **change}), 400, param)


@pytest.mark.parametrize("body, param", [
    ({}, "prompt"), ({"prompt": 5}, "prompt"), ({"prompt": ""}, "prompt"),
    ({"prompt": ["a", "b"]}, "prompt"),
])
def test_invalid_prompts_are_400(client, body, param):
    assert_error(client.post("/v1/completions", json=body), 400, param)


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]", b'{"max_tokens": NaN}', b"\xff"])
def test_invalid_json_is_400(client, content):
    response = client.post("/v1/chat/completions", content=content,
                           headers={"Content-Type": "application/json"})
    assert assert_error(response, 400)["code"] == "invalid_json"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_deep_nesting_and_lone_surrogates_are_400_not_500(client, path):
    deep = b'{"messages": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    response = client.post(path, content=deep, headers={"Content-Type": "application/json"})
    assert assert_error(response, 400)["code"] == "invalid_json"
    if path.endswith("chat/completions"):
        field, body = "messages[0].content", b'{"messages": [{"role": "user", "content": "a\\ud800"}]}'
    else:
        field, body = "prompt", b'{"prompt": "a\\ud800"}'
    response = client.post(path, content=body, headers={"Content-Type": "application/json"})
    assert "surrogate" in assert_error(response, 400, field)["message"]


def test_a_prompt_longer_than_the_context_is_400(client):
    long = [{"role": "user", "content": "word " * 1100}]
    error = assert_error(client.post("/v1/chat/completions",
                                     json={"messages": long, "max_tokens": 4}), 400)
    assert error["code"] == "context_length_exceeded"
    error = assert_error(client.post("/v1/completions",
                                     json={"prompt": "word " * 1100, "max_tokens": 4}), 400)
    assert error["code"] == "context_length_exceeded" and error["param"] == "prompt"


def test_unknown_routes_and_methods_answer_in_the_same_shape(client):
    assert_error(client.get("/v1/nothing"), 404)
    assert_error(client.get("/v1/chat/completions"), 405)


# -- security ------------------------------------------------------------------------

def test_api_key_is_required_except_on_health(server):
    with httpx2.Client(base_url=server.url, timeout=30) as anonymous:
        response = anonymous.get("/v1/models")
        assert_error(response, 401)
        assert response.headers["www-authenticate"] == "Bearer"
        assert_error(anonymous.post("/v1/chat/completions", json={"messages": CHAT}), 401)
        wrong = {"Authorization": "Bearer not-the-key"}
        assert_error(anonymous.get("/v1/models", headers=wrong), 401)
        assert_error(anonymous.get("/v1/models", headers={"Authorization": KEY}), 401)
        assert anonymous.get("/health").status_code == 200


@pytest.mark.parametrize("host, ok", [
    ("localhost", True), ("localhost:8080", True), ("127.0.0.1:1", True),
    ("[::1]:8080", True), ("LOCALHOST", True),
    ("evil.example", False), ("evil.example:8080", False), ("127.0.0.2", False),
    ("localhost.evil.example", False), ("", False),
])
def test_host_header_must_name_loopback(client, host, ok):
    response = client.get("/v1/models", headers={"Host": host})
    if ok:
        assert response.status_code == 200
    else:
        assert assert_error(response, 421)["code"] == "invalid_host"


def test_no_cors_and_cross_origin_requests_refused(client):
    evil = {"Origin": "http://evil.example"}
    assert_error(client.post("/v1/chat/completions", json={"messages": CHAT}, headers=evil),
                 403)
    preflight = client.options("/v1/chat/completions", headers={
        **evil, "Access-Control-Request-Method": "POST"})
    same = client.get("/v1/models", headers={"Origin": "http://localhost:3000"})
    assert same.status_code == 200
    for response in (preflight, same):
        assert "access-control-allow-origin" not in response.headers


def test_post_bodies_must_be_json(client):
    response = client.post("/v1/completions", content=json.dumps({"prompt": "hi"}),
                           headers={"Content-Type": "text/plain"})
    assert_error(response, 415)


def test_bodies_over_1_mib_are_413_declared_or_streamed(client):
    big = json.dumps({"prompt": "x" * (2 * 1024 * 1024)}).encode()
    assert_error(client.post("/v1/completions", content=big,
                             headers={"Content-Type": "application/json"}), 413)

    def chunked():  # no Content-Length: the limit holds while reading
        for i in range(0, len(big), 64 * 1024):
            yield big[i:i + 64 * 1024]

    response = client.post("/v1/completions", content=chunked(),
                           headers={"Content-Type": "application/json"})
    assert response.request.headers["transfer-encoding"] == "chunked"
    assert_error(response, 413)


# -- concurrency: the queue limit and cancellation on disconnect ---------------------

def long_stream(client: httpx2.Client, max_tokens: int = 900):
    return client.stream("POST", "/v1/completions", json={
        "prompt": COUNTING, "temperature": 0, "max_tokens": max_tokens, "stream": True})


def idle(client: httpx2.Client):
    state = health(client)
    return state if state["active"] == 0 and state["queued"] == 0 else None


def in_flight(client: httpx2.Client) -> int:
    """Requests admitted: producing tokens or waiting for their first (the runtime may batch
    the second with the first as soon as it is admitted, so the split is a race)."""
    state = health(client)
    return state["active"] + state["queued"]


def test_queue_full_is_503_and_disconnects_cancel(client, server):
    before = health(client)["cancelled"]
    second_started = threading.Event()

    release = threading.Event()

    def queued_request():  # admitted beside the first: queued, or batched with it
        with httpx2.Client(base_url=server.url, timeout=120,
                           headers={"Authorization": f"Bearer {KEY}"}) as other:
            with long_stream(other) as stream:
                second_started.set()
                lines = stream.iter_lines()  # kept: a collected iterator closes the response
                first_text_chunk(lines)
                release.wait(60)  # its client leaves only when the test says so

    with long_stream(client) as stream:
        lines = stream.iter_lines()  # kept: a collected iterator closes the response
        first_text_chunk(lines)
        thread = threading.Thread(target=queued_request)
        thread.start()
        assert wait_for(lambda: in_flight(client) == 2), health(client)
        busy = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1})
        assert_error(busy, 503)
        assert busy.headers["retry-after"] == "1"
        assert in_flight(client) == 2  # the refused request took no slot
    # closing the first stream cancels it; the second (started by now, or once the first has
    # gone) reads a chunk and its client leaves too
    release.set()
    thread.join(60)
    assert second_started.is_set() and not thread.is_alive()
    state = wait_for(lambda: idle(client), timeout=20)
    assert state, health(client)
    assert state["cancelled"] == before + 2  # neither ran to its 900 tokens


def test_a_client_giving_up_on_a_whole_response_cancels_it(client, server):
    before = health(client)["cancelled"]
    with httpx2.Client(base_url=server.url, headers={"Authorization": f"Bearer {KEY}"},
                       timeout=httpx2.Timeout(30, read=0.5)) as impatient:
        with pytest.raises(httpx2.ReadTimeout):
            impatient.post("/v1/completions", json={"prompt": COUNTING, "temperature": 0,
                                                    "max_tokens": 900})
    state = wait_for(lambda: idle(client), timeout=20)
    assert state and state["cancelled"] == before + 1


def test_disconnect_frees_the_torch_engines_kv_cache(torch_client):
    baseline = health(torch_client)["memory"]["kv_cache_bytes"]
    t0 = time.monotonic()
    with long_stream(torch_client, max_tokens=400) as stream:
        lines = stream.iter_lines()  # kept: a collected iterator closes the response
        first_text_chunk(lines)
        during = health(torch_client)
        assert during["active"] == 1
        assert during["memory"]["kv_cache_bytes"] > baseline
    state = wait_for(lambda: (s := idle(torch_client)) and
                     s["memory"]["kv_cache_bytes"] == baseline and s, timeout=20)
    assert state, health(torch_client)
    assert state["cancelled"] == 1 and state["completed"] == 0
    assert time.monotonic() - t0 < 20


def test_concurrent_requests_each_get_their_own_reply(torch_client):
    """Worker threads call generate() at once (the torch engine batches them)."""
    from concurrent.futures import ThreadPoolExecutor

    request = {"messages": CHAT, "temperature": 0, "max_tokens": 8}
    with ThreadPoolExecutor(3) as pool:
        bodies = list(pool.map(lambda _: torch_client.post("/v1/chat/completions",
                                                           json=request).json(), range(3)))
    assert len({b["choices"][0]["message"]["content"] for b in bodies}) == 1
    assert all(b["usage"]["completion_tokens"] == 8 for b in bodies)
    assert len({b["id"] for b in bodies}) == 3


def test_a_seed_repeats_the_sampled_reply(torch_client):
    # (on the torch engine: llama.cpp's reply to the same seed can change once the
    # prompt is in its KV cache, which is the engine's business, not the server's)
    sampled = {"temperature": 1.5, "top_k": 0, "top_p": 1, "min_p": 0, "seed": 1234}
    first = chat_reply(torch_client, "Tell me a story", **sampled)
    assert chat_reply(torch_client, "Tell me a story", **sampled) == first


@pytest.mark.model
def test_torch_server_without_key_needs_no_authorization(torch_client, torch_server):
    assert torch_server.engine == "torch"
    assert torch_client.get("/v1/models").json()["data"][0]["meta"]["engine"] == "torch"
    body = torch_client.post("/v1/chat/completions", json={"messages": CHAT, "temperature": 0,
                                                           "max_tokens": 4}).json()
    assert body["usage"]["completion_tokens"] == 4


# -- startup errors and shutdown -----------------------------------------------------

def run_serve(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LOCALCHAT), "serve", *args], capture_output=True, text=True,
                          timeout=60, env=server_env(tmp_path), stdin=subprocess.DEVNULL)


def test_other_hosts_need_an_api_key(tmp_path):
    done = run_serve(["--host", "0.0.0.0", "--port", "0"], tmp_path)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "--api-key" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_port_in_use_is_a_one_line_error(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        done = run_serve(["--port", str(taken.getsockname()[1])], tmp_path)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "in use" in done.stderr


def test_sigterm_mid_stream_ends_the_stream_and_exits_cleanly(server, client):
    with long_stream(client) as stream:
        lines = stream.iter_lines()
        first_text_chunk(lines)
        t0 = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        rest = [json.loads(line[6:]) if line.startswith("data: {") else line
                for line in lines if line]
    # the reply is cut short: an error event, never finish_reason "cancelled" or [DONE]
    assert rest[-1]["error"]["code"] == "server_shutting_down"
    assert all(c["choices"][0]["finish_reason"] is None for c in rest[:-1])
    assert server.stop(timeout=30) == 0
    assert time.monotonic() - t0 < 10
    assert "Traceback" not in server.stderr() and "ERROR" not in server.stderr()


def test_ctrl_c_stops_cleanly(torch_server):
    assert torch_server.stop(signal.SIGINT) == 130
    assert "Traceback" not in torch_server.stderr()


def _log_lines(server, path: str) -> list[str]:
    return [line for line in server.stderr().splitlines() if f" {path} " in line]


def test_each_request_gets_one_log_line_with_status_tokens_and_seconds(tmp_path):
    server = ServerProcess(["-m", "default", "--engine", "llama.cpp", "-c", "256", "--threads", "1"],
                           tmp_path)
    try:
        with httpx2.Client(base_url=server.url, timeout=60) as client:
            first = client.post("/v1/chat/completions", json={"messages": CHAT, **GREEDY})
            assert first.status_code == 200
            n = first.json()["usage"]["completion_tokens"]  # 16, or fewer where the reply ends
            with client.stream("POST", "/v1/chat/completions",
                               json={"messages": CHAT, "stream": True, **GREEDY}) as response:
                assert response.status_code == 200 and response.read()
            assert client.post("/v1/chat/completions", json={"messages": []}).status_code == 400
        long_reply = [{"role": "user", "content": "Write a long essay about the history of the sea."}]
        with httpx2.Client(base_url=server.url, timeout=0.5) as impatient, \
                pytest.raises(httpx2.TimeoutException):  # leaves a non-streamed request
            impatient.post("/v1/chat/completions",
                           json={"messages": long_reply, **GREEDY, "max_tokens": 150})  # ~2.8 s here
        wait_for(lambda: len(_log_lines(server, "/v1/chat/completions")) >= 4)
        lines = _log_lines(server, "/v1/chat/completions")
    finally:
        server.stop()
    assert len(lines) == 4, lines
    assert re.search(r" 503 \d+\+\d+ tok disconnected \d+\.\d\d s$", lines[3]), lines[3]
    pattern = r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d 127\.0\.0\.1 POST /v1/chat/completions "
    assert all(re.match(pattern, line) for line in lines), lines
    for line in lines[:2]:
        assert re.search(rf" 200 \d+\+{n} tok \d+\.\d\d s$", line), line
    # a refusal names its error code and field
    assert re.search(r" 400 invalid_value \(messages\) \d+\.\d\d s$", lines[2]), lines[2]


def test_quiet_serve_logs_no_requests(tmp_path):
    proc = ServerProcess(["-m", "default", "--engine", "llama.cpp", "-c", "256", "--threads", "1",
                          "--quiet"], tmp_path)
    try:
        with httpx2.Client(base_url=proc.url, timeout=60) as quiet:
            assert quiet.post("/v1/chat/completions", json={
                "messages": CHAT, "max_tokens": 2}).status_code == 200
        assert "/v1/chat/completions" not in proc.stderr()
    finally:
        proc.stop()


@pytest.mark.model
def test_ps_lists_a_running_server_and_ctrl_c_says_what_it_stops(tmp_path, monkeypatch):
    # serve's default engine is the one this machine's kept figures say serves many streams
    # faster (engine/engine_rule.py; measuring them is test_engine_rule.py's): kept ones
    # that favour torch, in the server's data dir, so it loads torch without measuring
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))
    facts = resolve_model_facts("default")
    engine_figures.keep(facts, 1, {"llama.cpp": Figures(1.0, 200.0, 50.0, 100.0),
                                   "torch": Figures(3.0, 300.0, 60.0, 300.0)})
    server = ServerProcess(["-m", "default", "-c", "256", "--threads", "1", "--verbose"],
                           tmp_path, unset=("LOCALCHAT_ENGINE",))

    def ps() -> list:
        done = subprocess.run([str(LOCALCHAT), "ps", "--json"], capture_output=True, text=True,
                              timeout=60, env=server_env(tmp_path / "home"))
        assert done.returncode == 0, done.stderr
        return [(s["pid"], s["url"], s["model"], s["engine"], s["context"])
                for s in json.loads(done.stdout)]

    try:
        assert ps() == [(server.proc.pid, server.url + "/v1", server.model, server.engine, 256)]
        assert server.engine == "torch" and "localchat: measuring" not in server.stderr()
        assert ("(engine torch), measured here for many streams at once: torch 300 tok/s, "
                "llama.cpp 100 tok/s") in server.stderr()
        assert "localchat: compute: torch CPU capability " in server.stderr()  # --verbose
    finally:
        code = server.stop(signal.SIGINT)
    assert code == 130 and "Traceback" not in server.stderr()
    assert "localchat: stopping (0 requests in flight)" in server.stderr()
    assert ps() == [] and list((tmp_path / "home" / "servers").glob("*")) == []
