"""Check a Hugging Face model directory before anything loads it, and read its facts as GGUFFacts
(`path` is the directory): JSON parsed as data, safetensors checked against their files and
config.json, pickle checkpoints refused unopened. Neither torch nor pickle is imported here."""

from __future__ import annotations

import json
import struct
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

from localchat.errors import ModelFormatError, ModelNotFoundError, UnsafeCheckpointError
from localchat.models.facts import GGUFFacts
from localchat.models.files import PICKLE_SUFFIXES, chat_markers

HF_MODEL_TYPES = ("llama", "qwen2")
INDEX_FILE = "model.safetensors.index.json"
MAX_HEADER_BYTES = 100 * 1024 * 1024
FLOAT_DTYPES = ("F32", "F16", "BF16")
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2,
               "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8,
               "F64": 8, "C64": 8}  # safetensors' whole-byte dtypes (F4/F6 are not supported)


def is_hf_directory(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file()


def read_json(path: Path, what: str | None = None) -> dict[str, Any]:
    """A JSON object from a file, or a one-line ModelFormatError."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ModelNotFoundError(f"cannot read {path} ({e.strerror or e})") from None
    except RecursionError:
        raise ModelFormatError(f"{path} is not valid JSON (nested too deeply)") from None
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
    """A safetensors header (name -> dtype, shape, data_offsets), every entry's types,
    sizes and offsets checked against the file's size before any tensor is read."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ModelFormatError(f"{path} is too short to be a safetensors file")
            (n,) = struct.unpack("<Q", head)
            if n > min(MAX_HEADER_BYTES, size - 8):
                raise ModelFormatError(f"{path} is not a safetensors file (header size {n})")
            text = f.read(n)
            if not text.startswith(b"{"):  # the format: JSON from the first byte, padded after
                raise ModelFormatError(f"{path} is not a safetensors file (its header does "
                                       "not start with '{')")
            header = json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except _DuplicateKey as e:
        raise ModelFormatError(f"{path}: the header names tensor {_show(e.key)} twice") from None
    except OSError as e:
        raise ModelNotFoundError(f"cannot read {path} ({e.strerror or e})") from None
    except RecursionError:
        raise ModelFormatError(f"{path} is not a safetensors file (header nested too "
                               "deeply)") from None
    except (UnicodeDecodeError, ValueError):
        raise ModelFormatError(f"{path} is not a safetensors file (bad header)") from None
    if not isinstance(header, dict):
        raise ModelFormatError(f"{path} is not a safetensors file (bad header)")
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    spans = sorted((_check_entry(path, name, info, size - 8 - n), name)
                   for name, info in tensors.items())
    end = 0
    for (start, stop), name in spans:
        if start != end:
            raise ModelFormatError(f"{path}: tensor {_show(name)} " + (
                "overlaps another tensor's data" if start < end else "leaves a gap before its data"))
        end = stop
    if end != size - 8 - n:
        raise ModelFormatError(f"{path}: {size - 8 - n - end} bytes after the last tensor "
                               "belong to no tensor")
    return tensors


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json.loads' object hook: a key given twice is an error, not "the last one wins"."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _show(value: Any, limit: int = 80) -> str:
    """A value from the file, quoted on one line and cut to `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _check_entry(path: Path, name: str, info: Any, data_size: int) -> tuple[int, int]:
    """One header entry's (start, end), after its dtype, shape and offsets are checked."""
    where = f"{path}: tensor {_show(name)}"
    info = info if isinstance(info, dict) else {}
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise ModelFormatError(f"{where} has an unsupported dtype {_show(dtype)}")
    if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
        raise ModelFormatError(f"{where}: shape must be a list of non-negative integers, "
                               f"got {_show(shape)}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and
            all(type(o) is int for o in offsets)):
        raise ModelFormatError(f"{where}: data_offsets must be two integers, got {_show(offsets)}")
    start, end = offsets
    if end > data_size:
        raise ModelFormatError(f"{where} lies past the end of the file (truncated download?)")
    if not 0 <= start <= end:
        raise ModelFormatError(f"{where}: data_offsets {offsets} are reversed or negative")
    count = 0 if 0 in shape else 1
    for d in shape:
        count *= d
        if count > data_size:  # bounded: a long shape of large numbers stops here
            break
    if end - start != count * DTYPE_BYTES[dtype]:
        raise ModelFormatError(f"{where} holds {end - start} bytes, but {dtype} {shape} "
                               f"needs {count * DTYPE_BYTES[dtype]}")
    return start, end


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
            weights[info["dtype"]] += end - start
    return weights.most_common(1)[0][0] if weights else "unknown"


def _int(config: dict[str, Any], key: str, directory: Path, default: int | None = None) -> int:
    value = config.get(key, default)
    if type(value) is not int or value <= 0:
        raise ModelFormatError(f"{directory.name}/config.json: {key} must be a positive "
                               f"integer, got {_show(value)}")
    return value


def head_dim(config: dict[str, Any], directory: Path) -> int:
    """config.json's head_dim, else hidden_size / num_attention_heads."""
    if config.get("head_dim"):  # as the torch loader reads it: 0 or null means "derive it"
        return _int(config, "head_dim", directory)
    size = _int(config, "hidden_size", directory) // _int(config, "num_attention_heads", directory)
    if size <= 0:
        raise ModelFormatError(f"{directory.name}/config.json: hidden_size is smaller than "
                               "num_attention_heads")
    return size


def float_tensors(config: dict[str, Any],
                  directory: Path) -> Iterator[tuple[str, tuple[int, ...], bool]]:
    """(name, shape, required) of every tensor a float checkpoint must (or may) hold,
    laid out as the torch loader reads them; lazily, so a huge layer count costs nothing."""
    dim, ffn = _int(config, "hidden_size", directory), _int(config, "intermediate_size", directory)
    vocab, hd = _int(config, "vocab_size", directory), head_dim(config, directory)
    n_heads = _int(config, "num_attention_heads", directory)
    q, kv = n_heads * hd, _int(config, "num_key_value_heads", directory, n_heads) * hd
    bias = config.get("model_type") == "qwen2" or bool(config.get("attention_bias"))
    tied = config.get("tie_word_embeddings", False) is True  # transformers' default: untied
    yield "model.embed_tokens.weight", (vocab, dim), True
    yield "model.norm.weight", (dim,), True
    yield "lm_head.weight", (vocab, dim), not tied
    for i in range(_int(config, "num_hidden_layers", directory)):
        p = f"model.layers.{i}"
        yield f"{p}.input_layernorm.weight", (dim,), True
        yield f"{p}.post_attention_layernorm.weight", (dim,), True
        for x, rows in (("q", q), ("k", kv), ("v", kv)):
            yield f"{p}.self_attn.{x}_proj.weight", (rows, dim), True
            if bias:
                yield f"{p}.self_attn.{x}_proj.bias", (rows,), True
        yield f"{p}.self_attn.o_proj.weight", (dim, q), True
        yield f"{p}.mlp.gate_proj.weight", (ffn, dim), True
        yield f"{p}.mlp.up_proj.weight", (ffn, dim), True
        yield f"{p}.mlp.down_proj.weight", (dim, ffn), True


def check_float_tensors(directory: Path, config: dict[str, Any],
                        headers: list[dict[str, Any]]) -> None:
    """Every tensor config.json implies is present once, in a float type, with its shape."""
    found: dict[str, dict[str, Any]] = {}
    for header in headers:
        for key, info in header.items():
            if key in found:
                raise ModelFormatError(f"{directory.name}: tensor {_show(key)} is stored twice")
            found[key] = info
    for key, shape, required in float_tensors(config, directory):
        info = found.get(key)
        if info is None:
            if required:
                raise ModelFormatError(f"{directory.name} lacks tensor {key}")
            continue
        if info["dtype"] not in FLOAT_DTYPES:
            raise ModelFormatError(f"{directory.name}: tensor {key} has type {info['dtype']}, "
                                   "not a float type (a quantized model needs its "
                                   "quantization_config in config.json)")
        if tuple(info["shape"]) != shape:
            raise ModelFormatError(f"{directory.name}: tensor {key} has shape {info['shape']}, "
                                   f"config.json says {list(shape)}")


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
    q = config.get("quantization_config")
    if q is None:
        check_float_tensors(directory, config, headers)
    elif not isinstance(q, dict):
        raise ModelFormatError(f"{directory.name}/config.json: quantization_config must be "
                               "an object")
    if not (directory / "tokenizer.json").is_file():
        raise ModelFormatError(f"{directory.name} lacks tokenizer.json (needed to tokenize)")
    tok_config = read_json_if_present(directory / "tokenizer_config.json")
    n_heads = _int(config, "num_attention_heads", directory)
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
        head_dim=head_dim(config, directory),
        vocab_size=_int(config, "vocab_size", directory),
        chat_template=chat_template(directory, tok_config),
        bos_token=token_text(tok_config.get("bos_token")),
        eos_token=token_text(tok_config.get("eos_token")),
        chat_markers=chat_markers([token_text(t) for t in added.values()]),
    )
