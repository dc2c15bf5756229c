"""Short model names as Ollama users type them (`smollm2:135m`, `llama3.2:1b-q8_0`): each names a
Hugging Face GGUF repository and a default quant, and a `-QUANT` tag picks another. The [models]
table of config.toml adds or overrides names."""

from __future__ import annotations

import re
from pathlib import Path

from localchat.errors import UsageError
from localchat.paths import config_path

# name:size -> OWNER/REPO:QUANT (instruct/chat builds, small enough for a laptop)
BUILTIN_NAMES = {
    "smollm2:135m": "bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M",
    "smollm2:360m": "bartowski/SmolLM2-360M-Instruct-GGUF:Q4_K_M",
    "smollm2:1.7b": "bartowski/SmolLM2-1.7B-Instruct-GGUF:Q4_K_M",
    "qwen2.5:0.5b": "Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M",
    "qwen2.5:1.5b": "Qwen/Qwen2.5-1.5B-Instruct-GGUF:Q4_K_M",
    "llama3.2:1b": "bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M",
    "llama3.2:3b": "bartowski/Llama-3.2-3B-Instruct-GGUF:Q4_K_M",
    "gemma3:270m": "ggml-org/gemma-3-270m-it-GGUF:Q8_0",
    "gemma3:1b": "ggml-org/gemma-3-1b-it-GGUF:Q4_K_M",
}
_SHORT = re.compile(r"(?P<family>[a-z][a-z0-9.]*)(?::(?P<size>[0-9.]+[mbk])(?:-(?P<quant>[a-z0-9_]+))?)?")
_HUB_REF = re.compile(r"[\w.-]+/[\w.-]+:[\w.-]+")


def known_names(config: Path | None = None) -> dict[str, str]:
    """The built-in table, with config.toml's [models] added over it."""
    return {**BUILTIN_NAMES, **_configured(config)}


def expand_short_name(spec: str, config: Path | None = None) -> str | None:
    """OWNER/REPO:QUANT for a short NAME[:SIZE[-QUANT]], or None when SPEC is not one.
    A bare family (`smollm2`) takes its first size in the table."""
    match = _SHORT.fullmatch(spec.strip().lower())
    if match is None:
        return None
    names = {k.lower(): v for k, v in known_names(config).items()}
    family, size, quant = match["family"], match["size"], match["quant"]
    if size is None:
        name = next((n for n in names if n.split(":")[0] == family), None)
    else:
        name = f"{family}:{size}"
    if name not in names:
        return None
    repo, _, default_quant = names[name].rpartition(":")
    return f"{repo}:{quant.upper() if quant else default_quant}"


def short_name_for(repo_id: str, config: Path | None = None) -> str | None:
    """The short name whose repository is REPO_ID, for `localchat models`."""
    return next((name for name, ref in known_names(config).items()
                 if ref.rpartition(":")[0].lower() == repo_id.lower()), None)


def _configured(config: Path | None) -> dict[str, str]:
    """config.toml's [models]; a bad table is a UsageError naming the entry."""
    path = config or config_path()
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None
    import tomllib

    try:
        table = tomllib.loads(text).get("models", {})
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: {exc}") from None
    if not isinstance(table, dict):
        raise UsageError(f"{path}: [models] must be a table of \"name:size\" = \"OWNER/REPO:QUANT\"")
    for name, ref in table.items():
        if not _SHORT.fullmatch(name.lower()) or ":" not in name:
            raise UsageError(f"{path}: [models] {name!r} is not a short name like \"family:1b\"")
        if not isinstance(ref, str) or not _HUB_REF.fullmatch(ref):
            raise UsageError(f"{path}: [models] {name} must be \"OWNER/REPO:QUANT\" or "
                             "\"OWNER/REPO:FILE.gguf\"")
    return table
