"""`localchat quantize`'s flags; it runs in the top-level quantize/ package
(quantize/commands.py)."""

from __future__ import annotations

from localchat.cli.flags import quality_flags


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


def run_quantize(args) -> int:
    from quantize.commands import cmd_quantize  # torch and the quantize package load only here

    return cmd_quantize(args)
