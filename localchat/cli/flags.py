"""The flag groups that several commands share: model, remote endpoint, sampling and
quality measurement (sampling flags come from SAMPLING_FIELDS); and the one conversion of
parsed flags into an EngineConfig and ReplyParams, with the flag each setting is given by."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from localchat.chat.params import ReplyParams
from localchat.engine import choose, open_engine
from localchat.engine.base import Engine, SamplingParams
from localchat.engine.config import DraftChoice, EngineConfig
from localchat.errors import ConfigError, UsageError
from localchat.sampling_fields import SAMPLING_FIELDS, SAMPLING_PARAMS
from localchat.units import parse_memory

# How each EngineConfig setting is spelled on the command line (errors name the flag).
SETTING_FLAGS = {
    "model": "-m/--model", "engine": "--engine", "ctx_size": "-c/--ctx-size",
    "threads": "-t/--threads", "device": "--device", "gpu_layers": "-ngl/--n-gpu-layers",
    "kv_memory": "--kv-memory", "kv_disk": "--kv-disk", "parallel": "-np/--parallel",
    "cache_type_k": "-ctk/--cache-type-k", "cache_type_v": "-ctv/--cache-type-v",
    "exact_batching": "--exact-batching",
    "draft": "--draft-model", "num_draft_tokens": "--num-draft-tokens",
    "chat_template": "--chat-template", "endpoint": "--endpoint", "api_key": "--api-key",
    "timeout": "--timeout",
}


def flag_error(exc: ConfigError) -> UsageError:
    """The config's error as the command line says it: the flag, then the problem."""
    return UsageError(f"{SETTING_FLAGS.get(exc.setting, exc.setting)} {exc.problem}")


def engine_config(args: argparse.Namespace, **overrides) -> EngineConfig:
    """The EngineConfig the model flags (and endpoint flags, where the command has them)
    ask for; overrides replace single settings (e.g. parallel for one request)."""
    values = dict(
        model=args.model, engine=args.engine, ctx_size=args.ctx_size, threads=args.threads,
        device=args.device, gpu_layers=getattr(args, "gpu_layers", None),
        kv_memory=parse_memory(args.kv_memory) if args.kv_memory else None,
        kv_disk=kv_disk_bytes(getattr(args, "kv_disk", None)),
        parallel=getattr(args, "parallel", None),
        cache_type_k=getattr(args, "cache_type_k", None),
        cache_type_v=getattr(args, "cache_type_v", None),
        exact_batching=getattr(args, "exact_batching", False),
        draft=draft_choice(args),
        chat_template=getattr(args, "chat_template", None),
        endpoint=getattr(args, "endpoint", None))
    if values["endpoint"] is not None:
        values.update(api_key=getattr(args, "api_key", None), timeout=getattr(args, "timeout", None))
    elif getattr(args, "timeout", None) is not None:
        values["timeout"] = args.timeout  # refused by the config: it needs an endpoint
    return EngineConfig(**{**values, **overrides})


def kv_disk_bytes(text: str | None) -> int | None:
    """--kv-disk's value in bytes: None when not given, 0 (snapshots off) for 0."""
    if text is None:
        return None
    return 0 if text.strip() in ("0", "0B", "off") else parse_memory(text)


def load_for_run(config: EngineConfig, *, verbose: bool = False) -> Engine:
    """The engine for a command: the plan's notes (threads capped, ...) on stderr, and with
    --verbose which engine runs the file and why, and what computes (CPU variant, kernels)."""
    plan = choose(config)
    for note in plan.notes:
        print(f"localchat: note: {note}", file=sys.stderr)
    if verbose and plan.facts is not None:
        print(f"localchat: engine {plan.engine} ({plan.why})", file=sys.stderr)
    engine = open_engine(config, plan)
    if verbose and engine.info.compute:
        print(f"localchat: compute: {engine.info.compute}", file=sys.stderr)
    for note in getattr(engine, "notes", ()):
        print(f"localchat: note: {note}", file=sys.stderr)
    return engine


def draft_choice(args: argparse.Namespace) -> DraftChoice:
    """--no-draft, --draft-model SPEC, --draft auto|ngram (auto when none is given), with
    --num-draft-tokens' fixed γ."""
    tokens = getattr(args, "num_draft_tokens", None)
    if args.no_draft:
        return DraftChoice("none", tokens=tokens)
    if args.draft_model:
        return DraftChoice("model", args.draft_model, tokens)
    return DraftChoice(args.draft or "auto", tokens=tokens)


