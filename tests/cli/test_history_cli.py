"""`localchat run --continue` and the history database, with the real command in a
subprocess: conversation settings carry over, and a SIGKILL mid-reply keeps the text."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from localchat.storage import ConversationStore

from helpers.cli import localchat

pytestmark = pytest.mark.subprocess  # runs the CLI or starts a process


def db_path() -> Path:
    return Path(os.environ["LOCALCHAT_HOME"]) / "history.db"


def test_run_continue_keeps_history_system_prompt_and_sampling():
    first = localchat("run", "--continue", "My name is Ada. Say hello.", "--system", "Be brief.",
                      "--temp", "0", "-n", "12", "--json")
    assert first.returncode == 0, first.stderr
    plain = localchat("run", "What is my name?", "-n", "4", "--json", "--no-history")
    second = localchat("run", "--continue", "What is my name?", "-n", "12", "--json")
    assert second.returncode == 0, second.stderr
    # the second prompt carried the first exchange and the stored system prompt
    assert json.loads(second.stdout)["prompt_tokens"] > json.loads(plain.stdout)["prompt_tokens"] + 10
    store = ConversationStore.open(db_path())
    try:
        convs = store.list_conversations()
        assert len(convs) == 1  # the --no-history run is not recorded
        conv = convs[0]
        assert conv.system_prompt == "Be brief." and conv.params["temperature"] == 0
        msgs = store.messages(conv.id)
        assert [m.role for m in msgs] == ["user", "assistant"] * 2
        assert msgs[2].content == "What is my name?"
        assert msgs[3].content == json.loads(second.stdout)["text"]
        assert msgs[3].status == "complete" and msgs[3].stats["completion_tokens"] > 0
        assert msgs[3].params["temperature"] == 0  # the conversation's, not the flag default
    finally:
        store.close()


def test_a_plain_run_is_saved_so_continue_continues_it():
    first = localchat("run", "My name is Ada.", "--temp", "0", "-n", "6")
    assert first.returncode == 0, first.stderr
    assert localchat("run", "--continue", "What is my name?", "-n", "6").returncode == 0
    store = ConversationStore.open(db_path())
    try:
        (conv,) = store.list_conversations()
        msgs = store.messages(conv.id)
        assert [m.content for m in msgs][::2] == ["My name is Ada.", "What is my name?"]
        assert msgs[1].content == first.stdout.rstrip("\n") and msgs[1].status == "complete"
    finally:
        store.close()


def test_run_continue_flags_that_differ_from_defaults_override():
    assert localchat("run", "--continue", "Hi", "--temp", "0", "-n", "4").returncode == 0
    assert localchat("run", "--continue", "Again", "--temp", "0.3", "-n", "4").returncode == 0
    store = ConversationStore.open(db_path())
    try:
        msgs = store.messages(store.last_conversation().id)
        assert [m.params["temperature"] for m in msgs if m.role == "assistant"] == [0, 0.3]
    finally:
        store.close()


def test_sigkill_mid_reply_keeps_the_partial_reply_marked_interrupted():
    prompt = "Write a very long story about a dragon and a knight."
    proc = subprocess.Popen(
        [sys.executable, "-m", "localchat", "run", "--continue", prompt, "-n", "3000",
         "--temp", "0"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    seen = ""
    deadline = time.monotonic() + 180
    try:
        while time.monotonic() < deadline and len(seen) < 80:
            time.sleep(0.2)
            assert proc.poll() is None, proc.stderr.read()
            if not db_path().exists():
                continue
            try:
                db = sqlite3.connect(f"file:{db_path()}?mode=ro", uri=True)
                row = db.execute("SELECT content, status FROM messages WHERE role = "
                                 "'assistant'").fetchone()
                db.close()
            except sqlite3.OperationalError:  # tables not created yet
                continue
            if row is not None:
                assert row[1] == "streaming"
                seen = row[0]
        assert len(seen) >= 80, "the reply was not written while it streamed"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    store = ConversationStore.open(db_path())
    try:
        assert store.integrity_check() == "ok"
        msgs = store.messages(store.last_conversation().id)
        assert [(m.role, m.status) for m in msgs] == [("user", "complete"),
                                                      ("assistant", "interrupted")]
        assert msgs[0].content == prompt
        assert msgs[1].content.startswith(seen)  # nothing already written was lost
    finally:
        store.close()


def test_run_continue_with_a_damaged_database_is_a_one_line_error():
    db_path().parent.mkdir(parents=True, exist_ok=True)
    db_path().write_bytes(b"garbage" * 1000)
    proc = localchat("run", "--continue", "Hi", "-n", "4")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "damaged" in lines[0], proc.stderr
    assert db_path().read_bytes() == b"garbage" * 1000


@pytest.mark.slow  # three runs of the model and a 5 s busy timeout
def test_a_database_locked_once_the_reply_starts_leaves_the_reply_whole():
    """Issue 39 #11: another process taking the write lock once the reply has started, and
    holding it past the busy timeout, ended the run with rc 1 and the reply cut; now the
    reply completes on stdout and stderr says, once, that it is not saved."""
    args = ["run", "Count from 1 to 100, one number per line.", "--temp", "0", "-n", "48"]
    expected = localchat(*args, "--no-history")
    assert expected.returncode == 0 and expected.stdout.strip(), expected.stderr
    proc = subprocess.Popen([sys.executable, "-m", "localchat", *args], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.read(1)  # the reply has begun: its row is in the database
    proc.send_signal(signal.SIGSTOP)  # no further token until the lock is held
    holder = sqlite3.connect(db_path(), isolation_level=None, timeout=60)
    try:
        holder.execute("BEGIN IMMEDIATE")  # the write lock; readers (WAL) still read
        proc.send_signal(signal.SIGCONT)
        rest, err = proc.communicate(timeout=180)
    finally:
        proc.send_signal(signal.SIGCONT)
        holder.rollback()
        holder.close()
    assert proc.returncode == 0, err
    assert (first + rest).decode() == expected.stdout
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "localchat: warning: the reply is not saved to the history: "), err
    assert "locked" in lines[0]


def test_localchat_home_that_cannot_be_created_runs_without_history(tmp_path):
    """Issue 39 #12: LOCALCHAT_HOME under a read-only parent (here: under a file, which
    root cannot write into either) was an OSError traceback from mkdir."""
    (tmp_path / "a-file").write_text("")
    home = tmp_path / "a-file" / "home"
    done = localchat("run", "Hi", "--temp", "0", "-n", "4", env_extra={"LOCALCHAT_HOME": str(home)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()
    assert done.stderr.strip().splitlines() == [
        f"localchat: warning: this run is not saved to the history: cannot create the history "
        f"folder {home} (Not a directory); history is off for this session"]
