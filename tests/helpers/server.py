"""A real `localchat serve` process for the server tests, and SSE reading.

The server runs as its own process on a free loopback port (--port 0; the port is read
from its startup line), exactly as a user starts it, and is talked to over real HTTP.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx2

LOCALCHAT = Path(sys.executable).parent / "localchat"
STARTUP = re.compile(r"localchat: serving (.+) on (http://127\.0\.0\.1:(\d+))/v1 "
                     r"\(engine ([\w.]+)\)")


CHECKOUT = Path(__file__).resolve().parents[2]


def server_env(home: Path) -> dict[str, str]:
    """The environment for the `localchat` script: this checkout's code first on the path
    (the installed script may be an editable install of another checkout)."""
    env = {k: v for k, v in os.environ.items() if k != "LOCALCHAT_API_KEY"}
    path = [str(CHECKOUT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env.update(HF_HUB_OFFLINE="1", LOCALCHAT_HOME=str(home), PYTHONPATH=os.pathsep.join(path))
    return env


class ServerProcess:
    """`localchat serve ARGS --port 0`, started and waited for (startup line, /health)."""

    def __init__(self, args: list[str], workdir: Path, timeout: float = 90.0,
                 unset: tuple[str, ...] = ()) -> None:
        """unset: environment variables the server starts without."""
        self.log = workdir / "server.log"
        self._log_file = self.log.open("wb")
        env = {k: v for k, v in server_env(workdir / "home").items() if k not in unset}
        self.proc = subprocess.Popen([str(LOCALCHAT), "serve", "--port", "0", *args],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=self._log_file, env=env)
        self.returncode: int | None = None
        match = self._wait_for_startup_line(timeout)
        self.model, self.url, self.port, self.engine = (match[1], match[2], int(match[3]),
                                                        match[4])
        self._wait_for_health(timeout)

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")

    def _wait_for_startup_line(self, timeout: float) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = STARTUP.search(self.stderr())
            if match:
                return match
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited ({self.proc.returncode}):\n{self.stderr()}")
            time.sleep(0.05)
        self.stop(signal.SIGKILL)
        raise RuntimeError(f"no startup line after {timeout} s:\n{self.stderr()}")

    def _wait_for_health(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx2.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx2.TransportError:
                pass
            time.sleep(0.05)
        self.stop(signal.SIGKILL)
        raise RuntimeError(f"/health did not answer after {timeout} s:\n{self.stderr()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Send `sig`, wait for the exit, return the exit code (SIGKILL if it hangs)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log_file.close()
        self.returncode = self.proc.returncode
        return self.returncode


def health(client: httpx2.Client) -> dict:
    response = client.get("/health")
    assert response.status_code == 200
    return response.json()


def wait_for(predicate, timeout: float = 15.0, interval: float = 0.05):
    """Poll until predicate() returns something truthy; that value, or the last one."""
    deadline = time.monotonic() + timeout
    value = predicate()
    while not value and time.monotonic() < deadline:
        time.sleep(interval)
        value = predicate()
    return value


def sse_payloads(response: httpx2.Response) -> list:
    """Every `data:` payload of an SSE response, JSON-decoded ("[DONE]" kept as is);
    checks the framing: nothing but `data:` lines and blank lines between them."""
    payloads = []
    for line in response.iter_lines():
        if not line:
            continue
        assert line.startswith("data: "), line
        data = line[len("data: "):]
        payloads.append(data if data == "[DONE]" else json.loads(data))
    return payloads


def first_text_chunk(lines) -> dict:
    """Read SSE lines until a chunk carrying generated text; returns that chunk."""
    for line in lines:
        if line.startswith("data: {"):
            chunk = json.loads(line[len("data: "):])
            choice = chunk["choices"][0]
            if choice.get("text") or choice.get("delta", {}).get("content"):
                return chunk
    raise AssertionError("the stream ended before any text")


def bundled_server(workdir: Path, ctx: int = 1024):
    """A module fixture's body: `localchat serve` of the bundled model on llama.cpp (one
    thread, `ctx` tokens of context), yielded, then stopped."""
    proc = ServerProcess(["-m", "default", "--engine", "llama.cpp", "-c", str(ctx),
                          "--threads", "1"], workdir)
    yield proc
    proc.stop()


def openai_client(server: ServerProcess):
    """The official openai client for a test server: no retries, a generous timeout."""
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                         timeout=300)
