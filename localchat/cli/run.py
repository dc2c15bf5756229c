"""`localchat run`: one prompt in, the reply out on stdout, for scripts and pipes.

stdout carries only the reply (or one JSON object with --json); stats go to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from dataclasses import replace

from localchat.chat.params import ReplyParams
from localchat.chat.session import ChatSession
from localchat.cli import batch
from localchat.cli.flags import engine_config, explicit_sampling, load_for_run, reply_params
from localchat.cli.constraint_flags import add_constraint_flags, constraint_from_args
from localchat.cli.stdin_text import read_stdin_text
from localchat.engine.base import BASE_MODEL_NOTE, Delta, Request, Result, Stats
from localchat.errors import LocalchatError, UsageError
from localchat.interrupts import ctrl_c_cancels
from localchat.units import human_bytes


def read_prompt_file(path: str) -> str:
    """-f FILE as text (invalid UTF-8 replaced, as for stdin); UsageError if unreadable."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise UsageError(f"-f {path}: cannot read it ({exc.strerror or exc})") from None
    text = data.decode("utf-8", errors="replace")
    if "\ufffd" in text and "\ufffd" not in data.decode("utf-8", errors="ignore"):
        print(f"localchat: warning: {path} is not valid UTF-8; invalid bytes replaced with "
              "U+FFFD", file=sys.stderr)
    return text


def with_attachments(prompt: str, paths: list[str]) -> str:
    """--attach FILE...: each file as a named, fenced block before the prompt (one user
    turn, so templates that require alternating roles still render)."""
    from localchat.chat.attachments import read_attachment

    blocks = [read_attachment(p).as_message() for p in paths]
    return "\n\n".join([*blocks, prompt])


def prompt_argument(args: argparse.Namespace) -> str | None:
    """PROMPT or -p TEXT (not both)."""
    flag = getattr(args, "prompt_flag", None)
    if flag is not None and args.prompt is not None:
        raise UsageError("give the prompt once: as PROMPT or as -p/--prompt, not both")
    return flag if flag is not None else args.prompt


def read_prompt(arg: str | None, stdin=None, file: str | None = None) -> str:
    """Piped stdin first, then FILE (-f), then the argument, joined by newlines (as `llm`
    does)."""
    stdin = stdin if stdin is not None else sys.stdin
    parts = []
    if arg == "-" or (stdin is not None and not stdin.isatty()):
        piped = read_stdin_text(stdin)
        if piped.strip():
            parts.append(piped.rstrip("\n"))
    if file is not None:
        parts.append(read_prompt_file(file).rstrip("\n"))
    if arg not in (None, "-"):
        parts.append(arg)
    prompt = "\n".join(parts)
    if not prompt.strip():
        raise UsageError("no prompt: give one as an argument or pipe it on stdin")
    return prompt


def format_stats(stats: Stats) -> str:
    """An aligned block like `ollama run --verbose`, for stderr."""
    rows = [
        ("time to first token", f"{stats.ttft_s * 1000:.0f} ms"),
        ("prompt eval count", f"{stats.prompt_tokens} token(s) ({stats.cached_tokens} cached)"),
        ("prompt eval rate", f"{stats.prefill_tok_s:.1f} tokens/s"),
        ("eval count", f"{stats.completion_tokens} token(s)"),
        ("eval rate", f"{stats.decode_tok_s:.1f} tokens/s"),
        ("total duration", f"{stats.elapsed_s:.2f} s"),
        ("kv cache", f"{human_bytes(stats.kv_cache_bytes)} of "
                     f"{human_bytes(stats.kv_cache_capacity_bytes)}"),
        ("context", f"{stats.context_tokens} of {stats.context_capacity} tokens"),
    ]
    if stats.restored_tokens:
        rows.insert(2, ("kv from disk", stats.restored_note()))
    if stats.kv_saved:
        rows.append(("kv snapshot", stats.kv_saved))
    if stats.draft:
        d = stats.draft
        rows += [
            ("draft", d["source"]),
            ("draft accepted", f"{d['accepted']} of {d['proposed']} "
                               f"({d['acceptance_rate']:.0%}), γ {d['gamma']}"),
            ("acceptance rule", d["rule"]),
        ]
        if d.get("predicted_speedup") is not None and d.get("measured_speedup") is not None:
            rows.append(("draft speedup", f"{d['measured_speedup']:.2f}x measured, "
                                          f"{d['predicted_speedup']:.2f}x predicted"))
        elif d.get("proposed"):
            rows.append(("draft speedup", "not measured (too few drafted rounds)"))
    return "\n".join(f"{name + ':':<22}{value}" for name, value in rows)


