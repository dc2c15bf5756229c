"""GGUF blocks (Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q8_0, Q6_K, Q3_K, Q2_K) times
int8-rounded activations, as llama.cpp computes them on x86: activations rounded per block as
its Q8_0/Q8_1/Q8_K do, integer dot products per 32 weights (AVX2; AVX-512 VNNI where present).
C++ ops (q4q8.cpp) built once per machine into the cache dir; kernels.py offers them beside
PyTorch's kernels."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from functools import lru_cache
from pathlib import Path

import torch

from localchat.cpu_features import cpu_flags, has_avx2
from localchat.errors import EngineError
from localchat.formats.gguf_blocks import pack_nibbles
from localchat.paths import cache_dir

GROUP = 32  # weights per scale: GGUF's blocks


def _text(name: str) -> str:
    return (Path(__file__).parent / name).read_text(encoding="utf-8")


def _x8_target(namespace: str, wide: int, target: str | None) -> str:
    """The 8-row interleaved tiles (x8_vec.cpp's vector layer) compiled for one target in
    their own namespace: AVX2 (the build's flags), or AVX-512 VNNI under a target pragma."""
    body = "\n".join(_text(name) for name in ("x8_vec.cpp", "q4x8_tiles.cpp", "q6x8_tiles.cpp"))
    code = f"#define X8_WIDE {wide}\nnamespace {{\nnamespace {namespace} {{\n{body}\n}}\n}}\n#undef X8_WIDE\n"
    if target is None:
        return code
    return f'#pragma GCC push_options\n#pragma GCC target("{target}")\n{code}#pragma GCC pop_options\n'


# One translation unit: q4q8.cpp, the tiles once per target, then the 8-row ops (q4x8.cpp,
# q6x8.cpp), which call the AVX-512 tiles where q4q8.cpp's has_vnni() holds
_SOURCE = "\n".join((_text("q4q8.cpp"), _x8_target("x8_avx2", 0, None),
                      _x8_target("x8_avx512", 1, "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni"),
                      _text("q4x8.cpp"), _text("q6x8.cpp")))
SOURCE_DIGEST = hashlib.blake2b(f"{torch.__version__}{_SOURCE}".encode(), digest_size=8).hexdigest()


@lru_cache(maxsize=None)
def available() -> bool:
    """Whether the ops are loaded in this process: an x86-64 CPU with AVX2, FMA and F16C, and
    a C++ compiler for the first build (~20 s, then loaded from the cache dir)."""
    if not has_avx2():
        return False
    if not any(shutil.which(cc) for cc in ("g++", "c++")):
        return False
    build = cache_dir() / "kernels" / f"q4q8-{SOURCE_DIGEST}"
    built = build / "localchat_q4q8.so"
    try:
        try:
            torch.ops.load_library(str(built))  # no ninja run: the name is the source's hash
        except OSError:  # not built yet, or damaged: build it beside, then put it in place
            _build(build)
    except Exception as exc:  # noqa: BLE001 -- no toolchain or headers: PyTorch's kernels only
        logging.getLogger("localchat.engine").info("q4q8 kernel not built (%s)", exc)
        return False
    for op in ("q4q8_mm", "q4s8_mm", "q5q8_mm", "q8q8_mm", "q6q8_mm", "q3q8_mm", "q2q8_mm"):
        torch.library.register_fake(f"localchat::{op}")(
            lambda x, w, *rest: x.new_empty(x.shape[0], w.shape[0], dtype=torch.float32))
    for op in ("q4s8x8_mm", "q41x8_mm", "q4kx8_mm", "q6kx8_mm"):  # last argument: the rows
        torch.library.register_fake(f"localchat::{op}")(
            lambda x, *rest: x.new_empty(x.shape[0], rest[-1], dtype=torch.float32))
    return True


VNNI_FLAGS = {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"}  # q4q8.cpp's has_vnni()
ISA_ENV = "LOCALCHAT_Q4Q8_ISA"  # "avx2": the path every x86 CPU takes, even where VNNI is


def isa() -> str | None:
    """The instruction set the ops run on here, as q4q8.cpp's has_vnni() decides:
    'avx512-vnni', 'avx2', or None where they are not available."""
    if not available():
        return None
    vnni = VNNI_FLAGS <= cpu_flags() and os.environ.get(ISA_ENV) != "avx2"
    return "avx512-vnni" if vnni else "avx2"


def _build(build) -> None:
    """Compile and load the op in a private folder renamed to `build` when complete, so an
    interrupted or concurrent build never leaves a half-written library there."""
    from torch.utils.cpp_extension import load_inline

    shutil.rmtree(build, ignore_errors=True)
    private = build.with_name(f"{build.name}.{os.getpid()}")
    shutil.rmtree(private, ignore_errors=True)
    private.mkdir(parents=True)
    load_inline("localchat_q4q8", cpp_sources=_SOURCE, is_python_module=False,
                extra_cflags=["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp"],
                extra_ldflags=["-fopenmp"], build_directory=str(private))
    try:
        private.rename(build)
    except OSError:  # another process put its build there first
        shutil.rmtree(private, ignore_errors=True)


ACTIVATIONS = {"q8_0": 0, "q8_1": 1, "q8_k": 2}  # llama.cpp's vec_dot_type of a weight type


class BlockLinear(torch.nn.Module):
    """A linear layer over one of the ops: weights held as the file's codes and scales,
    packed for the CPU at load (they cannot move to another device)."""

    def __init__(self, n_out: int, n_in: int, device: torch.device, block: int = GROUP) -> None:
        super().__init__()
        if device.type != "cpu" or n_in % block or not available():
            raise EngineError(f"the {type(self).__name__} kernel needs an AVX2 CPU and rows of "
                              f"{block}-value blocks")
        self.out_features, self.in_features = n_out, n_in

    def shaped(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The op's float32 rows [M, N] as x's leading shape and dtype."""
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)


def _bit_plane(bits: torch.Tensor) -> torch.Tensor:
    """Bits 0/1 [N, K] as int32 [N, K/32]: bit i of each word is weight i of its 32."""
    words = (bits.to(torch.int64).view(bits.shape[0], -1, GROUP) << torch.arange(GROUP)).sum(-1)
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32).contiguous()


def _held_scales(t: torch.Tensor | None) -> torch.Tensor:
    """Per-32 scales or offsets as the ops take them: K-quant integers (uint8) as they are,
    others as float32 (float16 would cost a conversion a group); none as an empty tensor."""
    if t is None:
        return torch.empty(0)
    return (t if t.dtype == torch.uint8 else t.float()).contiguous()


def _super_scales(sup: torch.Tensor | None) -> torch.Tensor:
    return torch.empty(0) if sup is None else sup.float().contiguous()


def _two_bit_codes(q: torch.Tensor) -> torch.Tensor:
    """Codes 0..3 [N, K] four to a byte: byte i of each 32 holds weights i, i + 8, i + 16 and
    i + 24 from its lowest bits up."""
    quarters = q.to(torch.int32).view(q.shape[0], -1, 4, 8)  # [N, K/32, quarter, i]
    return (quarters << torch.tensor([0, 2, 4, 6]).view(1, 1, 4, 1)).sum(2).to(
        torch.uint8).reshape(q.shape[0], -1).contiguous()


class Q4Q8Linear(BlockLinear):
    """y = x @ Wᵀ for w = q·scale + minimum, q in 0..15, per 32 weights (Q4_0, Q4_1, Q4_K:
    exact), x rounded as llama.cpp rounds it for the file's type (`act`: q8_0, q8_1, q8_k).
    q packed as gguf_blocks.pack_nibbles does; scales as float32, or Q4_K's 6-bit integers
    with (d, dmin) per 256 in `sup` (formats/gguf_blocks.py)."""

    def __init__(self, packed: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor,
                 sup: torch.Tensor | None = None, act: str = "q8_0",
                 device: torch.device = torch.device("cpu")) -> None:
        super().__init__(packed.shape[0], 2 * packed.shape[1], device,
                         256 if act == "q8_k" else GROUP)
        self.packed = packed.contiguous()
        self.scale, self.minimum = _held_scales(scale), _held_scales(minimum)
        self.sup = _super_scales(sup)
        self.act = ACTIVATIONS[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shaped(torch.ops.localchat.q4q8_mm(
            x.reshape(-1, self.in_features), self.packed, self.scale, self.minimum, self.sup,
            self.act), x)


class Q4S8Linear(BlockLinear):
    """Q4_0 in its own 4.5 bits: w = (q − 8)·d, q in 0..15 packed as gguf_blocks.pack_nibbles
    does, d the file's float16 per 32 weights; x rounded to Q8_0, summed as llama.cpp's Q4_0
    dot product (exact)."""

    def __init__(self, packed: torch.Tensor, d: torch.Tensor,
                 device: torch.device = torch.device("cpu")) -> None:
        super().__init__(packed.shape[0], 2 * packed.shape[1], device)
        self.packed = packed.contiguous()
        self.scale = d.to(torch.float16).contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shaped(torch.ops.localchat.q4s8_mm(
            x.reshape(-1, self.in_features), self.packed, self.scale), x)


class Q5Q8Linear(BlockLinear):
    """5-bit codes q in 0..31 per 32 weights (exact), held as 4-bit codes plus a bit plane:
    Q5_0's w = (q − 16)·d with x rounded to Q8_0 when `minimum` is None, else w = q·d +
    minimum (Q5_1, Q5_K) with x rounded as `act`. Scales as in Q4Q8Linear."""

    def __init__(self, q: torch.Tensor, d: torch.Tensor, minimum: torch.Tensor | None = None,
                 sup: torch.Tensor | None = None, act: str = "q8_0",
                 device: torch.device = torch.device("cpu")) -> None:
        super().__init__(*q.shape, device, 256 if act == "q8_k" else GROUP)
        self.packed = pack_nibbles(q)
        self.high = _bit_plane((q >> 4) & 1)  # each weight's fifth bit
        self.scale, self.minimum = _held_scales(d), _held_scales(minimum)
        self.sup = _super_scales(sup)
        self.act = ACTIVATIONS["q8_0" if minimum is None else act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shaped(torch.ops.localchat.q5q8_mm(
            x.reshape(-1, self.in_features), self.packed, self.high, self.scale, self.minimum,
            self.sup, self.act), x)


class Q8Q8Linear(BlockLinear):
    """y = x @ Wᵀ for int8 codes with one scale per 32 (Q8_0, Q5_0 as codes: exact), x
    rounded to Q8_0."""

    def __init__(self, codes: torch.Tensor, d: torch.Tensor,
                 device: torch.device = torch.device("cpu")) -> None:
        super().__init__(*codes.shape, device)
        self.codes = codes.to(torch.int8).contiguous().view(torch.uint8)
        self.scale = _held_scales(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shaped(torch.ops.localchat.q8q8_mm(
            x.reshape(-1, self.in_features), self.codes, self.scale), x)


class SubScaledLinear(BlockLinear):
    """A K-quant with an int8 scale sc per 16 weights and d per 256 (exact), multiplied by
    the op named `OP`; x rounded to Q8_K. Codes are held as the file holds them: code +
    OFFSET split into its LOW_BITS (packed by `pack_low`) and the bits above (`pack_high`)."""

    OP, OFFSET, LOW_BITS = "", 0, 0

    def __init__(self, codes: torch.Tensor, sc: torch.Tensor, d: torch.Tensor,
                 device: torch.device = torch.device("cpu")) -> None:
        super().__init__(*codes.shape, device, 256)
        u = codes.to(torch.int32) + self.OFFSET
        self.packed = self.pack_low(u & ((1 << self.LOW_BITS) - 1))
        self.high = self.pack_high(u >> self.LOW_BITS)
        self.sub_scale = sc.to(torch.int8).contiguous()
        self.scale = d.float().contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shaped(getattr(torch.ops.localchat, self.OP)(
            x.reshape(-1, self.in_features), self.packed, self.high, self.sub_scale, self.scale), x)


class Q6Q8Linear(SubScaledLinear):
    """Q6_K: w = d·sc·(q − 32), held as Q6_K does in 6.6 bits: q's low 4 bits as q4q8's
    nibbles (gguf_blocks.pack_nibbles), its top 2 bits as 2-bit codes."""

    OP, OFFSET, LOW_BITS = "q6q8_mm", 32, 4
    pack_low, pack_high = staticmethod(pack_nibbles), staticmethod(_two_bit_codes)


class Q3Q8Linear(SubScaledLinear):
    """Q3_K: w = d·sc·c with codes c in −4..3, held as Q3_K does in 3.6 bits: 2-bit codes
    (c + 4) & 3, four to a byte (byte i of a 32 holds weights i, i + 8, i + 16, i + 24), and
    a plane of the bits (c + 4) >> 2."""

    OP, OFFSET, LOW_BITS = "q3q8_mm", 4, 2
    pack_low, pack_high = staticmethod(_two_bit_codes), staticmethod(_bit_plane)


class Q2Q8Linear(BlockLinear):
    """Q2_K: w = d·sc·q − dmin·m with q in 0..3 and, per 16 weights, a byte of sc (low nibble)
    and m (high), d and dmin per 256 (exact), 2.75 bits a weight; x rounded to Q8_K."""

    def __init__(self, q: torch.Tensor, scale_bytes: torch.Tensor, d: torch.Tensor,
                 dmin: torch.Tensor, device: torch.device = torch.device("cpu")) -> None:
        super().__init__(*q.shape, device, 256)
        self.packed = _two_bit_codes(q)
        self.sub_scale = scale_bytes.to(torch.uint8).contiguous().view(torch.int8)
        self.scale, self.minimum = d.float().contiguous(), dmin.float().contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shaped(torch.ops.localchat.q2q8_mm(
            x.reshape(-1, self.in_features), self.packed, self.sub_scale, self.scale,
            self.minimum), x)
