"""The servers `bench --task serve` loads: `localchat serve` (its own defaults, on the port the
OS picks) and a peer llama-server, each a child process started, waited for (/health) and
stopped (SIGTERM, then SIGKILL) however the bench ends; a start that fails is an EngineError
quoting the server's last stderr line."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from localchat.errors import EngineError, UsageError

OURS = "localchat"
PEER = "llama-server"
START_TIMEOUT_S = 600.0  # the torch executor's first start on a machine compiles for 1-2 min
STOP_TIMEOUT_S = 30.0
VERSION_TIMEOUT_S = 30.0
OUR_STARTUP = re.compile(r"localchat: serving .+ on (http://127\.0\.0\.1:\d+)/v1 "
                         r"\(engine ([\w.]+)\)(?:, (.*))?")


@dataclass
class Served:
    """A server process: its base URL (no /v1), its command and what it said it runs."""

    name: str
    command: list[str]
    proc: subprocess.Popen
    log: Path
    url: str = ""
    engine: str = ""
    why: str = ""
    _log_file: object = field(default=None, repr=False)

    def last_line(self) -> str:
        lines = [line.strip() for line in self.log.read_text(errors="replace").splitlines()]
        lines = [line for line in lines if line]
        return lines[-1] if lines else "(nothing on stderr)"

    def failed(self, what: str) -> EngineError:
        return EngineError(f"{self.name} {what}: {self.last_line()}")

    def stop(self) -> None:
        """SIGTERM, a wait, then SIGKILL; idempotent."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None


def our_command(serve_flags: list[str]) -> list[str]:
    """`localchat serve` on a port the OS picks, run by this interpreter on this checkout."""
    return [sys.executable, "-m", "localchat", "serve", "--port", "0", *serve_flags]


def peer_command(binary: Path, model_file: Path, slots: int, threads: int, port: int,
                 ctx_per_slot: int | None = None) -> list[str]:
    """llama-server as its users run it: its defaults (its context, its own jinja rendering
    of the GGUF's template) plus -np slots and -t threads; with ctx_per_slot, -c is
    slots × ctx_per_slot."""
    context = [] if ctx_per_slot is None else ["-c", str(slots * ctx_per_slot)]
    return [str(binary), "-m", str(model_file), "-np", str(slots), *context,
            "-t", str(threads), "--host", "127.0.0.1", "--port", str(port)]


def check_peer_binary(path: str) -> Path:
    """The --peer-server path, or a UsageError saying why it cannot run (`PATH --version`
    must exit 0)."""
    binary = Path(path).expanduser()
    if not binary.exists():
        raise UsageError(f"--peer-server {path}: no such file")
    if not binary.is_file() or not os.access(binary, os.X_OK):
        raise UsageError(f"--peer-server {path}: not an executable file")
    try:  # before any round: a binary that cannot run fails now, not after ours has run
        done = subprocess.run([str(binary), "--version"], stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=VERSION_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"--peer-server {path}: `--version` failed: "
                         f"{getattr(exc, 'strerror', None) or exc}") from None
    if done.returncode != 0:
        lines = (done.stderr + done.stdout).decode(errors="replace").strip().splitlines()
        raise UsageError(f"--peer-server {path}: `--version` exited {done.returncode}: "
                         f"{lines[-1] if lines else '(no output)'}")
    return binary


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _spawn(name: str, command: list[str], workdir: Path, env: dict | None = None) -> Served:
    log = workdir / f"{name}-{time.monotonic_ns()}.log"
    log_file = log.open("wb")
    try:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log_file,
                                stderr=subprocess.STDOUT, env=env)
    except OSError as exc:
        log_file.close()
        raise EngineError(f"{name} did not start: {exc.strerror or exc}") from None
    return Served(name, command, proc, log, _log_file=log_file)


def start_ours(serve_flags: list[str], workdir: Path) -> Served:
    """`localchat serve` with serve_flags, up and answering /health."""
    import localchat

    env = dict(os.environ)
    checkout = str(Path(localchat.__file__).resolve().parents[1])  # this code, not another's
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [checkout, env.get("PYTHONPATH")]))
    served = _spawn(OURS, our_command(serve_flags), workdir, env)
    try:
        match = _wait(served, lambda: OUR_STARTUP.search(served.log.read_text(errors="replace")))
        served.url, served.engine, served.why = match[1], match[2], match[3] or ""
        _wait(served, lambda: _healthy(served.url))
    except BaseException:
        served.stop()
        raise
    return served


def start_peer(binary: Path, model_file: Path, slots: int, threads: int, workdir: Path,
               ctx_per_slot: int | None = None) -> Served:
    """llama-server (peer_command), up and answering /health with 200 (it says 503 while
    it loads)."""
    port = free_port()
    served = _spawn(PEER, peer_command(binary, model_file, slots, threads, port, ctx_per_slot),
                    workdir)
    served.url, served.engine = f"http://127.0.0.1:{port}", "llama.cpp"
    try:
        _wait(served, lambda: _healthy(served.url))
    except BaseException:
        served.stop()
        raise
    return served


def _wait(served: Served, ready):
    """ready()'s first truthy value; EngineError if the process exits or time runs out."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        value = ready()
        if value:
            return value
        if served.proc.poll() is not None:
            raise served.failed(f"exited ({served.proc.returncode}) before it was ready")
        time.sleep(0.1)
    raise served.failed(f"was not ready after {START_TIMEOUT_S:.0f} s")


def _healthy(url: str) -> bool:
    import httpx2

    try:
        return httpx2.get(url + "/health", timeout=5).status_code == 200
    except httpx2.TransportError:
        return False


def scratch_dir() -> tempfile.TemporaryDirectory:
    """Where the servers' stderr goes while the bench runs."""
    return tempfile.TemporaryDirectory(prefix="localchat-bench-serve-")