def continued_params(params: ReplyParams, conv, args: argparse.Namespace) -> ReplyParams:
    """A continued conversation's stored params, with the flags given explicitly over them."""
    stored = ReplyParams.from_record(conv.params, conv.system_prompt, params)
    system = args.system if args.system is not None else stored.system
    constraint = params.constraint or stored.constraint  # -j given now, else the stored one
    return replace(stored.updated(explicit_sampling(args)), system=system or None,
                   constraint=constraint, format_prompt=params.format_prompt)


def add_parser(sub, *parents: argparse.ArgumentParser) -> None:
    run = sub.add_parser("run", parents=list(parents),
                         help="one-shot prompt, reply on stdout",
                         description="Print the model's reply to PROMPT (and/or stdin) on stdout.")
    run.add_argument("words", nargs="*", default=[], metavar="[MODEL] PROMPT",
                     help="the prompt; '-' or piped stdin supplies it (stdin first, then this). "
                          "A first word that names a model (a short name like smollm2:360m, a "
                          ".gguf path, a model directory, OWNER/REPO:QUANT) is the model, as "
                          "with `ollama run MODEL PROMPT`; a model and no prompt on a terminal "
                          "opens the chat with it"),
    run.add_argument("-p", "--prompt", dest="prompt_flag", default=None, metavar="TEXT",
                     help="the prompt, as a flag (llama.cpp's spelling of PROMPT)")
    run.add_argument("-f", "--file", dest="prompt_file", default=None, metavar="FILE",
                     help="read the prompt from FILE (after stdin, before PROMPT)")
    run.add_argument("--attach", action="append", default=[], metavar="FILE",
                     help="put a text file into the prompt, named and fenced (repeatable)")
    run.add_argument("--batch", default=None, metavar="FILE.jsonl",
                     help="one request per line ('prompt' or 'messages', optional sampling "
                          "fields, 'response_format' and 'id'; '-' reads stdin): one JSON "
                          "result per line on "
                          "stdout, in input order")
    add_constraint_flags(run)
    tools = run.add_argument_group("tools (MCP servers)")
    tools.add_argument("--mcp", nargs="?", const="", default=None, metavar="FILE",
                       help="let the model call the tools of the MCP servers in FILE (the "
                            "mcpServers shape Claude Desktop reads; without FILE: mcp.json in "
                            "the data dir)")
    tools.add_argument("--allow-tool", action="append", default=[], metavar="NAME",
                       help="a tool that may run (repeatable; also the config's \"allow\"); "
                            "a call to any other is refused and the refusal told to the model")
    tools.add_argument("--tool-choice", default="auto", metavar="auto|required|none|NAME",
                       help="how the reply may call: auto (default); required or a tool's "
                            "name: its first step is a call, forced by grammar; none")
    tools.add_argument("--max-tool-steps", type=int, default=8, metavar="N",
                       help="calls at most before the model must answer (default: 8)")
    run.add_argument("--verbose", action="store_true", help="stats block on stderr")
    run.add_argument("--json", action="store_true", help="print one JSON object with text and stats")
    run.add_argument("--continue", dest="continue_last", action="store_true",
                     help="add PROMPT to the last conversation and reply with its history, "
                          "system prompt and sampling (flags that differ from their defaults "
                          "override them); saved to the history as it streams")
    run.add_argument("--raw", action="store_true",
                     help="no chat template: the prompt is tokenized as plain text and the "
                          "model continues it (for base models; not saved to the history)")
    run.add_argument("--no-history", action="store_true",
                     help="do not save this exchange (by default each run is kept as a "
                          "conversation, so --continue and the chat UI's list find it)")
    run.set_defaults(handler=run_or_batch)


