"""EngineConfig: what to load and how, validated once when it is made and passed whole
(choose() reads it, load_engine() builds from it). Its errors name settings (ctx_size), never
a front end's spelling of them (-c); the CLI translates them (cli/flags.py)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from localchat.errors import ConfigError

ENGINES = ("llama.cpp", "torch", "auto")  # auto: the measured rule (engine_rule.py), as None
ENGINE_ENV = "LOCALCHAT_ENGINE"  # the engine when none is asked for (scripts, CI)
USES = ("one-shot", "chat", "many")  # what the engine is loaded for: the rule measures that
CACHE_TYPES = ("f16", "bf16", "q8_0")
MAX_PARALLEL = 256
MAX_DRAFT_TOKENS = 32


@dataclass(frozen=True)
class DraftChoice:
    """Speculative decoding: none, auto (a distilled draft kept for the model, else prompt
    lookup, each request turning it off where it does not pay), ngram (prompt lookup) or a
    draft model's SPEC; tokens: a fixed γ (drafts per round), None: adaptive."""

    kind: Literal["none", "auto", "ngram", "model"] = "auto"
    spec: str | None = None  # kind "model" only
    tokens: int | None = None

    def __post_init__(self) -> None:
        if (self.kind == "model") != bool(self.spec):
            raise ConfigError("draft", "of kind 'model' needs a SPEC, and only it has one")
        n = self.tokens
        if n is not None and (type(n) is not int or not 1 <= n <= MAX_DRAFT_TOKENS):
            raise ConfigError("num_draft_tokens", f"must be 1..{MAX_DRAFT_TOKENS}, got {n}")
        if n is not None and self.kind == "none":
            raise ConfigError("num_draft_tokens", "needs a draft (a draft model or ngram)")

    @classmethod
    def parse(cls, text: str | None, tokens: int | None = None) -> "DraftChoice":
        """From its record or a name: None/'none'/'off', 'auto', 'ngram', else a model SPEC;
        with a fixed γ where tokens is given."""
        if text is None or text in ("none", "off"):
            return cls("none", tokens=tokens)
        if not isinstance(text, str):
            raise ConfigError("draft", f"must be a name or a model SPEC, got {text!r}")
        if text in ("auto", "ngram"):
            return cls(text, tokens=tokens)
        return cls("model", text, tokens)

    @property
    def enabled(self) -> bool:
        return self.kind != "none"

    def record(self) -> str | None:
        """What parse() reads back: None for none, else the kind or the SPEC."""
        return None if self.kind == "none" else (self.spec if self.kind == "model" else self.kind)

    def label(self) -> str:
        """How the UI names it: off, auto, ngram, or the draft file's name."""
        if self.kind != "model":
            return "off" if self.kind == "none" else self.kind
        spec = self.spec or ""
        return spec if ":" in spec else spec.replace("\\", "/").rsplit("/", 1)[-1]


NO_DRAFT = DraftChoice("none")


@dataclass(frozen=True)
class EngineConfig:
    """Every choice about loading a model. None means 'the default' for each: the engine
    the rule picks for the file and the use (engine_rule.py), ctx min(trained, 4096)
    (0: trained), all cores, 10 % of memory for the torch KV pool, 4 llama.cpp slots (16
    for many streams, within half the free memory)."""

    model: str = "default"
    engine: str | None = None
    ctx_size: int | None = None
    threads: int | None = None
    device: str | None = None  # auto, cpu, cuda[:N], mps
    gpu_layers: int | None = None  # llama.cpp: layers on the GPU (-1 all, 0 none)
    kv_memory: int | None = None  # bytes for the torch engine's paged KV cache
    kv_disk: int | None = None  # bytes of KV snapshots kept on disk (None: 2 GiB, 0: none)
    parallel: int | None = None  # sequences at once (llama.cpp: its KV slots)
    cache_type_k: str | None = None  # llama.cpp's KV cache types
    cache_type_v: str | None = None
    exact_batching: bool = False  # llama.cpp: cache types that keep batched bits = lone ones
    flash_attn: bool = True  # llama.cpp: False is llama-cpp-python's default (comparisons)
    draft: DraftChoice = NO_DRAFT  # a DraftChoice, or its record (None, "auto", "ngram", SPEC)
    chat_template: str | None = None  # a built-in template's name or a Jinja file
    endpoint: str | None = None  # an OpenAI-compatible server: nothing loads here
    api_key: str | None = None
    timeout: float | None = None  # seconds to wait for the endpoint
    use: str = "chat"  # one-shot (run), chat (one stream), many (serve, batch): USES

    def __post_init__(self) -> None:
        if not isinstance(self.draft, DraftChoice):
            object.__setattr__(self, "draft", DraftChoice.parse(self.draft))
        if not self.model.strip():
            raise ConfigError("model", "is empty")
        for problem in self._problems():
            raise ConfigError(*problem)

    def _problems(self):
        """(setting, problem) for each value that cannot work, in the order users meet them."""
        if self.engine is not None and self.engine not in ENGINES:
            yield "engine", f"must be one of {', '.join(ENGINES)}, got {self.engine!r}"
        if self.use not in USES:
            yield "use", f"must be one of {', '.join(USES)}, got {self.use!r}"
        if self.ctx_size is not None and self.ctx_size < 0:
            yield "ctx_size", f"must be >= 0, got {self.ctx_size}"
        if self.threads is not None and self.threads < 1:
            yield "threads", f"must be >= 1, got {self.threads}"
        if self.parallel is not None and not 1 <= self.parallel <= MAX_PARALLEL:
            yield "parallel", f"must be 1..{MAX_PARALLEL}, got {self.parallel}"
        if self.kv_memory is not None and self.kv_memory <= 0:
            yield "kv_memory", f"must be more than 0 bytes, got {self.kv_memory}"
        if self.kv_disk is not None and self.kv_disk < 0:
            yield "kv_disk", f"must be 0 (off) or more bytes, got {self.kv_disk}"
        if self.gpu_layers is not None and self.gpu_layers < -1:
            yield "gpu_layers", f"must be -1 (all), 0 (none) or more, got {self.gpu_layers}"
        for name in ("cache_type_k", "cache_type_v"):
            value = getattr(self, name)
            if value is not None and value not in CACHE_TYPES:
                yield name, f"must be one of {', '.join(CACHE_TYPES)}, got {value!r}"
        if self.timeout is not None and self.timeout <= 0:
            yield "timeout", f"must be more than 0 seconds, got {self.timeout}"
        if self.endpoint is not None:
            if self.chat_template is not None:
                yield "chat_template", ("is for local models: with an endpoint the server "
                                        "applies its own")
        elif self.timeout is not None:
            yield "timeout", "is for an endpoint: a local model has no server to wait for"

    @property
    def cache_types(self) -> tuple[str | None, str | None]:
        return self.cache_type_k, self.cache_type_v

    def without_draft(self, **changes) -> "EngineConfig":
        """This config with no draft, and `changes` applied."""
        return replace(self, draft=NO_DRAFT, **changes)
