"""Each weight matrix's kernel, chosen by measurement on this machine and remembered in
kernels.json: among kernels that match the dequantized reference, those batch-invariant
first, then the fastest; float32 is the fallback."""

from __future__ import annotations

import hashlib
import json
import platform
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import torch

from localchat.atomic import atomic_write_text, read_json_dict
from localchat.engine.executors.torch import q4q8
from localchat.engine.executors.torch.q4q8 import (Q2Q8Linear, Q3Q8Linear, Q4Q8Linear, Q4S8Linear,
                                                  Q5Q8Linear, Q6Q8Linear, Q8Q8Linear)
from localchat.engine.executors.torch.q4x8 import Q4Kx8Linear, Q4S8x8Linear, Q41x8Linear
from localchat.engine.executors.torch.q6x8 import Q6Kx8Linear
from localchat.engine.executors.torch.qlinear import (DenseLinear, HalfLinear, Int4Linear,
                                                     Int4PairLinear, Int8Linear)
from localchat.errors import EngineError
from localchat.formats.gguf_blocks import group_scales, pack_nibbles, unpack_nibbles

CACHE_FILE = "kernels.json"
MAX_CACHE_BYTES = 4 << 20  # a kernels.json larger than this is not ours: measured again
MEMORY_LIMIT = 1.5  # a kernel may hold at most this many times the file's bytes
OTHER_ROUNDING = 1.25  # a kernel rounding unlike llama.cpp must be this much faster to be chosen
TOLERANCE = 2e-2  # of the largest output: bfloat16 activations round about this much
REQUANTIZED_RMS = 3e-2  # a requantizing kernel's error, relative to the output's RMS
CHECKED_ROWS = 256  # output rows a remembered choice is checked on again, each process
TIMED_ROWS = (1, 16)  # a decode step; a batched step or a prompt block
FLOAT_SOURCES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


@dataclass
class SourceMatrix:
    """A weight as the file has it: its dequantized reference (or a function making it, called
    only if a kernel needs it) and any exact integer form."""

    reference: torch.Tensor | Callable[[], torch.Tensor]  # float32 [N, K]
    kind: str  # "Q4_1", "Q8_0", "F16", "int8", ...: the file's type, part of the cache key
    file_bytes: int
    bits: float  # bits per weight in the file (a kernel below them would lose precision)
    int4: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int] | None = None  # q, scale, zero, group
    int8: tuple[torch.Tensor, torch.Tensor] | None = None  # codes [N, K], per-row scales [N]
    # the file's blocks as formats/gguf_blocks.py unpacks them, for the q4q8 family of kernels
    q4_blocks: tuple | None = None  # Q4_0/Q4_1/Q4_K: packed q 0..15, scale, minimum [N, K/32], sup
    q5_blocks: tuple | None = None  # Q5_0/Q5_1/Q5_K: q 0..31, d, minimum (None: Q5_0's q − 16), sup
    q8_blocks: tuple[torch.Tensor, torch.Tensor] | None = None  # Q8_0, Q5_0: codes, f16 d [N, K/32]
    q6_blocks: tuple | None = None  # Q6_K: codes, sc [N, K/16], d [N, K/256]
    q3_blocks: tuple | None = None  # Q3_K: codes −4..3, sc [N, K/16], d [N, K/256]
    q2_blocks: tuple | None = None  # Q2_K: codes 0..3, scale bytes [N, K/16], d, dmin [N, K/256]
    activations: str | None = "q8_0"  # how llama.cpp rounds this matrix's activations
    shape: tuple[int, int] | None = None  # [N, K]; needed when `reference` is a function
    # the reference's rows alone (float32 [len(rows), K]), when making the whole costs more
    reference_rows: Callable[[list[int]], torch.Tensor] | None = None

    def __post_init__(self) -> None:
        if self.shape is None:
            self.shape = tuple(self.dense.shape)

    @property
    def has_exact_form(self) -> bool:
        """Whether some kernel takes the file's own values (else only float or requantized)."""
        return any(f is not None for f in (self.int4, self.int8, self.q4_blocks, self.q5_blocks,
                                           self.q8_blocks, self.q6_blocks, self.q3_blocks,
                                           self.q2_blocks))

    @property
    def dense(self) -> torch.Tensor:
        if callable(self.reference):
            self.reference = self.reference()
        return self.reference

    def rows(self, rows: list[int]) -> torch.Tensor:
        """The reference's rows, without making the whole where reference_rows can."""
        if callable(self.reference) and self.reference_rows is not None:
            return self.reference_rows(rows)
        return self.dense[rows]


