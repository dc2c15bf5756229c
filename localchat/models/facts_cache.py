"""Facts of GGUF files already validated, kept in the cache dir per file (path, size and
mtime): a one-shot prompt does not read a 100k-entry vocabulary again to learn what it
learnt last time. A changed file (another size or mtime) is read and checked again; a
damaged cache file is ignored and rewritten."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, fields
from pathlib import Path

from localchat.atomic import atomic_write_text
from localchat.models.facts import GGUFFacts
from localchat.paths import cache_dir

VERSION = 1  # bump when validation or GGUFFacts change: older entries are not trusted
MAX_ENTRIES = 256
MAX_BYTES = 4 << 20  # a cache file larger than this is not ours to read


def _file() -> Path:
    return cache_dir() / "model-facts.json"


def _identity(path: Path) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns]


def _read() -> dict:
    try:
        file = _file()
        if file.stat().st_size > MAX_BYTES:
            return {}
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    entries = data.get("entries") if isinstance(data, dict) and data.get("version") == VERSION \
        else None
    return entries if isinstance(entries, dict) else {}


def cached_facts(path: Path) -> GGUFFacts | None:
    """The facts validation found for this file, if it has not changed since."""
    entry = _read().get(os.path.abspath(path))
    identity = _identity(path)
    if not isinstance(entry, dict) or identity is None or entry.get("file") != identity:
        return None
    try:
        values = dict(entry["facts"])
        values["path"] = path
        values["chat_markers"] = tuple(values.get("chat_markers", ()))
        facts = GGUFFacts(**values)
    except (KeyError, TypeError, ValueError):
        return None
    expected = {f.name: f.type for f in fields(GGUFFacts)}
    return facts if set(values) == set(expected) else None


def remember_facts(facts: GGUFFacts) -> None:
    """Keep a validated file's facts (the newest MAX_ENTRIES files); failures are silent."""
    identity = _identity(facts.path)
    if identity is None:
        return
    entries = _read()
    values = asdict(facts)
    values["path"] = str(facts.path)
    key = os.path.abspath(facts.path)
    entries.pop(key, None)
    entries[key] = {"file": identity, "facts": values}
    while len(entries) > MAX_ENTRIES:
        entries.pop(next(iter(entries)))
    try:
        atomic_write_text(_file(), json.dumps({"version": VERSION, "entries": entries}))
    except OSError:
        pass
