"""ReplyParams: what a reply is generated with (sampling, max_tokens, system prompt), and the
record a conversation and each reply store of it, with the context size and draft the chat
ran with. The only code that writes or reads that record."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Sequence

from localchat.engine.base import Message, Request, SamplingParams
from localchat.engine.config import MAX_DRAFT_TOKENS, DraftChoice, EngineConfig
from localchat.engine.constraint import Constraint
from localchat.errors import LocalchatError
from localchat.models.facts import MIN_CTX

SAMPLING_KEYS = tuple(f.name for f in fields(SamplingParams))


@dataclass(frozen=True)
class ReplyParams:
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int | None = None  # None: until the model stops or the context is full
    system: str | None = None
    constraint: Constraint | None = None  # what every reply must look like (/json)
    format_prompt: bool = True  # say a JSON constraint in the system turn (run --no-format-prompt)
    tools_off: tuple[str, ...] = ()  # MCP tools this conversation does not offer (/tools off)
    tools_allowed: tuple[str, ...] = ()  # tools that run without asking here ("always")

    def system_messages(self) -> list[Message]:
        return [Message("system", self.system)] if self.system else []

    def request(self, messages: Sequence[Message], **options: Any) -> Request:
        """A Request for messages with these sampling, max_tokens and constraint (options:
        the rest)."""
        return Request(messages=list(messages), sampling=self.sampling,
                       max_tokens=self.max_tokens, constraint=self.constraint,
                       format_prompt=self.format_prompt, **options)

    def to_record(self) -> dict:
        """Sampling, max_tokens and the constraint as the plain dict a conversation stores."""
        record = {**{k: getattr(self.sampling, k) for k in SAMPLING_KEYS},
                  "max_tokens": self.max_tokens}
        if self.constraint is not None:
            record["constraint"] = {"kind": self.constraint.kind, "text": self.constraint.text}
        if self.tools_off:
            record["tools_off"] = list(self.tools_off)
        if self.tools_allowed:
            record["tools_allowed"] = list(self.tools_allowed)
        return record

    def updated(self, changes: dict) -> "ReplyParams":
        """These params with a record's (or explicit flags') sampling and max_tokens; unknown
        keys are ignored, and a set that does not validate leaves sampling as it was."""
        try:
            sampling = replace(self.sampling, **{k: v for k, v in changes.items()
                                                 if k in SAMPLING_KEYS})
        except (LocalchatError, TypeError):
            sampling = self.sampling
        max_tokens = changes.get("max_tokens", self.max_tokens)
        if max_tokens is not None and (type(max_tokens) is not int or max_tokens < 1):
            max_tokens = self.max_tokens
        return replace(self, sampling=sampling, max_tokens=max_tokens)

    @classmethod
    def from_record(cls, record: dict, system_prompt: str | None,
                    defaults: "ReplyParams") -> "ReplyParams":
        """A stored conversation's params over `defaults` (values a damaged record holds
        are ignored)."""
        record = record if isinstance(record, dict) else {}
        stored = record.get("constraint")
        try:
            constraint = Constraint(stored["kind"], stored.get("text", "")) \
                if isinstance(stored, dict) and isinstance(stored.get("text", ""), str) else None
        except (LocalchatError, KeyError, TypeError):
            constraint = None
        return replace(defaults.updated(record), system=system_prompt or None,
                       constraint=constraint, tools_off=_names(record.get("tools_off")),
                       tools_allowed=_names(record.get("tools_allowed")))


def _names(value) -> tuple[str, ...]:
    """A stored list of tool names; anything else reads as none."""
    return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()


def conversation_record(params: ReplyParams, config: EngineConfig) -> dict:
    """What a conversation and each reply store: params.to_record(), plus the context size
    and draft it runs with where they were chosen (a reopened chat restores them)."""
    record = params.to_record()
    if config.ctx_size is not None:
        record["ctx_size"] = config.ctx_size
    if config.draft.record() is not None:
        record["draft"] = config.draft.record()
        record["num_draft_tokens"] = config.draft.tokens
    return record


def config_from_record(config: EngineConfig, record: dict, model: str | None) -> EngineConfig:
    """`config` with the model, context size and draft a stored conversation ran with
    (values a damaged record holds are ignored; a chat that ran without a draft keeps
    config's)."""
    ctx_size = record.get("ctx_size", config.ctx_size)
    if type(ctx_size) is not int or ctx_size < MIN_CTX:
        ctx_size = config.ctx_size
    draft, n_draft = record.get("draft"), record.get("num_draft_tokens")
    if isinstance(draft, str) and draft:
        draft = DraftChoice.parse(draft)
        if type(n_draft) is int and 1 <= n_draft <= MAX_DRAFT_TOKENS and draft.enabled:
            draft = replace(draft, tokens=n_draft)
    else:
        draft = config.draft
    return replace(config, model=model or config.model, ctx_size=ctx_size, draft=draft)
