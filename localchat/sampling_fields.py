"""SAMPLING_FIELDS: the one table of sampling parameters (and max_tokens) that flags, `/set`,
the parameters panel, batch lines, the server schema and SamplingParams read.
Imports nothing from localchat but errors, so any module may import it."""

from __future__ import annotations

import math
from dataclasses import dataclass

from localchat.errors import UsageError


MAX_SEED = 2**64 - 1  # what the engines' generators take (the server folds its seeds instead)


@dataclass(frozen=True)
class Range:
    """Allowed values: lo (or above lo, when lo_open) up to hi (below hi when hi is inf)."""

    lo: float
    hi: float = math.inf
    lo_open: bool = False

    def contains(self, value) -> bool:
        low_ok = value > self.lo if self.lo_open else value >= self.lo
        return low_ok and (value < self.hi if self.hi == math.inf else value <= self.hi)

    def describe(self, kind: type) -> str:
        """'>= 0 and finite', '> 0', 'in (0, 1]': how messages state the range."""
        if self.hi == math.inf:
            finite = " and finite" if kind is float else ""
            return f"{'>' if self.lo_open else '>='} {self.lo:g}{finite}"
        show = (lambda v: str(int(v))) if kind is int else (lambda v: f"{v:g}")
        return f"in {'(' if self.lo_open else '['}{show(self.lo)}, {show(self.hi)}]"


@dataclass(frozen=True)
class SamplingField:
    """One parameter, as each surface spells and checks it."""

    name: str  # SamplingParams/Request field; also the batch-line and OpenAI body field
    kind: type  # int or float
    default: int | float | None
    label: str  # what messages and the parameters panel call it ("top-k")
    valid: Range  # what SamplingParams (or Request) accepts
    flags: tuple[str, ...]  # command-line spellings (llama.cpp's first)
    dest: str  # the argparse dest of those flags
    help: str  # the flags' --help text
    set_names: tuple[str, ...]  # `/set` names, listed; the first is the one messages use
    hint: str  # the parameters panel's placeholder
    api_range: Range | None = None  # the server's range (None: checked specially)
    nullable: bool = False  # None allowed: `none` in /set, empty in the panel, null in JSON
    in_sampling: bool = True  # a SamplingParams field (max_tokens is a Request field)
    openai: bool = True  # part of OpenAI's own API (else a llama.cpp-family extension)
    unlisted_set_names: tuple[str, ...] = ()  # accepted by /set, not listed
    metavar: str | None = None

    @property
    def json_types(self) -> tuple[type, ...]:
        """The JSON value types a batch line may give (bool never counts)."""
        return (int,) if self.kind is int else (int, float)

    def problem(self, value, label: str | None = None) -> str | None:
        """Why `value` is not accepted ('top-k must be >= 0, got -1'), or None."""
        if value is None and self.nullable or self.valid.contains(value):
            return None
        return f"{label or self.label} must be {self.valid.describe(self.kind)}, got {value}"


SAMPLING_FIELDS: tuple[SamplingField, ...] = (
    SamplingField("temperature", float, 0.8, "temperature", Range(0.0),
                  ("--temp", "--temperature"), "temp",
                  "temperature, 0 = greedy (default: %(default)s)",
                  ("temp", "temperature"), "0 = greedy", api_range=Range(0.0, 2.0)),
    SamplingField("top_k", int, 40, "top-k", Range(0),
                  ("--top-k",), "top_k", "(default: %(default)s)",
                  ("top_k", "top-k"), "0 = off", api_range=Range(0, 1_000_000), openai=False),
    SamplingField("top_p", float, 0.95, "top-p", Range(0.0, 1.0, lo_open=True),
                  ("--top-p",), "top_p", "(default: %(default)s)",
                  ("top_p", "top-p"), "(0, 1]", api_range=Range(0.0, 1.0, lo_open=True)),
    SamplingField("min_p", float, 0.05, "min-p", Range(0.0, 1.0),
                  ("--min-p",), "min_p", "(default: %(default)s)",
                  ("min_p", "min-p"), "[0, 1]", api_range=Range(0.0, 1.0), openai=False),
    SamplingField("repeat_penalty", float, 1.0, "repeat penalty", Range(0.0, lo_open=True),
                  ("--repeat-penalty",), "repeat_penalty", "(default: %(default)s)",
                  ("repeat_penalty", "repeat-penalty"), "1 = off",
                  api_range=Range(0.0, 10.0, lo_open=True), openai=False),
    SamplingField("max_tokens", int, None, "max tokens", Range(1),
                  ("-n", "--max-tokens", "--n-predict", "--predict"), "max_tokens",
                  "most tokens to generate (default: until done or context end)",
                  ("max_tokens", "max-tokens"), "empty: until done", nullable=True,
                  in_sampling=False, unlisted_set_names=("n",), metavar="N"),
    SamplingField("seed", int, None, "seed", Range(0, MAX_SEED),
                  ("-s", "--seed"), "seed", "sampling seed (default: random)",
                  ("seed",), "empty: random", nullable=True),
)
FIELD = {f.name: f for f in SAMPLING_FIELDS}
SAMPLING_PARAMS = tuple(f for f in SAMPLING_FIELDS if f.in_sampling)  # SamplingParams' fields


def check_sampling(values: dict) -> None:
    """UsageError naming the first SamplingParams field (in table order) out of range."""
    problems = [field.problem(values[field.name]) for field in SAMPLING_PARAMS]
    for problem in problems:
        if problem is not None:
            raise UsageError(problem)
