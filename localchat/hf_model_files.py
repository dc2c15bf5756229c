"""Check a Hugging Face model directory before anything loads it, and read its facts.

A directory is untrusted input like a GGUF file: config.json and the tokenizer files are
parsed as data, safetensors headers are read and checked against the files' sizes, and
pickle checkpoints (pytorch_model.bin, *.pt) are refused, never opened. The facts come
back as GGUFFacts (the fields fit any model; `path` is the directory).
Neither torch nor pickle is imported here.
"""

from __future__ import annotations

import json
import struct
from collections import Counter
from pathlib import Path
from typing import Any

from localchat.errors import ModelFormatError, ModelNotFoundError, UnsafeCheckpointError
from localchat.model_files import PICKLE_SUFFIXES, GGUFFacts, chat_markers

HF_MODEL_TYPES = ("llama", "qwen2")
INDEX_FILE = "model.safetensors.index.json"
MAX_HEADER_BYTES = 100 * 1024 * 1024
_DTYPE_NAMES = {"F32": "F32", "F16": "F16", "BF16": "BF16"}


def is_hf_directory(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file()


def read_json(path: Path, what: str | None = None) -> dict[str, Any]:
    """A JSON object from a file, or a one-line ModelFormatError."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ModelNotFoundError(f"cannot read {path} ({e.strerror or e})") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise ModelFormatError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ModelFormatError(f"{path} does not hold a JSON object")
    return data


def read_json_if_present(path: Path) -> dict[str, Any]:
    return read_json(path) if path.is_file() else {}


def token_text(value: Any) -> str | None:
    """tokenizer_config's bos/eos: a string or an AddedToken dict ({"content": ...})."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def chat_template(directory: Path, tok_config: dict[str, Any]) -> str | None:
    """tokenizer_config.json's template (a string, or named templates: "default"), else
    the chat_template.jinja file newer transformers versions write."""
    template = tok_config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if isinstance(template, str) and template:
        return template
    jinja = directory / "chat_template.jinja"
    return jinja.read_text(encoding="utf-8") if jinja.is_file() else None


def safetensors_files(directory: Path) -> list[Path]:
    """The weight files: the index's shards if there is an index, else every *.safetensors."""
    index = directory / INDEX_FILE
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ModelFormatError(f"{index} has no weight_map")
        names = sorted({str(v) for v in weight_map.values()})
        if any(Path(n).name != n for n in names):
            raise ModelFormatError(f"{index} names a shard outside the directory")
        files = [directory / n for n in names]
        for f in files:
            if not f.is_file():
                raise ModelNotFoundError(f"{directory.name}: shard {f.name} is missing")
        return files
    return sorted(directory.glob("*.safetensors"))


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """A safetensors header (name -> dtype, shape, data_offsets), checked against the
    file's size so a truncated download is caught before any tensor is read."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ModelFormatError(f"{path} is too short to be a safetensors file")
            (n,) = struct.unpack("<Q", head)
            if n > min(MAX_HEADER_BYTES, size - 8):
                raise ModelFormatError(f"{path} is not a safetensors file (header size {n})")
            header = json.loads(f.read(n))
    except OSError as e:
        raise ModelNotFoundError(f"cannot read {path} ({e.strerror or e})") from None
    except (UnicodeDecodeError, ValueError):
        raise ModelFormatError(f"{path} is not a safetensors file (bad header)") from None
    if not isinstance(header, dict):
        raise ModelFormatError(f"{path} is not a safetensors file (bad header)")
    data_size = size - 8 - n
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and offsets[1] <= data_size):
            raise ModelFormatError(f"{path}: tensor {name!r} lies past the end of the file "
                                   "(truncated download?)")
    return {k: v for k, v in header.items() if k != "__metadata__"}


def tensor_totals(directory: Path) -> tuple[int, int]:
    """(bytes of tensor data, number of stored elements) over every weight file."""
    n_bytes = n_elements = 0
    for f in safetensors_files(directory):
        for info in read_safetensors_header(f).values():
            start, end = info["data_offsets"]
            n_bytes += end - start
            count = 1
            for d in info.get("shape", []):
                count *= int(d)
            n_elements += count
    return n_bytes, n_elements


def quant_type(config: dict[str, Any], headers: list[dict[str, Any]]) -> str:
    """NF4 for bitsandbytes 4-bit checkpoints, INT8 / INT4-G128 for localchat's, GPTQ-INT4-G128
    for GPTQ's, else the float type holding the most bytes."""
    q = config.get("quantization_config")
    if isinstance(q, dict) and q.get("quant_method") == "bitsandbytes" and q.get("load_in_4bit"):
        return str(q.get("bnb_4bit_quant_type", "fp4")).upper()
    if isinstance(q, dict) and q.get("quant_method") == "gptq":
        return f"GPTQ-INT{q.get('bits')}-G{q.get('group_size')}"
    if isinstance(q, dict) and q.get("quant_method") == "localchat-int":
        group = q.get("group_size")
        return f"INT{q.get('bits')}" + (f"-G{group}" if group else "")
    weights: Counter[str] = Counter()
    for header in headers:
        for info in header.values():
            start, end = info["data_offsets"]
            weights[_DTYPE_NAMES.get(info.get("dtype"), str(info.get("dtype")))] += end - start
    return weights.most_common(1)[0][0] if weights else "unknown"


def _int(config: dict[str, Any], key: str, directory: Path, default: int | None = None) -> int:
    value = config.get(key, default)
    if type(value) is not int or value <= 0:
        raise ModelFormatError(f"{directory.name}/config.json: {key} must be a positive "
                               f"integer, got {value!r}")
    return value


def validate_hf_directory(path: str | Path) -> GGUFFacts:
    """Refuse anything that is not a usable Llama-family safetensors directory."""
    directory = Path(path)
    if not is_hf_directory(directory):
        raise ModelNotFoundError(f"model file not found: {directory} (a directory without "
                                 "config.json)")
    files = safetensors_files(directory)
    if not files:
        pickles = sorted(p.name for p in directory.iterdir() if p.suffix.lower() in PICKLE_SUFFIXES)
        if pickles:
            raise UnsafeCheckpointError(
                f"refusing {directory}: its weights ({', '.join(pickles[:3])}) are pickle "
                "checkpoints, which can run code when loaded and are never unpickled; "
                "use a safetensors copy of the model")
        raise ModelFormatError(f"{directory} has config.json but no *.safetensors weights")
    config = read_json(directory / "config.json")
    model_type = config.get("model_type")
    if model_type not in HF_MODEL_TYPES:
        raise ModelFormatError(f"{directory.name}: model_type {model_type!r} is not supported "
                               f"(supported: {', '.join(HF_MODEL_TYPES)})")
    headers = [read_safetensors_header(f) for f in files]
    if not (directory / "tokenizer.json").is_file():
        raise ModelFormatError(f"{directory.name} lacks tokenizer.json (needed to tokenize)")
    tok_config = read_json_if_present(directory / "tokenizer_config.json")
    n_heads = _int(config, "num_attention_heads", directory)
    dim = _int(config, "hidden_size", directory)
    head_dim = config.get("head_dim") or dim // n_heads
    added = tok_config.get("added_tokens_decoder")
    added = added if isinstance(added, dict) else {}
    return GGUFFacts(
        path=directory,
        file_size=sum(f.stat().st_size for f in files),
        name="-".join(directory.name.split()),
        architecture=model_type,
        quant_type=quant_type(config, headers),
        context_length=_int(config, "max_position_embeddings", directory),
        n_layers=_int(config, "num_hidden_layers", directory),
        n_heads=n_heads,
        n_kv_heads=_int(config, "num_key_value_heads", directory, n_heads),
        head_dim=head_dim if type(head_dim) is int and head_dim > 0 else dim // n_heads,
        vocab_size=_int(config, "vocab_size", directory),
        chat_template=chat_template(directory, tok_config),
        bos_token=token_text(tok_config.get("bos_token")),
        eos_token=token_text(tok_config.get("eos_token")),
        chat_markers=chat_markers([token_text(t) for t in added.values()]),
    )
