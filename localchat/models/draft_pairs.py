"""Known target -> draft pairs of one model family (same tokenizer): a small model of the family
drafts for its larger ones. `--draft auto` uses the pair's draft when it is on disk, `pull MODEL
--with-draft` fetches it, `models` shows it. Matched on the hub repository's name (or, for a
local file, the file's name)."""

from __future__ import annotations

import re
from pathlib import Path

from localchat.errors import LocalchatError
from localchat.models.facts import GGUFFacts
from localchat.models.names import expand_short_name

# a pattern over the repository (or file) name, lowercased -> the draft's short name
DRAFT_PAIRS: tuple[tuple[str, str], ...] = (
    (r"smollm2-(360m|1\.7b)\b", "smollm2:135m"),
    (r"qwen2\.5-(1\.5b|3b|7b|14b|32b|72b)\b", "qwen2.5:0.5b"),
    (r"llama-3\.[123]-(3b|8b|70b)\b", "llama3.2:1b"),
    (r"gemma-3-(1b|4b|12b|27b)\b", "gemma3:270m"),
)


def family_name(path: Path) -> str:
    """The name pairs are matched on: OWNER/REPO of a hub-cached file, else the file's name."""
    for part in path.parts:
        if part.startswith("models--"):
            return part.removeprefix("models--").replace("--", "/", 1).lower()
    return path.name.lower()


def paired_draft(target: GGUFFacts) -> str | None:
    """The short name of the draft paired with this target; None if it has no pair."""
    name = family_name(target.path)
    return next((draft for pattern, draft in DRAFT_PAIRS if re.search(pattern, name)), None)


def paired_draft_on_disk(target: GGUFFacts) -> GGUFFacts | None:
    """The paired draft's facts where it is already downloaded (nothing is fetched)."""
    from localchat.models.specs import resolve_model_facts

    draft = paired_draft(target)
    spec = expand_short_name(draft) if draft else None
    if spec is None:
        return None
    try:
        return resolve_model_facts(spec, local_only=True)
    except LocalchatError:
        return None
