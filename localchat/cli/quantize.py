"""`localchat quantize`: its flags and the command (the conversions are the top-level
quantize/ package, imported only when it runs). User mistakes are one-line UsageErrors; the
source and the disk's free space are checked before anything is written."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from localchat.cli.flags import quality_flags, quality_protocol
from localchat.errors import UsageError
from localchat.engine.choice import default_threads


def add_parser(sub) -> None:
    quant = sub.add_parser("quantize", help="convert a model to another type",
                           description="SRC (a GGUF of any type, or a Hugging Face directory) "
                                       "-> OUT: a GGUF (F32 ... Q4_K_M) or a safetensors "
                                       "directory (nf4, int8, int4). Written atomically.")
    quant.add_argument("src", metavar="SRC", help="model SPEC: 'default', a .gguf, an HF directory")
    quant.add_argument("-o", "--output", required=True, metavar="OUT")
    quant.add_argument("--type", required=True, metavar="TYPE",
                       help="F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 (gguf-py), Q2_K Q3_K_S/M/L "
                            "Q4_K_S/M Q5_K_S/M Q6_K (llama.cpp), nf4 int8 int4 (safetensors)")
    quant.add_argument("--method", default="rtn", choices=["rtn", "gptq"])
    quant.add_argument("--group-size", type=int, default=None, metavar="N",
                       help="int4: weights per scale, 32/64/128/256 (default 128)")
    quant.add_argument("--double-quant", action="store_true", help="nf4: quantize the absmax too")
    quant.add_argument("--calibration", default=None, metavar="FILE", help="gptq: calibration text")
    quant.add_argument("--force", action="store_true", help="replace an existing OUT file")
    quant.add_argument("--report", action="store_true",
                       help="then measure OUT against SRC (as `localchat eval --reference`)")
    quality_flags(quant)
    quant.add_argument("--threads", type=int, default=None, metavar="N")
    quant.add_argument("--json", action="store_true", help="--report as JSON")
    quant.set_defaults(handler=run_quantize)


DIR_TYPES = ("nf4", "int8", "int4")


def _type_name(value: str) -> str:
    from quantize.gguf_quantize import GGUF_TYPES

    for name in GGUF_TYPES + DIR_TYPES:
        if value.lower() == name.lower():
            return name
    raise UsageError(f"unknown --type {value!r} (GGUF: {', '.join(GGUF_TYPES)}; "
                     f"safetensors: {', '.join(DIR_TYPES)})")


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
    from quantize.gguf_quantize import GGUF_TYPES, quantize_gguf
    from quantize.safe_output import OutputError

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


FLOAT_TYPES = ("F32", "F16", "BF16", "float32", "float16", "bfloat16")


def run_quantize(args) -> int:
    from localchat.models.specs import resolve_model_facts, validate_model_path
    from quantize.gguf_quantize import GGUF_TYPES
    from quantize.safe_output import check_free_space, check_output, stop_signals_clean_up

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
    threads = args.threads or default_threads()
    with stop_signals_clean_up():
        _write(src, out, type_name, threads, args)
    facts = validate_model_path(out)
    print(f"wrote {out} ({facts.quant_type}, {facts.file_size / 2**20:.1f} MiB; "
          f"source {src_facts.quant_type}, {src_facts.file_size / 2**20:.1f} MiB)", file=sys.stderr)
    if facts.file_size > src_facts.file_size and src_facts.quant_type not in FLOAT_TYPES:
        print(f"note: the source is already {src_facts.quant_type}: {facts.quant_type} from it "
              "is larger but not better (rounding lost in the source does not come back); "
              "quantize from the float (F16/BF16/F32) weights instead", file=sys.stderr)
    if args.report:
        from quantize.eval_file import evaluate_file, format_report

        protocol = quality_protocol(args)
        report = evaluate_file(facts, protocol, reference=src_facts, text_file=args.text)
        print(json.dumps(report, indent=2) if args.json else format_report(report, protocol))
    return 0
