"""ChatSettings: what a chat runs with, built once from command-line flags and shared
by `localchat run` and the TUI so both read the flags the same way."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, fields, replace

from localchat.engine.base import Message, SamplingParams
from localchat.errors import LocalchatError
from localchat.sampling_fields import SAMPLING_PARAMS
from localchat.units import parse_memory


@dataclass(frozen=True)
class ChatSettings:
    model: str = "default"
    engine: str = "llama.cpp"
    ctx_size: int | None = None
    threads: int | None = None
    device: str | None = None  # auto, cpu, cuda[:N], mps
    gpu_layers: int | None = None  # -ngl: llama.cpp layers on the GPU (None: all it can)
    kv_memory: int | None = None  # bytes for the torch engine's paged KV cache
    parallel: int | None = None  # sequences at once (the llama.cpp engine's KV slots)
    cache_types: tuple[str | None, str | None] = (None, None)  # llama.cpp's K, V cache types
    draft: str | None = None  # a draft model SPEC, "ngram" (prompt lookup) or "auto"
    num_draft_tokens: int | None = None  # fixed γ; None: adaptive
    endpoint: str | None = None  # an OpenAI-compatible server URL: the remote engine
    api_key: str | None = None  # the endpoint's key
    timeout: float | None = None  # seconds to wait for the endpoint's answers
    chat_template: str | None = None  # a built-in template's name or a Jinja file
    system: str | None = None
    max_tokens: int | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "ChatSettings":
        return cls(
            model=args.model,
            engine=args.engine,
            ctx_size=args.ctx_size,
            threads=args.threads,
            device=args.device,
            gpu_layers=getattr(args, "gpu_layers", None),
            kv_memory=parse_memory(args.kv_memory) if args.kv_memory else None,
            parallel=getattr(args, "parallel", None),
            cache_types=(getattr(args, "cache_type_k", None), getattr(args, "cache_type_v", None)),
            draft=None if args.no_draft else (args.draft_model or args.draft or "auto"),
            num_draft_tokens=args.num_draft_tokens,
            endpoint=getattr(args, "endpoint", None),
            api_key=getattr(args, "api_key", None),
            timeout=getattr(args, "timeout", None),
            chat_template=getattr(args, "chat_template", None),
            system=args.system,
            max_tokens=args.max_tokens,
            sampling=SamplingParams(**{f.name: getattr(args, f.dest) for f in SAMPLING_PARAMS}),
        )

    def params(self) -> dict:
        """Sampling and max_tokens as a plain dict (what a conversation stores)."""
        return {**{f.name: getattr(self.sampling, f.name) for f in fields(SamplingParams)},
                "max_tokens": self.max_tokens}

    def with_params(self, params: dict) -> "ChatSettings":
        """These settings with a stored conversation's parameters; unknown keys are
        ignored and a stored set that no longer validates leaves sampling as it was."""
        known = {f.name for f in fields(SamplingParams)}
        changes = {k: v for k, v in params.items() if k in known}
        try:
            sampling = replace(self.sampling, **changes)
        except (LocalchatError, TypeError):
            sampling = self.sampling
        max_tokens = params.get("max_tokens", self.max_tokens)
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
            max_tokens = self.max_tokens
        return replace(self, sampling=sampling, max_tokens=max_tokens)

    def system_messages(self) -> list[Message]:
        return [Message("system", self.system)] if self.system else []

    def with_parallel(self, default: int) -> "ChatSettings":
        """These settings with `default` requests at once unless -np/--parallel said."""
        return self if self.parallel is not None else replace(self, parallel=default)

    def with_draft(self, draft: str | None, num_draft_tokens: int | None) -> "ChatSettings":
        return replace(self, draft=draft, num_draft_tokens=num_draft_tokens)

    def load_engine(self):
        from localchat.engine import load_engine

        return load_engine(self.model, engine=self.engine, ctx_size=self.ctx_size,
                           threads=self.threads, kv_memory=self.kv_memory, draft=self.draft,
                           device=self.device, gpu_layers=self.gpu_layers,
                           parallel=self.parallel,
                           cache_types=self.cache_types,
                           endpoint=self.endpoint, api_key=self.api_key,
                           num_draft_tokens=self.num_draft_tokens,
                           chat_template=self.chat_template, timeout=self.timeout)
