"""llama.cpp's vocabulary behind localchat's Vocabulary (both executors use it for GGUF
files): typed text is tokenized with special-token parsing off. Keeps llama.cpp's log off
the terminal."""

from __future__ import annotations

import ctypes
import re
import threading
import warnings
from typing import Sequence

from localchat.engine.executors.llama_lib import LlamaModel, llama_cpp

from localchat.prompt.template import render_chat
from localchat.engine.base import Message, Tool

# llama.cpp logs to stderr by default, which would scribble over the TUI. Keep its
# log lines in memory instead (the KV-size line is read back by tests and verbose output).
_LOG_LINES: list[str] = []
_LOG_LOCK = threading.Lock()
_LOGGED = [0]  # pieces logged so far, kept or not: a mark for llama_log_since


@llama_cpp.llama_log_callback
def _capture_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    with _LOG_LOCK:
        _LOG_LINES.append(text.decode("utf-8", errors="replace"))
        _LOGGED[0] += 1
        del _LOG_LINES[:-2000]


llama_cpp.llama_log_set(_capture_log, ctypes.c_void_p(0))  # before any model or vocab loads


def llama_log_text() -> str:
    """Everything llama.cpp has logged in this process (the last 2000 pieces)."""
    with _LOG_LOCK:
        return "".join(_LOG_LINES)


def llama_log_mark() -> int:
    with _LOG_LOCK:
        return _LOGGED[0]


def load_error(mark: int) -> str | None:
    """Why llama.cpp refused a model, from what it logged since `mark` (its "error loading
    model: ..." line: the missing key or tensor, the wrong shape), or None."""
    with _LOG_LOCK:
        since = "".join(_LOG_LINES[max(0, len(_LOG_LINES) - (_LOGGED[0] - mark)):])
    for line in reversed(since.splitlines()):
        found = re.search(r"error loading model: (.+)", line)
        if found:
            return found.group(1).strip()[:300]
    return None


def render_and_tokenize(model: LlamaModel, template: str | None,
                        messages: Sequence[Message], tools: Sequence[Tool] = ()) -> list[int]:
    """Render with the model's template and tokenize with llama.cpp's vocabulary: text
    the template wrote may hold special tokens, text users typed never does."""

    def token_text(token_id: int) -> str:
        if token_id < 0:
            return ""
        return token_piece(model, token_id, special=True).decode("utf-8", errors="replace")

    bos = model.token_bos()
    rendered = render_chat(template, messages, tools=tools, bos_token=token_text(bos),
                           eos_token=token_text(model.token_eos()))
    tokens: list[int] = []
    for segment in rendered.segments:
        tokens += model.tokenize(segment.text.encode("utf-8"), False, segment.trusted)
    adds_bos = model.tokenize(b"", True, True) == [bos]
    if adds_bos and (not tokens or tokens[0] != bos):
        tokens.insert(0, bos)
    return tokens


def token_piece(model: LlamaModel, token: int, special: bool = False) -> bytes:
    """One token's bytes. llama-cpp-python's detokenize() uses a 32-byte buffer, so
    longer pieces (64 dashes, a newline and 32+ spaces: 47 tokens of SmolLM2's vocabulary)
    came back empty; llama.cpp reports the size it needs, so ask again with that."""
    size = 64
    while True:
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_token_to_piece(model.vocab, token, buf, size, 0, special)
        if n >= 0:
            return buf.raw[:n]
        size = -n


class LlamaCppVocabulary:
    """A llama.cpp model's vocabulary as a Vocabulary. `owner` (a vocab-only model) is
    closed with it; a model an executor runs is closed by the executor."""

    def __init__(self, model: LlamaModel, owner: LlamaModel | None = None) -> None:
        self.model, self._owner = model, owner
        self._eog: dict[int, bool] = {}  # asked for every token of every reply: remembered

    @classmethod
    def vocab_only(cls, path: str) -> "LlamaCppVocabulary":
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        model = LlamaModel(path_model=path, params=params, verbose=False)
        return cls(model, owner=model)

    def tokenize_messages(self, template: str | None, messages: Sequence[Message],
                          tools: Sequence[Tool] = ()) -> list[int]:
        return render_and_tokenize(self.model, template, messages, tools)

    def tokenize_text(self, text: str) -> list[int]:
        return self.model.tokenize(text.encode("utf-8"), False, False)

    def detokenize(self, token: int) -> bytes:
        return token_piece(self.model, token)

    def constraint_tokenizer(self):
        """llguidance's tokenizer over this vocabulary (about a second: keep it), every
        end-of-generation token an end, the end-of-turn one first."""
        from llguidance.llamacpp import lltokenizer_from_vocab  # only constrained requests need it

        vocab = self.model.vocab
        ends = [t for t in range(llama_cpp.llama_vocab_n_tokens(vocab)) if self.is_end_of_generation(t)]
        first = [t for t in (llama_cpp.llama_vocab_eot(vocab), llama_cpp.llama_vocab_eos(vocab))
                 if t in ends][:1]
        with warnings.catch_warnings():  # it asks llama_token_get_attr, deprecated, per token
            warnings.simplefilter("ignore", DeprecationWarning)
            return lltokenizer_from_vocab(vocab, eos_token=first + [t for t in ends if t not in first])

    def is_end_of_generation(self, token: int) -> bool:
        eog = self._eog.get(token)
        if eog is None:
            eog = self._eog[token] = bool(llama_cpp.llama_vocab_is_eog(self.model.vocab, token))
        return eog

    def close(self) -> None:
        if self._owner is not None:
            self._owner.close()