@dataclass(frozen=True)
class Kernel:
    name: str
    bits_per_weight: float  # in memory at most, scales included
    usable: Callable[[SourceMatrix], bool]
    build: Callable[[SourceMatrix, torch.device], torch.nn.Module]
    exact: Callable[[SourceMatrix], bool] = lambda m: True  # False: it requantizes the file
    as_llama_cpp: bool = False  # rounds activations as llama.cpp does (the q4q8 family)


def _int8_parts(m: SourceMatrix) -> tuple[torch.Tensor, torch.Tensor]:
    """The file's own int8 codes, else a per-row absmax requantization of the reference."""
    if m.int8 is not None:
        return m.int8
    scales = (m.dense.abs().amax(dim=1) / 127).clamp_min(1e-12)
    return torch.round(m.dense / scales[:, None]).to(torch.int8), scales


def _int4(m: SourceMatrix) -> tuple | None:
    """The int4 form (q [N, K], scale, zero, group) with w = (q − 8)·scale + zero: given, or
    made from the file's 4-bit blocks (exact: groups of 32)."""
    if m.int4 is None and m.q4_blocks is not None:
        packed, *held = m.q4_blocks
        scale, minimum = (torch.as_tensor(t) for t in group_scales(*held))
        m.int4 = (unpack_nibbles(packed), scale, minimum + 8 * scale, 32)
    return m.int4


def _q4_blocks(m: SourceMatrix) -> tuple | None:
    """The file's 4-bit blocks, else an int4 form in groups of 32 as (packed q, scale,
    minimum, None)."""
    if m.q4_blocks is None and m.int4 is not None and m.int4[3] == 32:
        q, scale, zero, _ = m.int4
        m.q4_blocks = (pack_nibbles(q), scale, zero - 8 * scale, None)
    return m.q4_blocks


def _q4_0_blocks(m: SourceMatrix) -> tuple | None:
    """A Q4_0 file's (q, d float16) where every block's offset is −8·d, else None."""
    if m.kind != "Q4_0" or m.q4_blocks is None or m.q4_blocks[3] is not None:
        return None
    q, scale, minimum, _ = m.q4_blocks
    if scale.dtype != torch.float16 or not torch.equal(minimum.float(), -8 * scale.float()):
        return None
    return q, scale


def _q4_1_blocks(m: SourceMatrix) -> tuple | None:
    """A Q4_1 file's (q, d, m float16) where activations round to Q8_1, else None."""
    if m.activations != "q8_1" or m.q4_blocks is None or m.q4_blocks[3] is not None:
        return None
    q, scale, minimum, _ = m.q4_blocks
    if scale.dtype != torch.float16 or minimum.dtype != torch.float16:
        return None
    return q, scale, minimum


def _q4_k_blocks(m: SourceMatrix) -> tuple | None:
    """Q4_K's (q, 6-bit sc, 6-bit m, (d, dmin) per 256) where activations round to Q8_K."""
    if m.activations != "q8_k" or m.q4_blocks is None or m.q4_blocks[3] is None:
        return None
    return m.q4_blocks if m.q4_blocks[1].dtype == torch.uint8 else None


def _dense(dtype: torch.dtype) -> Callable[[SourceMatrix, torch.device], torch.nn.Module]:
    def build(m: SourceMatrix, device: torch.device) -> torch.nn.Module:
        w = m.dense.to(device)
        return DenseLinear(w) if dtype == torch.float32 else HalfLinear(w, dtype)
    return build


def _keeps_float_precision(dtype: torch.dtype) -> Callable[[SourceMatrix], bool]:
    """A float file runs at its own precision or float32; a quantized one in any float."""
    def usable(m: SourceMatrix) -> bool:
        source = FLOAT_SOURCES.get(m.kind)
        return source is None or dtype in (source, torch.float32)
    return usable


def _int8_usable(m: SourceMatrix) -> bool:
    return m.bits >= 5 and m.kind not in FLOAT_SOURCES


