"""Whole forward passes of one GGUF file on two kernel sets, one thread, CPU time: a
128-token prefill (last position's logits) and one token, best of N rounds alternating.
Run from the repository root:
python scripts/kernel_forward.py MODEL.gguf q4kx8,q6q8 q4kx8,q6kx8 [ROUNDS] (docs/benchmarks.md)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's localchat
from localchat.engine.executors.torch import kernels  # noqa: E402
from localchat.engine.executors.torch.executor import KV_DTYPE  # noqa: E402
from localchat.engine.executors.torch.model import KVStore, LlamaModel  # noqa: E402
from localchat.engine.executors.torch.weights import load_weights  # noqa: E402

LENGTHS = (128, 1)  # a prompt block; a decode-sized step


def load(path: str, names: list[str]) -> LlamaModel:
    """The model with every matrix on one of `names` (or float32), as the chooser picks."""
    kernels.KERNELS = tuple(kernels.BY_NAME[n] for n in names + ["f32"])
    chooser = kernels.KernelChooser(torch.device("cpu"))
    model = LlamaModel(load_weights(Path(path), chooser=chooser), max_positions=256)
    print(",".join(names), "->", sorted(set(chooser.chosen.values())), flush=True)
    return model


def cpu_seconds(model: LlamaModel, n: int) -> float:
    kv = KVStore(model.config, 256, dtype=KV_DTYPE, device=model.device)
    tokens, positions = torch.arange(100, 100 + n), torch.arange(n)
    start = time.process_time()
    with torch.inference_mode():
        model.forward(tokens, positions, positions, positions, kv)
    return time.process_time() - start


def main(path: str, sets: list[str], rounds: int) -> None:
    torch.set_num_threads(1)
    models = {s: load(path, s.split(",")) for s in sets}
    best = {(s, n): float("inf") for s in sets for n in LENGTHS}
    for _ in range(rounds):
        for n in LENGTHS:
            for s, model in models.items():
                best[s, n] = min([best[s, n]] + [cpu_seconds(model, n) for _ in range(1 if n > 1 else 5)])
    for n in LENGTHS:
        rates = [n / best[s, n] for s in sets]
        print(f"{n} tokens: " + ", ".join(f"{s} {r:.2f} tok/s" for s, r in zip(sets, rates))
              + f" ({rates[-1] / rates[0]:.2f}x)")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:4], int(sys.argv[4]) if len(sys.argv) > 4 else 3)
