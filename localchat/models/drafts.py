"""Where distilled drafts are kept: DATA/drafts/, one file per target, named from the
target's file name and size, so `distill` writes where the chat and `run` look."""

from __future__ import annotations

import hashlib
from pathlib import Path

from localchat.models.facts import GGUFFacts
from localchat.paths import data_dir


def drafts_dir() -> Path:
    return data_dir() / "drafts"


def draft_path_for(target: GGUFFacts) -> Path:
    """The draft `localchat distill TARGET` keeps for this target file."""
    key = hashlib.sha256(f"{target.path.name}:{target.file_size}".encode()).hexdigest()[:10]
    return drafts_dir() / f"{target.path.stem}-{key}.draft.gguf"


def kept_draft(target: GGUFFacts) -> Path | None:
    """The kept draft for this target, if one was distilled."""
    path = draft_path_for(target)
    return path if path.is_file() else None
