"""Check a local model file before anything loads it: validate_model_file() refuses pickles,
truncated downloads and garbage with a typed one-line error and returns GGUFFacts for a good
GGUF. Only the header is read (memory-mapped); pickle and torch are never imported here."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from typing import TYPE_CHECKING

from localchat.prompt.builtin_templates import CHAT_MARKERS
from localchat.errors import ModelFormatError, ModelNotFoundError, UnsafeCheckpointError
from localchat.models.facts import GGUFFacts
from localchat.models.facts_cache import cached_facts, remember_facts

if TYPE_CHECKING:
    from localchat.models.gguf_reader import GGUFFile

GGUF_MAGIC = b"GGUF"

PICKLE_SUFFIXES = frozenset({".bin", ".pt", ".pth", ".ckpt", ".pkl"})
_GUESSED_FTYPE_FLAG = 1024  # llama.cpp ORs this into general.file_type when it guessed


def validate_model_file(path: str | Path) -> GGUFFacts:
    """Refuse anything that is not a complete GGUF file; return its facts.

    Raises ModelNotFoundError, UnsafeCheckpointError or ModelFormatError.
    """
    path = Path(path)
    if not path.exists():
        raise ModelNotFoundError(f"model file not found: {path}")
    if path.is_dir():
        raise ModelNotFoundError(f"model file not found: {path} (it is a directory)")
    if not path.is_file():  # a FIFO or device would block the read below, or never end
        raise ModelFormatError(f"{path} is not a regular file (a pipe, socket or device)")
    if path.suffix.lower() in PICKLE_SUFFIXES:
        raise _unsafe(path, f"{path.suffix} files are")
    try:
        with open(path, "rb") as f:
            head = f.read(8)
        file_size = path.stat().st_size
    except OSError as e:
        raise ModelNotFoundError(f"cannot read model file: {path} ({e.strerror or e})") from e

    if _is_pickle_or_zip(head):
        raise _unsafe(path, "its content is")
    if path.suffix.lower() == ".safetensors":
        raise ModelFormatError(
            f"{path}: safetensors models need the torch engine (not available yet)"
        )
    if head[:4] != GGUF_MAGIC:
        raise ModelFormatError(f"{path} is not a GGUF file (magic {head[:4]!r})")
    cached = cached_facts(path)  # validated before, and unchanged since
    if cached is not None and cached.file_size == file_size:
        return cached
    from localchat.models.gguf_checks import check_model_metadata
    from localchat.models.gguf_reader import read_gguf

    with read_gguf(path) as gguf_file:  # checks version, counts, sizes and offsets
        check_model_metadata(gguf_file)
        facts = _facts(gguf_file, path, file_size)
    remember_facts(facts)
    return facts


def _unsafe(path: Path, what: str) -> UnsafeCheckpointError:
    return UnsafeCheckpointError(
        f"refusing {path}: {what} a pickle/zip checkpoint, which can run code when loaded "
        "and is never unpickled; use a GGUF file instead"
    )


def _is_pickle_or_zip(head: bytes) -> bool:
    """Pickle protocol 2-5 starts with PROTO (0x80) + version; torch.save zips start PK."""
    pickle = len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5
    return pickle or head[:4] == b"PK\x03\x04"


def _facts(g: GGUFFile, path: Path, file_size: int) -> GGUFFacts:
    """Read the facts from metadata that check_model_metadata() has already vetted."""
    md = g.metadata
    arch = md["general.architecture"]

    def num(key: str, default: int = 0) -> int:
        value = md.get(key)
        return value if type(value) is int else default

    def text(key: str) -> str | None:
        value = md.get(key)
        return value if isinstance(value, str) and value else None

    def token(key: str) -> str | None:
        tokens, index = md.get("tokenizer.ggml.tokens"), md.get(key)
        if not isinstance(tokens, list) or type(index) is not int:
            return None
        return tokens[index] if 0 <= index < len(tokens) else None

    n_heads = num(f"{arch}.attention.head_count")
    n_embd = num(f"{arch}.embedding_length")
    tokens = md.get("tokenizer.ggml.tokens")
    quant_type = _quant_type(g)
    return GGUFFacts(
        path=path,
        file_size=file_size,
        name=display_name(path, text("general.basename"), text("general.size_label"),
                          text("general.name")),
        architecture=arch,
        quant_type=quant_type,
        context_length=num(f"{arch}.context_length"),
        n_layers=num(f"{arch}.block_count"),
        n_heads=n_heads,
        n_kv_heads=num(f"{arch}.attention.head_count_kv", n_heads),
        head_dim=num(f"{arch}.attention.key_length") or (n_embd // n_heads if n_heads else 0),
        vocab_size=num(f"{arch}.vocab_size") or (len(tokens) if isinstance(tokens, list) else 0),
        chat_template=text("tokenizer.chat_template"),
        bos_token=token("tokenizer.ggml.bos_token_id"),
        eos_token=token("tokenizer.ggml.eos_token_id"),
        chat_markers=chat_markers(tokens if isinstance(tokens, list) else []),
    )


def chat_markers(vocabulary: list) -> tuple[str, ...]:
    """The chat-format control tokens (builtin_templates.CHAT_MARKERS) a vocabulary has."""
    present = set(vocabulary)
    return tuple(marker for marker, _ in CHAT_MARKERS if marker in present)


def display_name(path: Path, basename: str | None, size_label: str | None,
                 general_name: str | None) -> str:
    """A short, space-free model name: the file name without its quant tag (the UI shows
    the type beside it), e.g. SmolLM2-135M-Instruct; generic file names fall back to the
    metadata's basename and size label, then general.name."""
    stem = _QUANT_TAG.sub("", path.stem)
    if stem and stem.lower() not in _GENERIC_STEMS:
        return "-".join(stem.split())
    if basename:
        named = basename if not size_label or size_label in basename else f"{basename}-{size_label}"
        return "-".join(named.split())
    return "-".join((general_name or path.stem).split()) or path.stem


_QUANT_TAG = re.compile(r"[.\-_](I?Q\d[\w]*|F16|F32|BF16|FP16|FP32)$", re.IGNORECASE)
_GENERIC_STEMS = frozenset({"model", "ggml-model", "consolidated", "weights", "unsloth"})


def _quant_type(g: GGUFFile) -> str:
    """general.file_type as llama.cpp names it; else the type holding the most bytes."""
    ftype = g.metadata.get("general.file_type")
    if type(ftype) is int:
        try:
            from gguf import LlamaFileType

            name = LlamaFileType(ftype & ~_GUESSED_FTYPE_FLAG).name
            return name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            pass
    weights: Counter[str] = Counter()
    for t in g.tensors.values():
        weights[t.type_name] += t.n_bytes
    return weights.most_common(1)[0][0] if weights else "unknown"
