"""The default-engine rule's figures (engine_rule.py): what engine_probe.py measured of each
executor on a model file, kept in the data dir (beside models.json) per file, CPU, build,
thread count and torch mode, so a model is measured once on a machine. A damaged or
foreign figures file is measured again, never trusted."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from localchat.models.facts import GGUFFacts

FIGURES_FILE = "engine-figures.json"
MAX_FILE_BYTES = 1 << 20  # a figures file larger than this is not ours: measured again
@dataclass(frozen=True)
class Figures:
    """One executor on one file: start (load and a first token, s), prefill and decode
    tokens/s of one stream, and tokens/s of 8 streams at once (engine_probe.py); or why it
    failed."""

    start_s: float = 0.0
    prefill_tok_s: float = 0.0
    decode_tok_s: float = 0.0
    many_tok_s: float = 0.0
    failed: str = ""

    @classmethod
    def from_record(cls, record) -> "Figures | None":
        """From the figures file; None where the record is not one (a damaged file)."""
        try:
            figures = cls(**record)
        except TypeError:
            return None
        numbers = (figures.start_s, figures.prefill_tok_s, figures.decode_tok_s,
                   figures.many_tok_s)
        if not isinstance(figures.failed, str) or not all(
                isinstance(x, (int, float)) and 0 <= x < 1e9 for x in numbers):
            return None
        if not figures.failed and min(numbers[1:]) <= 0:
            return None
        return figures


def figures_path() -> Path:
    from localchat.paths import data_dir

    return data_dir() / FIGURES_FILE


def figures_key(facts: GGUFFacts, threads: int) -> str:
    """What the figures hold for: the file (path, size, modified time), the CPU and its
    flags, the llama.cpp and localchat versions, the threads, and whether torch runs eagerly
    (LOCALCHAT_EAGER: the tests' mode, slower than its compiled layers)."""
    from localchat import __version__
    from localchat.cpu_features import cpu_flags, cpu_name

    llama = installed_version("llama_cpp_python")
    info = facts.path.stat()
    parts = [str(facts.path.resolve()), str(info.st_size), str(info.st_mtime_ns), cpu_name(),
             " ".join(sorted(cpu_flags())), llama, __version__, str(threads),
             os.environ.get("LOCALCHAT_EAGER", "")]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def installed_version(dist: str) -> str:
    """A distribution's version ("none" where absent) from the first `dist-*.dist-info` on
    sys.path, as importlib.metadata finds it, without that module's ~20 ms import."""
    for entry in sys.path:
        try:
            for found in Path(entry or ".").glob(f"{dist}-*.dist-info"):
                return found.name[len(dist) + 1:-len(".dist-info")]
        except OSError:
            continue
    return "none"


def read_all(path: Path) -> dict:
    """The figures file's records ({} where it is missing, not a regular file, too large or
    not JSON); never follows a link."""
    from localchat.atomic import read_json_dict

    return read_json_dict(path, MAX_FILE_BYTES)


def cached(facts: GGUFFacts, threads: int, engines: tuple[str, ...]) -> dict[str, Figures] | None:
    """The kept figures of every engine in `engines`, or None where any is missing."""
    record = read_all(figures_path()).get(figures_key(facts, threads))
    if not isinstance(record, dict):
        return None
    out = {name: Figures.from_record(record.get(name)) if isinstance(record.get(name), dict)
           else None for name in engines}
    return None if any(v is None for v in out.values()) else out


def keep(facts: GGUFFacts, threads: int, figures: dict[str, Figures]) -> None:
    """Add these figures to the file (atomically; a file that is not ours is left alone)."""
    from localchat.atomic import atomic_write_text

    path = figures_path()
    if path.is_symlink() or (path.exists() and not path.is_file()):
        return
    records = read_all(path)
    records[figures_key(facts, threads)] = {
        "model": facts.name, "measured": time.strftime("%Y-%m-%d"),
        **{name: asdict(f) for name, f in figures.items()}}
    try:
        atomic_write_text(path, json.dumps(records, indent=1) + "\n")
    except OSError:
        pass  # a read-only cache dir: measured again next time