def reply_params(args: argparse.Namespace) -> ReplyParams:
    """The ReplyParams the sampling flags and -sys ask for."""
    return ReplyParams(SamplingParams(**{f.name: getattr(args, f.dest) for f in SAMPLING_PARAMS}),
                       max_tokens=args.max_tokens, system=args.system)


def explicit_sampling(args: argparse.Namespace) -> dict:
    """Sampling flags whose value differs from the flag's default (they override what a
    continued conversation stored)."""
    return {f.name: getattr(args, f.dest) for f in SAMPLING_FIELDS
            if getattr(args, f.dest) != f.default}


def with_parallel(config: EngineConfig, default: int) -> EngineConfig:
    """config with `default` requests at once unless -np/--parallel said."""
    return config if config.parallel is not None else replace(config, parallel=default)


def model_flags() -> argparse.ArgumentParser:
    """-m and how the model is loaded and run (engine, context, device, draft)."""
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("model")
    g.add_argument("-m", "--model", default="default", metavar="SPEC",
                   help="'default' (bundled SmolLM2-135M), a .gguf path, or OWNER/REPO:FILE.gguf "
                        "or OWNER/REPO:QUANT on Hugging Face (default: %(default)s)")
    g.add_argument("--engine", default=None, choices=["llama.cpp", "torch", "auto"],
                   help="executor under localchat's runtime: llama.cpp's kernels (every GGUF "
                        "architecture), localchat's torch model (Llama-family GGUF, NF4, "
                        "INT8/INT4, GPTQ, Hugging Face directories), or auto (default: "
                        "$LOCALCHAT_ENGINE, else auto: where both run the file, the one "
                        "measured faster on it here for the command's use, measured once "
                        "and kept; else the one that runs it)")
    g.add_argument("-c", "--ctx-size", type=int, default=None, metavar="N",
                   help="context window in tokens (default: min(model's, 4096); 0 = model's)")
    g.add_argument("-t", "--threads", type=int, default=None, metavar="N",
                   help="CPU threads (default: all cores, fewer while other processes keep "
                        "cores busy: the llama.cpp engine times its steps and moves the count "
                        "where they run faster)")
    g.add_argument("--device", default=None, metavar="DEVICE",
                   help="auto, cpu, cuda[:N] or mps (default: auto: CUDA, else MPS, else CPU; "
                        "the llama.cpp engine offloads to its GPU unless this is cpu)")
    g.add_argument("-ngl", "--n-gpu-layers", "--gpu-layers", dest="gpu_layers", type=int,
                   default=None, metavar="N",
                   help="llama.cpp engine: layers to offload to the GPU, 0 = none, -1 = all "
                        "(default: all where its build has a GPU)")
    g.add_argument("--kv-memory", default=None, metavar="SIZE",
                   help="torch engine: memory for the paged KV cache, e.g. 2GB "
                        "(default: 10%% of available memory, at least one context)")
    g.add_argument("--kv-disk", default=None, metavar="SIZE",
                   help="disk for KV snapshots: a finished reply's KV is saved so the "
                        "conversation reopens (after a restart, on a branch) without prefilling "
                        "it again; least recently used go first; 0 = off (default: 2GiB)")
    g.add_argument("-np", "--parallel", type=int, default=None, metavar="N",
                   help="requests computed at once; the llama.cpp engine keeps a KV slot of "
                        "one full context for each (default: 4; serve: min(--max-queue, 16), "
                        "fewer where their KV passes half the free memory)")
    for kv in ("k", "v"):
        g.add_argument(f"-ct{kv}", f"--cache-type-{kv}", dest=f"cache_type_{kv}", default=None,
                       choices=["f16", "bf16", "q8_0"],
                       help=f"llama.cpp engine: the KV cache's {kv.upper()} type (default: f16, "
                            "llama.cpp's own and the fastest; --exact-batching: q8_0 K, f16 V)")
    g.add_argument("--exact-batching", action="store_true", default=False,
                   help="llama.cpp engine: KV cache types (q8_0 K, f16 V on the CPU) with which "
                        "a reply computes the same bits alone, batched with others or with "
                        "a draft; f16 K is faster in prompts and long contexts and does not "
                        "(the torch engine is always exact)")
    g.add_argument("--chat-template", default=None, metavar="NAME|FILE",
                   help="render prompts with a built-in format (chatml, llama3, gemma, mistral, "
                        "llama2, phi3) or a Jinja file instead of the model's own template "
                        "(default: the model's; a file without one gets its family's format)")
    d = p.add_argument_group("speculative decoding")
    d.add_argument("--draft-model", default=None, metavar="SPEC",
                   help="a small model (or a more quantized copy of this one) with the same "
                        "vocabulary drafts tokens that the model verifies")
    d.add_argument("--draft", default=None, choices=["auto", "ngram"],
                   help="auto (the default): the draft `localchat distill` made for this model, "
                        "else prompt lookup, each request switching it off where it does not "
                        "pay (never for a --seed request, which stays reproducible); ngram: "
                        "prompt lookup over the conversation (no model)")
    d.add_argument("--num-draft-tokens", "--draft-max", dest="num_draft_tokens", type=int,
                   default=None, metavar="K",
                   help="draft K tokens per step (default: adaptive, off when it does not pay)")
    d.add_argument("--no-draft", action="store_true", help="no speculative decoding")
    return p