def run_or_batch(args: argparse.Namespace) -> int:
    """`localchat run`, `run --batch FILE` (batch.py), or `run MODEL` on a terminal with no
    prompt: the chat with that model."""
    if args.batch is not None and constraint_from_args(args) is not None:
        raise UsageError("-j/--json-schema, --grammar and --json-object apply to one prompt; "
                         "with --batch give each line a 'response_format'")
    if take_model_word(args) and prompt_argument(args) is None and args.prompt_file is None \
            and args.batch is None and sys.stdin.isatty():
        from localchat.cli.flags import with_parallel
        from localchat.tui.app import run_tui

        return run_tui(with_parallel(engine_config(args), 2), reply_params(args),
                       continue_last=args.continue_last, mcp=args.mcp or None)
    return batch.cmd_batch(args) if args.batch is not None else cmd_run(args)


def take_model_word(args: argparse.Namespace) -> bool:
    """Split the positional words into [MODEL] PROMPT (args.model, args.prompt); True when
    the first word was taken as the model."""
    from localchat.models.specs import DEFAULT_SPEC, names_a_model

    words = list(args.words)
    if len(words) > 2 or (len(words) == 2 and not names_a_model(words[0])):
        raise UsageError(f"give the prompt as one argument (quote it): {' '.join(words[:3])!r}"
                         " is more than [MODEL] PROMPT")
    model_word = bool(words) and (len(words) == 2 or (
        names_a_model(words[0]) and (args.model == DEFAULT_SPEC or words[0] == args.model)))
    if model_word:
        if args.model not in (DEFAULT_SPEC, words[0]):
            raise UsageError(f"two models: {words[0]} and -m {args.model}; give one")
        args.model = words.pop(0)
    args.prompt = words[0] if words else None
    return model_word


def cmd_run(args: argparse.Namespace) -> int:
    # one request: one KV slot; the engine the rule measures faster for a one-shot reply
    config = engine_config(args, parallel=args.parallel or 1, use="one-shot")
    # a bad schema file is said before the model loads
    params = replace(reply_params(args), constraint=constraint_from_args(args),
                     format_prompt=getattr(args, "format_prompt", True))
    typed = read_prompt(prompt_argument(args), file=args.prompt_file)
    prompt = with_attachments(typed, getattr(args, "attach", []))
    servers = _mcp_servers(args)  # a bad mcp.json is said before the model loads
    raw = getattr(args, "raw", False)
    if raw and (getattr(args, "continue_last", False) or args.system is not None):
        raise UsageError("--raw sends the prompt as plain text: it does not combine with "
                         "--continue or -sys/--system")
    store = _history_for(args, raw)
    try:
        engine = load_for_run(config, verbose=args.verbose)
    except BaseException:
        if store is not None:
            store.close()
        raise
    session = ChatSession(config, params, store, engine, on_store_error=_StoreWarning())
    try:
        if getattr(args, "continue_last", False):
            conv = store.last_conversation()
            if conv is not None and session.open(conv.id):
                session.params = continued_params(params, conv, args)
        if not raw and engine.info.base_model:
            print(f"localchat: {BASE_MODEL_NOTE} (--raw sends the prompt as plain text)",
                  file=sys.stderr)
        if servers is not None:
            from localchat.cli.run_tools import run_with_tools

            return run_with_tools(args, session, prompt, typed, servers)
        cancel = threading.Event()
        result = None
        with ctrl_c_cancels(cancel):
            for event in _events(session, engine, prompt, typed, raw, cancel):
                if isinstance(event, Delta):
                    if not args.json and event.text:
                        sys.stdout.write(event.text)
                        sys.stdout.flush()
                elif isinstance(event, Result):
                    result = event
        assert result is not None
        if args.json:
            out = {"text": result.text, "finish_reason": result.finish_reason,
                   **result.stats.to_dict(), "model": engine.info.name,
                   "model_path": engine.info.path, "engine": engine.name}
            print(json.dumps(out, ensure_ascii=False))
        elif not result.text.endswith("\n"):
            print()
        if args.verbose:
            print(f"\n{format_stats(result.stats)}\nfinish reason:        {result.finish_reason}"
                  f"\nchat template:        {'none (--raw)' if raw else engine.info.chat_template}",
                  file=sys.stderr)
        return 130 if result.finish_reason == "cancelled" else 0
    finally:
        engine.close()
        if store is not None:
            store.close()