KERNELS = (
    Kernel("int4pack", 5.0, lambda m: m.int4 is not None or m.q4_blocks is not None,
           lambda m, dev: Int4Linear(*_int4(m)[:3], dev, group=_int4(m)[3])),
    Kernel("int4pack-x2", 10.0, lambda m: m.q8_blocks is not None,
           lambda m, dev: Int4PairLinear(*m.q8_blocks, dev)),
    Kernel("q4q8", 6.0, lambda m: _q4_blocks(m) is not None and m.activations is not None,
           lambda m, dev: Q4Q8Linear(*_q4_blocks(m), m.activations, dev), as_llama_cpp=True),
    Kernel("q4s8", 4.5, lambda m: m.activations == "q8_0" and _q4_0_blocks(m) is not None,
           lambda m, dev: Q4S8Linear(*_q4_0_blocks(m), dev), as_llama_cpp=True),
    # the same sums on 8 weight rows interleaved (q4x8.py): faster on AVX2, padded to 8 rows
    Kernel("q4s8x8", 4.5, lambda m: m.activations == "q8_0" and _q4_0_blocks(m) is not None,
           lambda m, dev: Q4S8x8Linear(*_q4_0_blocks(m), dev), as_llama_cpp=True),
    Kernel("q41x8", 5.0, lambda m: _q4_1_blocks(m) is not None,
           lambda m, dev: Q41x8Linear(*_q4_1_blocks(m), dev), as_llama_cpp=True),
    Kernel("q4kx8", 4.75, lambda m: _q4_k_blocks(m) is not None,
           lambda m, dev: Q4Kx8Linear(*_q4_k_blocks(m), dev), as_llama_cpp=True),
    Kernel("q5q8", 6.0, lambda m: m.q5_blocks is not None and m.activations is not None,
           lambda m, dev: Q5Q8Linear(*m.q5_blocks, m.activations, dev), as_llama_cpp=True),
    Kernel("q8q8", 8.5, lambda m: m.q8_blocks is not None,
           lambda m, dev: Q8Q8Linear(*m.q8_blocks, dev), as_llama_cpp=True),
    Kernel("q6q8", 6.625, lambda m: m.q6_blocks is not None,
           lambda m, dev: Q6Q8Linear(*m.q6_blocks, dev), as_llama_cpp=True),
    Kernel("q6kx8", 6.625, lambda m: m.q6_blocks is not None,
           lambda m, dev: Q6Kx8Linear(*m.q6_blocks, dev), as_llama_cpp=True),
    Kernel("q3q8", 3.625, lambda m: m.q3_blocks is not None,
           lambda m, dev: Q3Q8Linear(*m.q3_blocks, dev), as_llama_cpp=True),
    Kernel("q2q8", 2.75, lambda m: m.q2_blocks is not None,
           lambda m, dev: Q2Q8Linear(*m.q2_blocks, dev), as_llama_cpp=True),
    Kernel("int8pack-bf16", 8.0, _int8_usable,
           lambda m, dev: Int8Linear(*_int8_parts(m), torch.bfloat16, dev),
           exact=lambda m: m.int8 is not None),
    Kernel("int8pack-f32", 8.0, _int8_usable,
           lambda m, dev: Int8Linear(*_int8_parts(m), torch.float32, dev),
           exact=lambda m: m.int8 is not None),
    Kernel("f16", 16.0, _keeps_float_precision(torch.float16), _dense(torch.float16)),
    Kernel("bf16", 16.0, _keeps_float_precision(torch.bfloat16), _dense(torch.bfloat16)),
    Kernel("f32", 32.0, _keeps_float_precision(torch.float32), _dense(torch.float32)),
)
BY_NAME = {k.name: k for k in KERNELS}
# in the cache key: a choice made among other candidates, or with other q4q8 code, is measured again
KERNEL_SET = hashlib.blake2b((",".join(BY_NAME) + q4q8.SOURCE_DIGEST).encode(), digest_size=3).hexdigest()


def candidates(m: SourceMatrix) -> list[Kernel]:
    """Kernels that keep the file's precision within MEMORY_LIMIT x its bytes."""
    n_weights = m.shape[0] * m.shape[1]
    return [k for k in KERNELS if k.usable(m)
            and k.bits_per_weight * n_weights / 8 <= MEMORY_LIMIT * m.file_bytes]


def check(layer: torch.nn.Module, m: SourceMatrix, kernel: Kernel, device: torch.device,
          rows: list[int] | None = None) -> str | None:
    """Why `layer` may not stand for `m` (None: it may): an exact mapping must match the
    dequantized reference to activation rounding, a requantized one to REQUANTIZED_RMS; on
    output `rows` only where given (the whole layer runs either way)."""
    x = _probe(m)
    out = layer(x.to(device)).float().cpu()
    if rows is None:
        expected = x @ m.dense.t()
    else:
        expected, out = x @ m.rows(rows).t(), out[:, rows]
    err = out - expected
    if kernel.exact(m):
        worst = err.abs().max().item()
        if not worst <= TOLERANCE * max(1.0, expected.abs().max().item()):
            return f"max error {worst:.3g}"
    else:
        rms = (err.pow(2).mean() / expected.pow(2).mean().clamp_min(1e-30)).sqrt().item()
        if not rms <= REQUANTIZED_RMS:
            return f"relative RMS error {rms:.3g}"
    return None


