"""The quick exit (cli/process_exit.py): what a normal exit does first still happens."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.subprocess  # starts Python

PROGRAM = """
import atexit, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
from localchat.cli.process_exit import exit_now

pool = ThreadPoolExecutor(1)  # an idle worker: the exit hook must stop it, or this hangs
pool.submit(lambda: None).result()
def late():
    time.sleep(0.2)
    print("thread done", flush=True)
threading.Thread(target=late).start()  # non-daemon: joined first
atexit.register(lambda: print("atexit ran"))
sys.stdout.write("buffered ")  # no newline: only a flush writes it
exit_now(int(sys.argv[1]))
"""
BUFFERED = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # as a user's shell


@pytest.mark.parametrize("code", [0, 3])
def test_threads_atexit_and_buffered_output_finish_before_the_exit_code(code):
    done = subprocess.run([sys.executable, "-c", PROGRAM, str(code)], capture_output=True,
                          text=True, timeout=60, env=BUFFERED)
    assert done.returncode == code, done.stderr
    assert done.stdout == "buffered thread done\natexit ran\n"


def test_a_closed_stdout_is_141_as_mains_broken_pipe():
    program = ("import sys\nfrom localchat.cli.process_exit import exit_now\n"
               "sys.stdout.write('x' * 1000)\nexit_now(0)\n")  # under the buffer: the flush meets the pipe
    proc = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=BUFFERED)
    proc.stdout.close()  # the reader went away (| head)
    assert proc.wait(timeout=60) == 141
    assert proc.stderr.read() == b""
