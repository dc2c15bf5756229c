"""`bench --busy N`: real spinning processes that run while the benchmark does and are gone
after it, also after an error inside it or the death of the process that started them."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.cli import assert_one_line_error, localchat

from localchat.bench.busy import BusyCores

pytestmark = pytest.mark.subprocess  # spinning processes
WAIT_S = 30  # generous: the machine running the tests may be loaded


def cpu_ticks(pid: int) -> int:
    """utime + stime of a live process, in clock ticks."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def gone(pid: int) -> bool:
    """Exited: no such process, or a zombie its new parent has yet to reap."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_each_process_spins_while_inside_and_all_are_reaped_after():
    with BusyCores(2) as busy:
        pids = [p.pid for p in busy.procs]
        assert len(set(pids)) == 2
        start = {pid: cpu_ticks(pid) for pid in pids}
        wait_for(lambda: all(cpu_ticks(pid) > start[pid] + 5 for pid in pids),
                 "the busy processes did not use the CPU")
    assert not busy.procs
    assert all(gone(pid) for pid in pids)


def test_an_error_inside_stops_them_too():
    with pytest.raises(KeyboardInterrupt):
        with BusyCores(1) as busy:
            pid = busy.procs[0].pid
            raise KeyboardInterrupt  # Ctrl-C during the benchmark
    assert gone(pid)


def test_they_stop_by_themselves_when_their_parent_dies():
    code = ("import os\nfrom localchat.bench.busy import BusyCores\n"
            "b = BusyCores(1).__enter__()\nprint(b.procs[0].pid, flush=True)\nos._exit(0)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=WAIT_S, cwd=Path(__file__).resolve().parents[2])
    pid = int(out.stdout)
    wait_for(lambda: gone(pid), "an orphaned busy process kept spinning")


def test_bench_records_busy_in_its_json_and_checks_it():
    proc = localchat("bench", "--engines", "", "--busy", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["busy"] == 1
    assert "keeping 1 core busy" in proc.stderr
    assert_one_line_error(localchat("bench", "--busy", "-1"), "--busy")
