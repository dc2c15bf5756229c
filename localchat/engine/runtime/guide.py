"""Constrained decoding with llguidance: a Constraint compiles to a grammar once, each sequence
gets its own matcher (a Guide), and a step's token masks are computed for all its guided rows
at once (drafted positions included). No grammar engine of our own."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from localchat.engine.constraint import Constraint
from localchat.engine.finite import require_finite
from localchat.errors import ConstraintError

if TYPE_CHECKING:
    import llguidance


def _llguidance():
    """llguidance, imported when a constrained request first needs it (a compiled library:
    a prompt without a constraint does not wait for it)."""
    import llguidance

    return llguidance


def _fill(matcher, bits: np.ndarray, row: int) -> None:
    from llguidance.numpy import fill_next_token_bitmask

    fill_next_token_bitmask(matcher, bits, row)

# JSON as models write it, one way only: '{"a": 1, "b": [2, 3]}' (no free whitespace
# a small model could spend its whole budget on; more of the text is forced)
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

def grammar_for(constraint: Constraint) -> str:
    """llguidance's grammar for a constraint (not yet checked against a tokenizer);
    ConstraintError if it is invalid or no finite text satisfies it."""
    require_finite(constraint)
    llguidance = _llguidance()
    try:
        if constraint.kind == "json_schema":
            return llguidance.LLMatcher.grammar_from_json_schema(constraint.text,
                                                                 defaults=JSON_OPTIONS)
        if constraint.kind == "json_object":
            return llguidance.LLMatcher.grammar_from_json_schema('{"type": "object"}',
                                                                 defaults=JSON_OPTIONS)
        if constraint.kind == "gbnf":
            return llguidance.grammar_from("gbnf", constraint.text)
        return llguidance.LLMatcher.grammar_from_lark(constraint.text)
    except ValueError as e:
        raise ConstraintError(f"invalid {constraint.label}: {_one_line(str(e))}") from None


class Guide:
    """One sequence's matcher: what may come next, forced tokens, and the end."""

    def __init__(self, matcher: "llguidance.LLMatcher", end_token: int, vocab_size: int) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size  # the tokenizer's (its masks' width)
        self.end_token = end_token  # handed out when the grammar is complete

    @classmethod
    def start(cls, tokenizer: "llguidance.LLTokenizer", grammar: str,
              constraint: Constraint) -> "Guide":
        """A fresh matcher; ConstraintError (llguidance's reason, one line) if the grammar is
        invalid for this tokenizer."""
        llguidance = _llguidance()
        # bounded time and memory for any schema or grammar a request brings
        limits = llguidance.LLParserLimits(verbose_errors=False)
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0, limits=limits)
        if matcher.is_error():
            raise ConstraintError(f"invalid {constraint.label}: {_one_line(matcher.get_error())}")
        guide = cls(matcher, tokenizer.eos_token, tokenizer.vocab_size)
        if not matcher.is_accepting() and not guide._allows_text(tokenizer.eos_tokens):
            raise ConstraintError(f"invalid {constraint.label}: no text satisfies it")
        return guide

    def _allows_text(self, ends: Sequence[int]) -> bool:
        """Whether any token but an end may come next (llguidance allows only the ends
        where a schema has no value at all, e.g. a $ref cycle)."""
        bits = np.zeros((1, (self.vocab_size + 31) // 32), dtype=np.int32)
        _fill(self.matcher, bits, 0)
        allowed = np.unpackbits(bits.view(np.uint8), bitorder="little")
        allowed[list(ends)] = 0
        return bool(allowed.any())

    def forced(self) -> list[int]:
        """Tokens the grammar forces next (llguidance's fast-forward)."""
        return self.matcher.compute_ff_tokens() if not self.matcher.is_stopped() else []

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many of tokens the grammar accepts in a row from here."""
        return self.matcher.validate_tokens(list(tokens)) if tokens else 0

    def follow(self, tokens: list[int]) -> None:
        """Tokens already in the reply (a reply being continued); ConstraintError if
        the grammar refuses them."""
        if not self.matcher.consume_tokens(tokens):
            raise ConstraintError("the reply being continued does not match the constraint")

    def consume(self, token: int) -> bool:
        return self.matcher.consume_token(token)

    @property
    def accepting(self) -> bool:
        """What was written so far is a complete value: the reply may end here."""
        return self.matcher.is_accepting()

    @property
    def complete(self) -> bool:
        """Nothing but the end may follow: the reply is over."""
        return self.matcher.is_stopped() and not self.matcher.is_error()

    @property
    def error(self) -> str:
        """llguidance's reason, one line (its "<non-verbose/>" marker left out)."""
        return _one_line(self.matcher.get_error())


def step_masks(guided: list[tuple[Guide, int, list[int]]], n_rows: int,
               vocab: int) -> dict[int, np.ndarray]:
    """Per logits row of a step that a guide constrains, the tokens allowed there ([vocab]
    bool). guided: (guide, its first row, the drafts verified in the rows after it, all
    of which the grammar accepts). The drafts' rows are masked on a copy of the matcher
    that consumes them; the sequence's own matcher never moves (llguidance 1.9.1 keeps a
    mask computed past a position it is rolled back to, and hands it out when another
    token reaches that position: '",' was refused inside an array after a draft had
    opened an object there). One matcher after another: llguidance's thread pool
    (LLExecutor) took 20 ms a step here on 2 busy cores, a matcher alone 40 µs."""
    width = (guided[0][0].vocab_size + 31) // 32
    bits = np.full((n_rows, width), -1, dtype=np.int32)
    for guide, row, drafts in guided:
        _fill(guide.matcher, bits, row)
        walker = guide.matcher.deep_copy() if drafts else None  # 2 µs
        for i, token in enumerate(drafts, start=1):
            _consume_draft(walker, token)
            _fill(walker, bits, row + i)
    unpacked = np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little")
    if unpacked.shape[1] < vocab:  # logits past the tokenizer's vocabulary: never allowed
        unpacked = np.pad(unpacked, ((0, 0), (0, vocab - unpacked.shape[1])))
    allowed = unpacked[:, :vocab].astype(bool)
    out = {}
    for guide, row, drafts in guided:
        for r in range(row, row + len(drafts) + 1):
            out[r] = allowed[r]
    return out


def _consume_draft(walker: "llguidance.LLMatcher", token: int) -> None:
    """Move the copy past one draft the grammar accepted (an end token after the grammar
    completed leaves it where it is: only the end may follow)."""
    if walker.is_stopped():
        return
    if not walker.consume_token(token):
        raise ValueError(f"a draft the grammar accepted was refused: {_one_line(walker.get_error())}")


def _one_line(message: str) -> str:
    lines = [line.strip() for line in message.strip().splitlines()
             if line.strip() and line.strip() != "<non-verbose/>"]
    return lines[0] if lines else "rejected by llguidance"