def sampled_rows(n: int) -> list[int]:
    """Output rows enough to check a remembered choice again (CHECKED_ROWS of them, every
    position in an 8-row tile, the first and last tiles whole): the first check, when it was
    measured, ran every row."""
    if n <= CHECKED_ROWS:
        return list(range(n))
    step = -(-(n - 32) // (CHECKED_ROWS - 32)) | 1  # odd: rows fall on every place in a tile
    return sorted({*range(16), *range(16, n - 16, step), *range(n - 16, n)})


def row_invariant(layer: torch.nn.Module, m: SourceMatrix, device: torch.device) -> bool:
    """Whether a row gets the same bits alone as in a batch of 16 (exact batching)."""
    x = _probe(m).to(device)
    return torch.equal(layer(x[:1]).cpu(), layer(x)[:1].cpu())


def _probe(m: SourceMatrix) -> torch.Tensor:
    return torch.randn(16, m.shape[1], generator=torch.Generator().manual_seed(0))


def _time_us(layers: list[torch.nn.Module], n_in: int, rows: int,
             device: torch.device) -> list[float]:
    """Microseconds a call for each layer: the best of 5 runs of ≥ 4 ms each, the layers taking
    turns run by run (the minimum shrugs off moments when something else had the cores; taking
    turns spreads a longer slowdown over every layer instead of the one timed then)."""
    x = torch.randn(rows, n_in, device=device)
    best = [float("inf")] * len(layers)
    with torch.inference_mode():
        for layer in layers:
            for _ in range(2):
                layer(x)
        _sync(device)
        for _ in range(5):
            for i, layer in enumerate(layers):
                reps, start = 0, time.perf_counter()
                while reps < 2 or (time.perf_counter() - start < 0.004 and reps < 40):
                    layer(x)
                    reps += 1
                _sync(device)
                best[i] = min(best[i], (time.perf_counter() - start) / reps)
    return [t * 1e6 for t in best]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class KernelChooser:
    """Builds layers on the chosen kernel; measures a (shape, kind) once per machine
    (kernels.json) and checks a remembered choice once per process against the reference.
    `chosen` records what each layer label got."""

    def __init__(self, device: torch.device, cache_dir=None) -> None:
        self.device = device
        self.cache_path = None if cache_dir is None else cache_dir / CACHE_FILE
        self.chosen: dict[str, str] = {}  # "attn_qkv 960x576 Q4_1" -> "int4pack"
        self.measured: dict[str, dict] = {}  # cache key -> the record written to kernels.json
        self.checked: set[str] = set()  # cache keys whose kernel passed its check this process
        self._file: dict | None = None  # kernels.json as read once (a model has ~120 matrices)

    def build(self, m: SourceMatrix, label: str) -> torch.nn.Module:
        """A layer for `m` on the kernel chosen for its shape and kind."""
        key = self._key(m)
        name = self._remembered(key)
        if name is not None and (BY_NAME.get(name) in candidates(m) or name == "f32"):
            layer = self._try(BY_NAME[name], m, verify=key not in self.checked, sampled=True)
            if layer is not None:
                self.checked.add(key)
                self._note(label, m, name)
                return layer
        name, layer = self._measure(m, key)
        self.checked.add(key)
        self._note(label, m, name)
        return layer

    def _try(self, kernel: Kernel, m: SourceMatrix, verify: bool = True,
             sampled: bool = False) -> torch.nn.Module | None:
        """kernel's layer for m, or None where it cannot be built here or fails its check (on
        sampled_rows where `sampled`)."""
        try:
            layer = kernel.build(m, self.device)
            rows = sampled_rows(m.shape[0]) if sampled else None
            return layer if not verify or check(layer, m, kernel, self.device, rows) is None else None
        except (RuntimeError, NotImplementedError, EngineError):
            return None  # a kernel this PyTorch build or device lacks

    def _measure(self, m: SourceMatrix, key: str) -> tuple[str, torch.nn.Module]:
        """The fastest kernel that passes its check, preferring those that batch exactly,
        then those that keep the file's values (one rounding activations unlike llama.cpp
        counted OTHER_ROUNDING slower); float32 when none within the memory limit passes."""
        timings: dict[str, float | str] = {}
        passed: list[tuple[Kernel, torch.nn.Module]] = []
        for kernel in candidates(m):
            layer = self._try(kernel, m)
            if layer is None:
                timings[kernel.name] = "failed its check"
            else:
                passed.append((kernel, layer))
        one_row = _time_us([layer for _, layer in passed], m.shape[1], 1, self.device)
        fastest_row = min(one_row, default=0.0)
        timed = []
        for (kernel, layer), us in zip(passed, one_row):
            if us > 3 * fastest_row:  # not worth timing the larger shapes
                timings[kernel.name] = f"{us:.1f} at 1 row"
            else:
                timed.append((kernel, layer, us))
        for rows in TIMED_ROWS[1:]:
            more = _time_us([layer for _, layer, _ in timed], m.shape[1], rows, self.device)
            timed = [(kernel, layer, us + extra) for (kernel, layer, us), extra in zip(timed, more)]
        ranked: list[tuple[bool, bool, float, str, torch.nn.Module]] = []
        for kernel, layer, us in timed:
            exact = row_invariant(layer, m, self.device)
            timings[kernel.name] = round(us, 1) if exact else f"{us:.1f} (rows differ batched)"
            handicap = 1.0 if kernel.as_llama_cpp else OTHER_ROUNDING
            ranked.append((not exact, not kernel.exact(m), us * handicap, kernel.name, layer))
        if ranked:
            *_, name, layer = min(ranked, key=lambda r: r[:3])
        else:
            name, layer = "f32", self._try(BY_NAME["f32"], m)
            if layer is None:
                raise EngineError(f"no kernel here reproduces a {m.kind} matrix of shape "
                                  f"{list(m.shape)}; use the llama.cpp engine")
        self.measured[key] = {"kernel": name, "us_at_1_plus_16_rows": timings}
        self._save(key)
        return name, layer

    def _note(self, label: str, m: SourceMatrix, name: str) -> None:
        n, k = m.shape
        self.chosen[f"{label} {n}x{k} {m.kind}"] = name

    def _key(self, m: SourceMatrix) -> str:
        n, k = m.shape
        return (f"{device_name(self.device)} | torch {torch.__version__} | "
                f"{torch.get_num_threads()} threads | {m.kind} {n}x{k} | kernels {KERNEL_SET}")

    def _remembered(self, key: str) -> str | None:
        if key in self.measured:
            return self.measured[key]["kernel"]
        if self._file is None:
            self._file = self._read()
        record = self._file.get(key)
        return record.get("kernel") if isinstance(record, dict) else None

    def _read(self) -> dict:
        if self.cache_path is None:
            return {}
        return read_json_dict(self.cache_path, MAX_CACHE_BYTES)  # {}: measured again

    def _save(self, key: str) -> None:
        path = self.cache_path
        if path is None or path.is_symlink() or (path.exists() and not path.is_file()):
            return  # not ours to replace
        data = self._read()
        data[key] = self.measured[key]
        self._file = data
        try:
            atomic_write_text(path, json.dumps(data, indent=1, sort_keys=True))
        except OSError:
            pass  # a read-only data dir only costs the measurement next time


@lru_cache(maxsize=None)
def device_name(device: torch.device) -> str:
    """The processor or GPU a choice was measured on: model name, a hash of its flags, and
    the instruction set PyTorch's kernels use on it (ATEN_CPU_CAPABILITY can lower it)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type != "cpu":
        return device.type
    name, flags = platform.processor() or platform.machine(), ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name") and ":" in line:
                    name = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and ":" in line:
                    flags = line.split(":", 1)[1].strip()
                if name and flags:
                    break
    except OSError:
        pass
    digest = hashlib.blake2b(flags.encode(), digest_size=4).hexdigest() if flags else "?"
    return f"{name} (flags {digest}, {torch.backends.cpu.get_cpu_capability()})"


def kernel_isa(device: torch.device) -> str:
    """The instruction sets this machine's kernels run on, for --verbose and bench --json:
    PyTorch's CPU capability and the q4q8 ops' path, or the GPU's name."""
    if device.type != "cpu":
        return f"torch {device.type} ({device_name(device)})"
    q4q8_isa = q4q8.isa()
    return (f"torch CPU capability {torch.backends.cpu.get_cpu_capability()}, q4q8 kernels "
            f"{q4q8_isa or 'not available (no AVX2 or no C++ compiler)'}")
