"""`localchat quantize` and `localchat eval` (besides --agreement: cli/eval_agreement.py).
User mistakes are one-line UsageErrors; the source and the disk's free space are checked
before anything is written."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from localchat.errors import UsageError
from quantize.gguf_quantize import GGUF_TYPES
from quantize.quality import Protocol
from quantize.safe_output import OutputError, check_free_space, check_output, stop_signals_clean_up

DIR_TYPES = ("nf4", "int8", "int4")
ALL_TYPES = GGUF_TYPES + DIR_TYPES


def _type_name(value: str) -> str:
    for name in ALL_TYPES:
        if value.lower() == name.lower():
            return name
    raise UsageError(f"unknown --type {value!r} (GGUF: {', '.join(GGUF_TYPES)}; "
                     f"safetensors: {', '.join(DIR_TYPES)})")


def _protocol(args) -> Protocol:
    window = args.window
    stride = args.stride or window // 2
    if args.tokens < 16 or window < 32:
        raise UsageError("--tokens must be at least 16 and --window at least 32")
    if not 0 < args.cost_ratio or args.gamma < 1:
        raise UsageError("--cost-ratio must be positive and --gamma at least 1")
    text = args.text or "pydoc_data.topics (Python's documentation)"
    return Protocol(args.tokens, window, stride, text, args.gamma, args.cost_ratio)


def _write_dir(src: Path, out: Path, type_name: str, group_size: int | None,
               double_quant: bool, gptq: bool = False, calibration: str | None = None) -> None:
    from quantize.export_hf import export_gguf_to_hf
    from quantize.int_hf import quantize_hf_dir_to_int
    from quantize.nf4_hf import quantize_hf_dir_to_nf4

    def write(hf: Path) -> None:
        if gptq:
            from quantize.gptq_model import quantize_hf_dir_to_gptq

            quantize_hf_dir_to_gptq(hf, out, group_size or 128, calibration)
        elif type_name == "nf4":
            quantize_hf_dir_to_nf4(hf, out, double_quant=double_quant)
        elif type_name == "int8":
            quantize_hf_dir_to_int(hf, out, 8, None)
        else:
            quantize_hf_dir_to_int(hf, out, 4, group_size or 128)

    if src.is_dir():
        write(src)
        return
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".localchat-quantize-") as tmp:
        write(export_gguf_to_hf(src, Path(tmp) / "float32"))  # dequantized float32 first


def _write(src: Path, out: Path, type_name: str, threads: int, args) -> None:
    """The conversion itself; OS errors (a full disk) become one line, nothing left behind."""
    from quantize.gguf_quantize import quantize_gguf

    try:
        if type_name in GGUF_TYPES:
            if src.is_dir():  # HF -> float32 GGUF beside OUT first (removed afterwards)
                from quantize.hf_to_gguf import write_float32_gguf

                with tempfile.TemporaryDirectory(dir=out.parent, prefix=".localchat-quantize-") as tmp:
                    f32 = write_float32_gguf(src, Path(tmp) / "float32.gguf")
                    quantize_gguf(f32, out, type_name, threads)
            else:
                quantize_gguf(src, out, type_name, threads)
        else:
            if args.method == "gptq":
                import torch

                torch.set_num_threads(threads)
            _write_dir(src, out, type_name, args.group_size, args.double_quant,
                       args.method == "gptq", args.calibration)
    except OSError as e:  # atomic_directory / temp files: already cleaned up
        raise OutputError(f"cannot write {out}: {e.strerror or e}; nothing was written") from None


def cmd_quantize(args) -> int:
    from localchat.models.specs import resolve_model_facts, validate_model_path

    type_name = _type_name(args.type)
    if args.method == "gptq" and type_name != "int4":
        raise UsageError("--method gptq writes int4 only (--type int4)")
    if args.calibration is not None and args.method != "gptq":
        raise UsageError("--calibration applies to --method gptq only")
    if args.group_size is not None and type_name != "int4":
        raise UsageError("--group-size applies to --type int4 only")
    if args.double_quant and type_name != "nf4":
        raise UsageError("--double-quant applies to --type nf4 only")
    src_facts = resolve_model_facts(args.src)  # the loaders' checks: pickles, truncation
    src, out = src_facts.path, Path(args.output).expanduser()
    check_output(src, out, replace=args.force and type_name in GGUF_TYPES)
    if src.is_dir():  # the torch loader's config checks (activation, RoPE scaling, ...)
        from localchat.engine.executors.torch.hf_weights import hf_llama_config
        from localchat.models.hf_files import read_json

        hf_llama_config(read_json(src / "config.json"), src.name)
    from quantize.output_size import min_bytes_written

    check_free_space(out, min_bytes_written(src, type_name))
    threads = args.threads or os.cpu_count() or 2
    with stop_signals_clean_up():
        _write(src, out, type_name, threads, args)
    facts = validate_model_path(out)
    print(f"wrote {out} ({facts.quant_type}, {facts.file_size / 2**20:.1f} MiB; "
          f"source {src_facts.quant_type}, {src_facts.file_size / 2**20:.1f} MiB)", file=sys.stderr)
    if args.report:
        from quantize.eval_file import evaluate_file, format_report

        protocol = _protocol(args)
        report = evaluate_file(facts, protocol, reference=src_facts, text_file=args.text)
        print(json.dumps(report, indent=2) if args.json else format_report(report, protocol))
    return 0


def cmd_eval(args) -> int:
    import torch

    from localchat.models.specs import resolve_model_facts

    if args.drafts is not None and not args.table:
        raise UsageError("--drafts adds rows to --table")
    if args.agreement and (args.table or args.reference):
        raise UsageError("--agreement compares engines; it does not combine with --table or --reference")
    if args.agreement:
        from localchat.cli.eval_agreement import cmd_eval as agreement

        return agreement(args)
    torch.set_num_threads(args.threads or os.cpu_count() or 2)
    protocol = _protocol(args)
    facts = resolve_model_facts(args.model)
    if args.table:
        from quantize.eval_table import format_table, run_table
        from quantize.schemes import TABLE_SCHEMES

        schemes = tuple(s.strip() for s in args.schemes.split(",")) if args.schemes else TABLE_SCHEMES
        if args.drafts is not None:
            drafts = [resolve_model_facts(d.strip()) for d in args.drafts.split(",") if d.strip()]
        else:
            from localchat.models.drafts import kept_draft

            kept = None if facts.path.is_dir() else kept_draft(facts)
            drafts = [] if kept is None else [resolve_model_facts(str(kept))]
        result = run_table(facts, protocol, schemes, text_file=args.text, drafts=drafts,
                           log=lambda line: print(line, file=sys.stderr, flush=True))
        print(json.dumps(result, indent=2) if args.json else format_table(result, protocol))
        return 0
    from quantize.eval_file import evaluate_file, format_report

    reference = resolve_model_facts(args.reference) if args.reference else None
    report = evaluate_file(facts, protocol, reference=reference, text_file=args.text)
    print(json.dumps(report, indent=2) if args.json else format_report(report, protocol))
    return 0
