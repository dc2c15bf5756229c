"""A file laid out as huggingface_hub's cache holds it (blob, snapshot link, refs/main), so
hub specs resolve offline in tests."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

COMMIT = "89abcdef0123456789abcdef0123456789abcdef"


def add_to_cache(cache: Path, repo_id: str, filename: str, *, content: bytes | None = None,
                 source: Path | None = None, commit: str = COMMIT) -> Path:
    """repo_id's filename in the cache: a blob holding content, or a link to source; the
    snapshot link to it is returned."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    key = hashlib.sha256(content if content is not None else filename.encode()).hexdigest()
    blob = repo / "blobs" / key
    blob.parent.mkdir(parents=True)
    if content is not None:
        blob.write_bytes(content)
    else:
        blob.symlink_to(source)
    link = repo / "snapshots" / commit / filename
    link.parent.mkdir(parents=True)
    link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return link