def _events(session: ChatSession, engine, prompt: str, typed: str, raw: bool,
            cancel: threading.Event):
    """The reply's events: --raw sends the prompt's tokens as they are (nothing saved); a
    chat prompt goes through the session's reply pipeline (saved while it streams). A
    reply that fails leaves nothing in the history."""
    params = session.params
    if raw:
        tokens = engine.tokenize_text(prompt)
        if not tokens:
            raise UsageError("the prompt has no tokens")
        yield from engine.generate(Request(prompt_tokens=tokens, sampling=params.sampling,
                                           max_tokens=params.max_tokens,
                                           constraint=params.constraint), cancel)
        return
    reply = session.send(prompt, typed)
    try:
        yield from session.reply(reply, cancel, on_dropped=lambda fit: print(
            f"localchat: {fit.dropped_note(engine.info.n_ctx)}", file=sys.stderr))
    except LocalchatError as exc:
        session.fail(reply, str(exc))
        raise


def _history_for(args: argparse.Namespace, raw: bool):
    """The history store this run is saved to: the last conversation's (--continue: a
    damaged or locked store is an error), none (--no-history, --raw), else the default one
    (damaged or locked: said on stderr, the run goes on unsaved)."""
    if getattr(args, "continue_last", False):
        from localchat.storage import ConversationStore

        return ConversationStore.open()
    if getattr(args, "no_history", False) or raw:
        return None
    return _open_history_or_warn()


def _mcp_servers(args: argparse.Namespace):
    """The MCP servers `--mcp [FILE]` names (None without the flag); a bad file is one line."""
    if getattr(args, "mcp", None) is None:
        return None
    from localchat.tools.config import load_servers

    if getattr(args, "raw", False):
        raise UsageError("--mcp needs chat messages: it does not combine with --raw")
    if constraint_from_args(args) is not None:
        raise UsageError("--mcp and -j/--json-schema/--grammar/--json-object: give one")
    servers = load_servers(args.mcp or None)
    if not servers:
        raise UsageError("--mcp: no MCP servers are configured (give a file, or put "
                         "mcp.json in the data dir)")
    return servers


def _open_history_or_warn():
    """The history a plain run is saved to (so --continue continues it); a damaged or
    locked one is said on stderr and the run goes on unsaved."""
    from localchat.errors import LocalchatError
    from localchat.storage import ConversationStore

    try:
        return ConversationStore.open()
    except LocalchatError as exc:
        print(f"localchat: warning: this run is not saved to the history: {exc}",
              file=sys.stderr)
        return None


class _StoreWarning:
    """The session's store errors as one warning on stderr (the reply goes on unsaved)."""

    def __init__(self) -> None:
        self.said = False

    def __call__(self, error: str) -> None:
        if not self.said:
            print(f"localchat: warning: the reply is not saved to the history: {error}",
                  file=sys.stderr, flush=True)
        self.said = True
