"""GMAC/s of the one-row Q4_0/Q4_1/Q4_K/Q6_K kernels (q4s8, q4q8, q6q8) against their 8-row
interleaved forms (q4s8x8, q41x8, q4kx8, q6kx8) on random blocks: one thread, CPU time, best
of 5 with the two alternating. Run from the repository root (docs/benchmarks.md):
python scripts/q4x8_gmacs.py [q4_0,q4_1,q4_k,q6_k] [NxK,... [rows,...]]"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's localchat
from localchat.engine.executors.torch import q4q8  # noqa: E402
from localchat.engine.executors.torch.q4x8 import (Q4Kx8Linear, Q4S8x8Linear,  # noqa: E402
                                                  Q41x8Linear)
from localchat.engine.executors.torch.q6x8 import Q6Kx8Linear  # noqa: E402
from localchat.formats.gguf_blocks import pack_nibbles  # noqa: E402

SHAPES = ((8192, 2048), (2048, 8192))  # [N, K]: a 1B model's ffn up/gate and down
ROWS = (1, 4, 16, 512)


def cpu_seconds(layer: torch.nn.Module, x: torch.Tensor) -> float:
    """CPU seconds a call, over calls adding up to at least 50 ms."""
    reps, start = 0, time.process_time()
    while reps < 1 or time.process_time() - start < 0.05:
        layer(x)
        reps += 1
    return (time.process_time() - start) / reps


def layers(fmt: str, n: int, k: int, g: torch.Generator) -> tuple[torch.nn.Module, torch.nn.Module]:
    if fmt == "q6_k":
        codes = torch.randint(-32, 32, (n, k), generator=g).to(torch.int8)
        sc = torch.randint(-128, 128, (n, k // 16), generator=g).to(torch.int8)
        d = torch.rand(n, k // 256, generator=g) * 1e-3
        return q4q8.Q6Q8Linear(codes, sc, d), Q6Kx8Linear(codes, sc, d)
    q = pack_nibbles(torch.randint(0, 16, (n, k), generator=g))
    if fmt == "q4_0":
        d = (torch.rand(n, k // 32, generator=g) * 0.02).half()
        return q4q8.Q4S8Linear(q, d), Q4S8x8Linear(q, d)
    if fmt == "q4_1":
        d, m = (((torch.rand(n, k // 32, generator=g) - 0.5) * 0.02).half() for _ in "dm")
        return q4q8.Q4Q8Linear(q, d, m, act="q8_1"), Q41x8Linear(q, d, m)
    sc, m = (torch.randint(0, 64, (n, k // 32), generator=g).to(torch.uint8) for _ in "sm")
    sup = torch.rand(n, k // 256, 2, generator=g) * 0.01
    return q4q8.Q4Q8Linear(q, sc, m, sup, act="q8_k"), Q4Kx8Linear(q, sc, m, sup)


def main(fmts: list[str], shapes=SHAPES, rows_list=ROWS) -> None:
    torch.set_num_threads(1)
    if not q4q8.available():
        sys.exit("the q4q8 ops are not available here (no AVX2 CPU or no C++ compiler)")
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for fmt in fmts:
            for n, k in shapes:
                pair = layers(fmt, n, k, g)
                for rows in rows_list:
                    x = torch.randn(rows, k, generator=g)
                    for layer in pair:
                        layer(x)
                    best = [float("inf")] * 2
                    for _ in range(5):
                        for i, layer in enumerate(pair):
                            best[i] = min(best[i], cpu_seconds(layer, x))
                    old, new = (rows * n * k / t / 1e9 for t in best)
                    print(f"{fmt} {n}x{k} rows {rows:4d}: one-row {old:6.1f}, interleaved "
                          f"{new:6.1f} GMAC/s ({new / old:.2f}x)", flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[0].split(",") if args else ["q4_0", "q4_1", "q4_k", "q6_k"],
         [tuple(map(int, s.split("x"))) for s in args[1].split(",")] if len(args) > 1 else SHAPES,
         [int(r) for r in args[2].split(",")] if len(args) > 2 else ROWS)
