"""A warm `python -m localchat`: one helper Python process imports the heavy libraries the CLI
loads (torch, numpy, llama_cpp, gguf; ~1.6 s of CPU a process) and then forks a fresh process
for each command, which imports localchat itself and runs `-m localchat` with the test's argv,
environment, working directory and pipes, and exits as the command would.

Run as a script it is that helper (it never imports localchat: everything of ours, and
whatever reads the environment, is imported fresh in each fork). run() is the client; a
command whose PYTHON* or locale variables differ from the helper's starts cold, as does
every command under LOCALCHAT_TEST_WARM_CLI=0."""

from __future__ import annotations

import atexit
import json
import locale
import os
import runpy
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import traceback

PRELOADED = ("torch", "numpy", "llama_cpp", "gguf", "jinja2")  # import-only: they start no work
ENABLED = os.environ.get("LOCALCHAT_TEST_WARM_CLI", "1") != "0"


# --- the helper process -------------------------------------------------------------------

def _recv_exact(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _serve(listener: socket.socket) -> dict:
    """Accept requests until stdin closes (the test run ended: exit). Returns only in a
    forked command process, with its request; fds 0-2 are then the request's pipes."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the waiters below reap themselves
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(sys.stdin, selectors.EVENT_READ)
    while True:
        for key, _ in selector.select():
            if key.fileobj is sys.stdin:
                if not os.read(0, 1024):
                    path = listener.getsockname()
                    os.unlink(path)
                    os.rmdir(os.path.dirname(path))
                    os._exit(0)
                continue
            conn, _ = listener.accept()
            size = struct.unpack("!I", _recv_exact(conn, 4))[0]
            message, fds, _, _ = socket.recv_fds(conn, size, 3)
            while len(message) < size:
                message += _recv_exact(conn, size - len(message))
            if os.fork() == 0:  # the waiter: forks the command, reports its pid and status
                selector.close()
                listener.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                pid = os.fork()
                if pid == 0:
                    conn.close()
                    for target, fd in enumerate(fds):
                        os.dup2(fd, target)
                        os.close(fd)
                    return json.loads(message)
                for fd in fds:
                    os.close(fd)
                try:
                    conn.sendall(f"{pid}\n".encode())
                    _, status = os.waitpid(pid, 0)
                    conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
                finally:
                    os._exit(0)
            conn.close()
            for fd in fds:
                os.close(fd)


def _main(path: str) -> None:
    for name in PRELOADED:
        __import__(name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    print("ready", flush=True)
    request = _serve(listener)
    # as `python -m localchat` started in request["cwd"] would be
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.path[0] = request["cwd"]
    sys.argv = ["-m", *request["args"]]
    os._exit(_run_as_main("localchat"))


def _run_as_main(module: str) -> int:
    """Run the module as __main__ and shut down as the interpreter would (non-daemon threads
    joined, atexit handlers, standard streams flushed), less the module teardown: tearing
    torch down takes ~0.45 s of CPU, and the exit frees a process's memory anyway. The exit code."""
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        code = -signal.SIGINT
    except BaseException:  # noqa: BLE001 - printed as the interpreter would
        traceback.print_exc()
        code = 1
    threading._shutdown()  # noqa: SLF001 - what the interpreter calls at exit
    atexit._run_exitfuncs()  # noqa: SLF001
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            code = code or 120  # as the interpreter exits when its streams cannot be flushed
    if code == -signal.SIGINT:  # an uncaught Ctrl-C ends the process by SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return code & 0xFF


# --- the client ---------------------------------------------------------------------------

class _Helper:
    """The helper process of this test run, started on first use, ended when the run ends
    (its stdin closes)."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="localchat-warm-cli-")
        self.path = os.path.join(self.dir, "socket")
        self.proc = subprocess.Popen([sys.executable, __file__, self.path],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        line = self.proc.stdout.readline()
        if line != b"ready\n":
            raise RuntimeError(f"the warm CLI helper did not start: {line!r}")
        self.startup_env = _startup_env(os.environ)
        atexit.register(self.close)

    def close(self) -> None:
        """Its stdin closes: it removes its socket and exits."""
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


_helper: _Helper | None = None
_helper_lock = threading.Lock()


def _startup_env(env) -> dict[str, str]:
    """What the interpreter reads from the environment as it starts (PYTHONPATH, the locale
    of its standard streams, ...): a fork keeps the helper's."""
    return {k: v for k, v in env.items()
            if k.startswith("PYTHON") or k in ("LANG", "LC_ALL", "LC_CTYPE")}


def _connect(env: dict) -> socket.socket | None:
    """A connection to the helper (started on first use), or None where env's startup
    variables differ from the helper's: that command must start cold."""
    global _helper
    with _helper_lock:
        if _helper is None or _helper.proc.poll() is not None:
            _helper = _Helper()
        if _startup_env(env) != _helper.startup_env:
            return None
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(_helper.path)
        return conn


def run(args: list[str], *, input: str, env: dict, timeout: float) -> subprocess.CompletedProcess:
    """Like subprocess.run([python, "-m", "localchat", *args], input=input, env=env,
    capture_output=True, text=True, timeout=timeout), in a fork of the warm helper."""
    argv = [sys.executable, "-m", "localchat", *args]
    conn = _connect(env)
    if conn is None:
        return subprocess.run(argv, input=input, env=env, capture_output=True, text=True,
                              timeout=timeout)
    pipes = [os.pipe() for _ in range(3)]
    theirs = [pipes[0][0], pipes[1][1], pipes[2][1]]
    stdin_w, stdout_r, stderr_r = pipes[0][1], pipes[1][0], pipes[2][0]
    try:
        message = json.dumps({"args": list(args), "env": dict(env), "cwd": os.getcwd()}).encode()
        conn.sendall(struct.pack("!I", len(message)))
        socket.send_fds(conn, [message], theirs)
    finally:
        for fd in theirs:
            os.close(fd)
    outputs: dict[int, bytearray] = {stdout_r: bytearray(), stderr_r: bytearray()}

    def read(fd: int) -> None:
        with open(fd, "rb", closefd=True) as f:
            for chunk in iter(lambda: f.read1(65536), b""):
                outputs[fd] += chunk

    def write() -> None:
        with open(stdin_w, "wb", closefd=True) as f:
            try:
                f.write(input.encode(locale.getpreferredencoding(False)))
            except BrokenPipeError:
                pass

    threads = [threading.Thread(target=read, args=(fd,), daemon=True)
               for fd in (stdout_r, stderr_r)] + [threading.Thread(target=write, daemon=True)]
    for t in threads:
        t.start()
    reply = conn.makefile("rb")
    pid = int(reply.readline())  # sent as soon as it is forked
    conn.settimeout(timeout)
    try:
        status = reply.readline()
    except TimeoutError:
        os.kill(pid, signal.SIGKILL)
        raise subprocess.TimeoutExpired(argv, timeout) from None
    finally:
        conn.close()
    for t in threads:
        t.join()
    return subprocess.CompletedProcess(argv, int(status), _text(outputs[stdout_r]),
                                       _text(outputs[stderr_r]))


def _text(data: bytes) -> str:
    """As subprocess's text mode decodes output: the locale's encoding, universal newlines."""
    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


if __name__ == "__main__":
    _main(sys.argv[1])
