"""A Hugging Face tokenizer.json as the engine's Vocabulary, giving llama.cpp's ids for the same
model: special tokens are parsed in template text only, never in typed text. Tokens decode
to bytes, so the stream can reassemble UTF-8 split across tokens."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Sequence

from tokenizers import Tokenizer

from localchat.prompt.template import render_chat
from localchat.engine.base import Message, Tool
from localchat.errors import EngineError
from localchat.models.hf_files import read_json_if_present, token_text

# special tokens llama.cpp (llama-vocab.cpp) also treats as end of generation whatever
# the eos id is: end-of-turn texts, and the fill-in-the-middle pad/repo/file-separator ones
EOG_TEXTS = frozenset({"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                       "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>",
                       "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "<|fim_repo|>",
                       "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", "<|file_sep|>"})


def byte_decoder() -> dict[str, int]:
    """GPT-2's bytes_to_unicode(), inverted: printable stand-in character -> byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _ids(value: Any) -> set[int]:
    if type(value) is int:
        return {value}
    return {v for v in value if type(v) is int} if isinstance(value, list) else set()


def _decoder_types(spec: Any) -> set[str]:
    if not isinstance(spec, dict):
        return set()
    found = {str(spec.get("type"))}
    for child in spec.get("decoders") or []:
        found |= _decoder_types(child)
    return found


class HFVocabulary:
    def __init__(self, directory: Path) -> None:
        path = directory / "tokenizer.json"
        try:
            spec = json.loads(path.read_text(encoding="utf-8"))
            self.trusted = Tokenizer.from_str(json.dumps(spec))
            self.plain = Tokenizer.from_str(json.dumps(spec))
        except (OSError, ValueError, Exception) as e:  # tokenizers raises plain Exception
            raise EngineError(f"cannot load {path}: {str(e).splitlines()[0] if str(e) else e}") from None
        self.plain.encode_special_tokens = True  # typed text: special tokens stay text
        decoders = _decoder_types(spec.get("decoder"))
        if "ByteLevel" not in decoders:
            raise EngineError(f"{path}: only byte-level BPE tokenizers are supported "
                              f"(this one decodes with {', '.join(sorted(decoders)) or 'nothing'})")
        tok_config = read_json_if_present(directory / "tokenizer_config.json")
        self.bos_text = token_text(tok_config.get("bos_token")) or ""
        self.eos_text = token_text(tok_config.get("eos_token")) or ""
        self.bos_id = self.trusted.token_to_id(self.bos_text) if self.bos_text else None
        added = self.trusted.get_added_tokens_decoder()  # id -> AddedToken
        self.special_ids = {i for i, t in added.items() if t.special}
        self.user_defined = {i: t.content for i, t in added.items() if not t.special}
        self.eog_ids = self._end_of_generation_ids(directory, tok_config, added)
        add_bos = tok_config.get("add_bos_token")
        if not isinstance(add_bos, bool):  # else ask the post-processor, as llama.cpp asks its vocab
            add_bos = self.bos_id is not None and \
                self.trusted.encode("", add_special_tokens=True).ids[:1] == [self.bos_id]
        self.adds_bos = add_bos and self.bos_id is not None
        self._bytes: list[bytes] | None = None
        self._bytes_lock = threading.Lock()

    def _end_of_generation_ids(self, directory: Path, tok_config: dict, added: dict) -> set[int]:
        ids = _ids(read_json_if_present(directory / "config.json").get("eos_token_id"))
        ids |= _ids(read_json_if_present(directory / "generation_config.json").get("eos_token_id"))
        eos = self.trusted.token_to_id(self.eos_text) if self.eos_text else None
        ids |= {eos} if eos is not None else set()
        ids |= {i for i, t in added.items() if t.special and t.content in EOG_TEXTS}
        return ids

    def tokenize_messages(self, template: str | None, messages: Sequence[Message],
                          tools: Sequence[Tool] = ()) -> list[int]:
        rendered = render_chat(template, messages, tools=tools, bos_token=self.bos_text,
                               eos_token=self.eos_text)
        tokens: list[int] = []
        for segment in rendered.segments:
            tokenizer = self.trusted if segment.trusted else self.plain
            tokens += tokenizer.encode(segment.text, add_special_tokens=False).ids
        if self.adds_bos and (not tokens or tokens[0] != self.bos_id):
            tokens.insert(0, self.bos_id)
        return tokens

    def tokenize_text(self, text: str) -> list[int]:
        return self.plain.encode(text, add_special_tokens=False).ids

    def detokenize(self, token: int) -> bytes:
        table = self._bytes or self._byte_table()
        return table[token] if 0 <= token < len(table) else b""

    def _byte_table(self) -> list[bytes]:
        """Every token's bytes, built once: control tokens are empty (as llama.cpp
        renders them without special=True), added text tokens are their UTF-8."""
        with self._bytes_lock:
            if self._bytes is None:
                decode = byte_decoder()
                vocab = self.trusted.get_vocab(with_added_tokens=True)
                table = [b""] * (max(vocab.values(), default=-1) + 1)
                for piece, i in vocab.items():
                    if i in self.special_ids:
                        continue
                    if i in self.user_defined:
                        table[i] = self.user_defined[i].encode("utf-8")
                    elif all(c in decode for c in piece):
                        table[i] = bytes(decode[c] for c in piece)
                    else:
                        table[i] = piece.encode("utf-8")
                self._bytes = table
            return self._bytes

    def constraint_tokenizer(self):
        """llguidance's tokenizer over this tokenizer.json, every end-of-generation token
        an end (the eos text's first)."""
        import llguidance  # only constrained requests need it

        eos = self.trusted.token_to_id(self.eos_text) if self.eos_text else None
        ends = ([eos] if eos in self.eog_ids else []) + sorted(self.eog_ids - {eos})
        return llguidance.LLTokenizer(self.trusted.to_str(), eos_token=ends or None)

    def is_end_of_generation(self, token: int) -> bool:
        return token in self.eog_ids

    def close(self) -> None:
        pass