def endpoint_flags() -> argparse.ArgumentParser:
    """--endpoint and its key and timeout: the remote engine."""
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("remote engine")
    g.add_argument("--endpoint", default=None, metavar="URL",
                   help="use an OpenAI-compatible server (localchat serve, llama.cpp's server, "
                        "vLLM, Ollama) instead of loading a model here, e.g. "
                        "http://127.0.0.1:8080/v1")
    g.add_argument("--api-key", default=None, metavar="KEY",
                   help="--endpoint's API key (default: $LOCALCHAT_API_KEY)")
    g.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="--endpoint: the longest wait for the server to connect (at most 10 s) "
                        "or to answer, first byte or next token (default: 60)")
    return p


def sampling_flags() -> argparse.ArgumentParser:
    """The system prompt, then SAMPLING_FIELDS' flags (-n first, as llama.cpp lists it)."""
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("sampling")
    g.add_argument("-sys", "--system-prompt", "--system", dest="system", default=None,
                   metavar="TEXT", help="system prompt")
    for f in sorted(SAMPLING_FIELDS, key=lambda f: f.name != "max_tokens"):
        g.add_argument(*f.flags, dest=f.dest, type=f.kind, default=f.default,
                       metavar=f.metavar, help=f.help)
    return p


def quality_flags(p: argparse.ArgumentParser) -> None:
    """Adds eval's and quantize --report's measurement flags to p."""
    g = p.add_argument_group("quality measurement")
    g.add_argument("--tokens", type=int, default=1024, metavar="N",
                   help="scored tokens of held-out text (default: %(default)s)")
    g.add_argument("--window", type=int, default=512, metavar="N",
                   help="context window per forward pass (default: %(default)s)")
    g.add_argument("--stride", type=int, default=None, metavar="N",
                   help="new tokens scored per window after the first (default: window/2)")
    g.add_argument("--text", default=None, metavar="FILE",
                   help="held-out text (default: Python's own docs, pydoc_data.topics)")
    g.add_argument("--cost-ratio", type=float, default=0.3, metavar="C",
                   help="draft/target cost ratio for the predicted speedup (default: %(default)s)")
    g.add_argument("--gamma", type=int, default=4, metavar="G",
                   help="draft tokens per step for the predicted speedup (default: %(default)s)")


def quality_protocol(args):
    """The measurement protocol quality_flags() describe (a quantize.quality.Protocol)."""
    from quantize.quality import Protocol

    window = args.window
    stride = args.stride or window // 2
    if args.tokens < 16 or window < 32:
        raise UsageError("--tokens must be at least 16 and --window at least 32")
    if not 0 < args.cost_ratio or args.gamma < 1:
        raise UsageError("--cost-ratio must be positive and --gamma at least 1")
    text = args.text or "pydoc_data.topics (Python's documentation)"
    return Protocol(args.tokens, window, stride, text, args.gamma, args.cost_ratio)
