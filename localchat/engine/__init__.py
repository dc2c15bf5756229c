"""Engines behind one interface (base.py). load_engine() is the only way in, so the
UI and CLI never import an engine's heavy dependencies themselves."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from localchat.engine.base import Engine
from localchat.errors import EngineError, ModelFormatError, UsageError
from localchat.models.facts import MIN_CTX, load_context

if TYPE_CHECKING:
    from localchat.models.facts import GGUFFacts

ENGINES = ("llama.cpp", "torch", "auto")


def load_engine(
    spec: str = "default",
    *,
    engine: str = "llama.cpp",
    ctx_size: int | None = None,
    threads: int | None = None,
    kv_memory: int | None = None,
    draft: str | None = None,
    num_draft_tokens: int | None = None,
    device: str | None = None,
    gpu_layers: int | None = None,
    parallel: int | None = None,
    cache_types: tuple[str | None, str | None] = (None, None),
    endpoint: str | None = None,
    api_key: str | None = None,
    chat_template: str | None = None,
    timeout: float | None = None,
) -> Engine:
    """Resolve a model SPEC, validate the file, load it into `engine` ("auto": torch where it runs
    the architecture, else llama.cpp). ctx_size None: min(trained, 4096), 0: trained; draft: a SPEC,
    "ngram" or "auto"; parallel, cache_types, gpu_layers: llama.cpp only; endpoint: a remote server
    (nothing loaded); chat_template: a built-in name or Jinja file. More: docs/design-notes.md."""
    from localchat.models.specs import resolve_model_facts

    if endpoint is not None:  # an OpenAI-compatible server does the work; spec names its model
        if chat_template is not None:
            raise UsageError("--chat-template is for local models: with --endpoint the server "
                             "applies its own")
        from localchat.engine.remote import RemoteEngine

        return RemoteEngine(endpoint, model=None if spec == "default" else spec,
                            api_key=api_key, ctx_size=ctx_size, timeout=timeout)
    if timeout is not None:
        raise UsageError("--timeout is for --endpoint: a local model has no server to wait for")
    if engine not in ENGINES:
        raise UsageError(f"unknown engine {engine!r} (choose from: {', '.join(ENGINES)})")
    if ctx_size is not None and ctx_size < 0:
        raise UsageError(f"context size must be >= 0, got {ctx_size}")
    if threads is not None and threads < 1:
        raise UsageError(f"threads must be >= 1, got {threads}")
    if parallel is not None and not 1 <= parallel <= 256:
        raise UsageError(f"--parallel must be 1..256, got {parallel}")
    facts = with_chat_template(resolve_model_facts(spec), chat_template)
    ctx_size = load_context(ctx_size, facts.context_length)
    if ctx_size < MIN_CTX:
        raise UsageError(f"context size must be at least {MIN_CTX} tokens, got {ctx_size}")
    if facts.context_length and ctx_size > facts.context_length:
        raise UsageError(f"-c {ctx_size} is more than {facts.name}'s trained context of "
                         f"{facts.context_length} tokens (-c 0 uses all of it)")
    if num_draft_tokens is not None and not 1 <= num_draft_tokens <= 32:
        raise UsageError(f"--num-draft-tokens must be 1..32, got {num_draft_tokens}")
    if num_draft_tokens is not None and draft is None:
        raise UsageError("--num-draft-tokens needs a draft: --draft-model SPEC or --draft ngram")
    auto_draft = draft == "auto"
    if auto_draft:  # a distilled draft kept for this model, else prompt lookup
        from localchat.models.drafts import kept_draft

        kept = None if facts.path.is_dir() else kept_draft(facts)
        draft = "ngram" if kept is None else str(kept)
    draft_facts = draft if draft in (None, "ngram") else resolve_model_facts(draft)
    if draft_facts is not None and draft_facts != "ngram":
        from localchat.engine.draft_vocab import check_same_vocabulary, tokenizer_metadata

        if facts.path.is_dir() or draft_facts.path.is_dir():
            raise UsageError("speculative decoding with Hugging Face directories is not "
                             "supported yet: use GGUF files for the model and the draft")
        check_same_vocabulary(tokenizer_metadata(facts.path), tokenizer_metadata(draft_facts.path),
                              draft_facts.name)

    hf_directory = facts.path.is_dir()  # a Hugging Face safetensors directory
    if engine == "auto":
        from localchat.engine.executors.torch.weights import SUPPORTED_ARCHITECTURES

        engine = "torch" if hf_directory or facts.architecture in SUPPORTED_ARCHITECTURES \
            else "llama.cpp"
    if hf_directory and engine == "llama.cpp":
        raise UsageError(f"the llama.cpp engine needs a GGUF file, and {facts.path.name} is a "
                         "Hugging Face directory; use --engine torch")
    if engine == "torch" and any(cache_types):
        raise UsageError("--cache-type-k/-v are for the llama.cpp engine; the torch engine "
                         "keeps its KV cache in float16")
    if gpu_layers is not None and gpu_layers < -1:
        raise UsageError(f"-ngl/--n-gpu-layers must be -1 (all), 0 (none) or more, "
                         f"got {gpu_layers}")
    if engine == "torch" and gpu_layers is not None:
        raise UsageError("-ngl/--n-gpu-layers is for the llama.cpp engine; the torch engine "
                         "puts the whole model on --device")
    if engine == "llama.cpp" and device not in (None, "auto", "cpu"):
        raise UsageError(f"--device {device} is for the torch engine; the llama.cpp engine "
                         "offloads to the GPU its build supports (or --device cpu for none)")
    from localchat.engine.loading import load_runtime

    try:
        return load_runtime(facts, engine, n_ctx=ctx_size, threads=threads, kv_memory=kv_memory,
                            device=device, gpu_layers=gpu_layers, parallel=parallel,
                            draft=draft_facts, num_draft_tokens=num_draft_tokens,
                            auto_draft=auto_draft,
                            cache_types=tuple(cache_types))
    except (EngineError, ModelFormatError):  # the file is broken: `models` stops listing it
        from localchat.models.specs import forget

        forget(facts.path)
        raise


def with_chat_template(facts: GGUFFacts, override: str | None) -> GGUFFacts:
    """The facts with the chat template prompts render with (builtin_templates.py)."""
    from localchat.chat.builtin_templates import choose_template

    chosen = choose_template(facts.chat_template, facts.architecture, facts.chat_markers,
                             override)
    return replace(facts, chat_template=chosen.source, chat_template_name=chosen.name,
                   base_model=not facts.chat_template and not facts.chat_markers)
