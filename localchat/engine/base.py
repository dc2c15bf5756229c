"""The one engine interface the UI, the CLI and every engine share: a Request in, Delta events
(each with live Stats) then exactly one Result out; setting generate()'s cancel Event ends
the stream with finish_reason "cancelled". Imports neither torch nor llama_cpp."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Iterator, Literal, Sequence, Union

from localchat.engine.constraint import Constraint
from localchat.errors import UsageError
from localchat.message import (  # noqa: F401 -- part of the engine interface
    Message, Role, Tool, ToolCall)
from localchat.prompt.tool_calls import tool_format_for
from localchat.sampling_fields import FIELD, check_sampling

if TYPE_CHECKING:  # no import at run time: base.py stays free of file-format code
    from localchat.models.facts import GGUFFacts

FinishReason = Literal["stop", "length", "cancelled"]


@dataclass(frozen=True)
class SamplingParams:
    """Sampling as llama.cpp users know it. temperature 0 means greedy. Defaults and
    ranges: SAMPLING_FIELDS."""

    temperature: float = FIELD["temperature"].default
    top_k: int = FIELD["top_k"].default
    top_p: float = FIELD["top_p"].default
    min_p: float = FIELD["min_p"].default
    repeat_penalty: float = FIELD["repeat_penalty"].default
    seed: int | None = FIELD["seed"].default

    def __post_init__(self) -> None:
        check_sampling(vars(self))


@dataclass(frozen=True)
class Request:
    """Either chat messages (rendered with the model's template) or raw prompt tokens."""

    messages: Sequence[Message] = ()
    prompt_tokens: Sequence[int] | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int | None = None  # None: until stop or the end of the context
    stop: Sequence[str] = ()
    # Text the assistant's reply already starts with (a stopped reply being continued):
    # the prompt ends with it after the template's generation prompt, and only what
    # follows is generated and returned.
    assistant_prefix: str = ""
    # what the reply must look like (a JSON schema, any JSON object, a grammar); the
    # runtime masks sampling by it and ends the reply when it is complete
    constraint: Constraint | None = None
    # a JSON constraint is also said in the system turn, unless a message already asks
    # for it (prompt/format_prompt.py); False: the messages are rendered as given
    format_prompt: bool = True
    # functions the prompt offers the model (rendered by the chat template, or as its
    # family's tools section); reading calls out of the reply is the caller's part
    tools: tuple[Tool, ...] = ()

    def __post_init__(self) -> None:
        if not self.messages and not self.prompt_tokens:
            raise UsageError("a request needs messages or prompt tokens")
        if self.assistant_prefix and self.prompt_tokens is not None:
            raise UsageError("an assistant prefix needs chat messages, not prompt tokens")
        problem = FIELD["max_tokens"].problem(self.max_tokens)
        if problem is not None:
            raise UsageError(problem)


@dataclass(frozen=True)
class Stats:
    """What one generation cost, measured by the engine where the work happened.

    Rates are 0.0 when there was nothing to measure (e.g. one token: no decode rate).
    """

    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt prefix reused from the KV cache, not recomputed
    completion_tokens: int = 0
    ttft_s: float = 0.0
    prefill_tok_s: float = 0.0
    decode_tok_s: float = 0.0
    elapsed_s: float = 0.0
    kv_cache_bytes: int = 0  # KV the conversation holds: in use, or once done still cached for it
    kv_cache_capacity_bytes: int = 0
    kv_cache_cached_bytes: int = 0  # other KV not in use, kept as reusable prefixes (evictable)
    context_tokens: int = 0  # tokens in the context window now
    context_capacity: int = 0
    # continuous batching: times this request was preempted (its KV freed when the cache
    # ran out) and the tokens that had to be computed again because of it
    preemptions: int = 0
    recomputed_tokens: int = 0
    # speculative decoding, when a draft is in use: proposed, accepted, acceptance_rate,
    # tokens_per_target_pass, accepted_run_histogram, gamma, alpha, c, predicted and
    # measured speedup, the draft's source and the acceptance rule
    draft: dict | None = None
    # KV snapshots on disk: prompt tokens restored from one and the seconds it took; the
    # snapshot folder's size
    restored_tokens: int = 0
    restore_s: float = 0.0
    kv_disk_bytes: int = 0
    kv_saved: str = ""  # "saved: N tokens", or why the reply's KV was not saved to disk

    def to_dict(self) -> dict:
        return asdict(self)

    def restored_note(self) -> str | None:
        """'restored 2,944 tokens from disk in 0.12 s', or None if nothing was."""
        if not self.restored_tokens:
            return None
        return f"restored {self.restored_tokens:,} tokens from disk in {self.restore_s:.2f} s"


@dataclass(frozen=True)
class Delta:
    """New text (possibly empty while a multi-byte character is incomplete)."""

    text: str
    token_ids: tuple[int, ...]
    stats: Stats
    from_draft: bool = False  # the token was proposed by a draft and accepted


@dataclass(frozen=True)
class Result:
    text: str
    finish_reason: FinishReason
    stats: Stats


Event = Union[Delta, Result]


BASE_MODEL_NOTE = "this looks like a base model (no chat template): replies continue your text"


@dataclass(frozen=True)
class ModelInfo:
    """Facts about the loaded model that the UI shows and the context policy needs."""

    name: str
    path: str
    architecture: str
    quant_type: str
    file_size: int
    n_ctx_train: int
    n_ctx: int  # the context window this engine was loaded with
    n_layers: int
    n_kv_heads: int
    head_dim: int
    kv_bytes_per_token: int
    weights_bytes: int = 0  # model weights as the engine holds them in memory
    chat_template: str = ""  # which chat template renders prompts, and where it came from
    base_model: bool = False  # no chat template and no chat tokens in the file: replies continue text
    kernels: dict[str, str] = field(default_factory=dict)  # "ffn_down 576x1536 Q4_1" -> "int4pack"
    compute: str = ""  # what computes: llama.cpp's CPU variant and features, torch's kernels' ISA
    tool_format: str = "hermes"  # how its chat template's family writes tool calls

    @classmethod
    def from_facts(cls, facts: "GGUFFacts", *, n_ctx: int, kv_bytes_per_token: int,
                   weights_bytes: int, kernels: dict[str, str] | None = None,
                   compute: str = "") -> "ModelInfo":
        """The file's facts plus what only the loaded engine knows."""
        return cls(
            name=facts.name, path=str(facts.path), architecture=facts.architecture,
            quant_type=facts.quant_type, file_size=facts.file_size,
            n_ctx_train=facts.context_length, n_ctx=n_ctx, n_layers=facts.n_layers,
            n_kv_heads=facts.n_kv_heads, head_dim=facts.head_dim,
            kv_bytes_per_token=kv_bytes_per_token, weights_bytes=weights_bytes,
            chat_template=facts.chat_template_name, base_model=facts.base_model,
            kernels=dict(kernels or {}), compute=compute,
            tool_format=tool_format_for(facts.chat_template),
        )


class Engine(ABC):
    """An in-process inference engine bound to one loaded model."""

    name: str
    info: ModelInfo
    why: str = ""  # why this executor runs the file: "as asked", or the rule's reason

    @abstractmethod
    def generate(self, request: Request, cancel: threading.Event | None = None) -> Iterator[Event]:
        """Stream Delta events, then one Result. Raises ContextOverflowError up front
        when the prompt cannot fit."""

    @abstractmethod
    def count_prompt_tokens(self, messages: Sequence[Message]) -> int:
        """Tokens the rendered chat prompt takes (used to fit history into the context)."""

    def memory(self) -> dict:
        """KV cache and context use right now (the Stats fields of the same names), for
        gauges and the server's /health between requests."""
        return {}

    def complete(self, request: Request, cancel: threading.Event | None = None) -> Result:
        """Run a request to the end and return only its Result."""
        result = None
        for event in self.generate(request, cancel):
            if isinstance(event, Result):
                result = event
        assert result is not None, "an engine stream must end with a Result"
        return result

    def close(self) -> None:
        """Release the model. Safe to call twice."""
