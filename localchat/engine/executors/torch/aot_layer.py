"""A generated token's whole layer (layer_steps.decode_layer) compiled ahead of time by
AOTInductor into one C++ call: no Dynamo guards and no Python between its kernels. One
artifact per layer signature serves every layer, any row count, context length and KV store;
it is built once per machine and kept in the cache dir's aot/."""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
from pathlib import Path
from typing import Callable

import torch

from localchat.engine.executors.torch import layer_steps, q4q8
from localchat.engine.executors.torch.kernels import device_name
from localchat.paths import cache_dir

LINEARS = ("wqkv", "wo", "w_gate_up", "w_down")
# an artifact holds the layer's code and calls the q4q8 ops: a change to either builds anew
# (layer_steps' file as installed, source or bytecode)
CODE_DIGEST = hashlib.blake2b(Path(layer_steps.__file__).read_bytes()
                              + q4q8.SOURCE_DIGEST.encode(), digest_size=8).hexdigest()
MAX_ROWS = 4096


def tensor_attrs(module: torch.nn.Module, prefix: str = "") -> list[tuple[str, torch.Tensor]]:
    """Every tensor a linear layer holds as a plain attribute, sub-layers included, in a fixed
    order: the artifact's inputs, so a layer must read its weights from exactly these."""
    found = [(prefix + k, v) for k, v in sorted(vars(module).items()) if isinstance(v, torch.Tensor)]
    for name, child in sorted(module.named_children()):
        found += tensor_attrs(child, f"{prefix}{name}.")
    return found


@contextlib.contextmanager
def holding(module: torch.nn.Module, tensors: list[torch.Tensor]):
    """The module with its tensors swapped for `tensors` (graph inputs while exporting)."""
    names = [name for name, _ in tensor_attrs(module)]
    saved = []
    for name, tensor in zip(names, tensors):
        *path, attr = name.split(".")
        owner = module
        for part in path:
            owner = getattr(owner, part)
        saved.append((owner, attr, getattr(owner, attr)))
        setattr(owner, attr, tensor)
    try:
        yield module
    finally:
        for owner, attr, value in saved:
            setattr(owner, attr, value)


def layer_tensors(layer) -> list[torch.Tensor]:
    """A layer's weights as the artifact takes them."""
    out = [layer.attn_norm, layer.ffn_norm] + ([layer.bqkv] if layer.bqkv is not None else [])
    for name in LINEARS:
        out += [t for _, t in tensor_attrs(getattr(layer, name))]
    return out


def signature(layer) -> str:
    """What an artifact depends on in a layer: each linear's structure (its modules' kinds
    and settings, such as an activation rounding) and tensor shapes."""
    parts = [f"bias={layer.bqkv is not None}"]
    for name in LINEARS:
        module = getattr(layer, name)
        settings = [(n, type(m).__name__, sorted((k, v) for k, v in vars(m).items()
                                                 if isinstance(v, (bool, int, float, str))))
                    for n, m in module.named_modules()]
        parts.append(repr(settings) + repr([(n, tuple(t.shape), str(t.dtype))
                                            for n, t in tensor_attrs(module)]))
    return ";".join(parts)


class _DecodeLayer(torch.nn.Module):
    """decode_layer with the layer's weights as inputs (layer 0's modules give the structure)."""

    def __init__(self, template, rope, config, kv_dtype: torch.dtype) -> None:
        super().__init__()
        self.template, self.rope, self.config, self.kv_dtype = template, rope, config, kv_dtype
        self.counts = [len(tensor_attrs(getattr(template, n))) for n in LINEARS]

    def forward(self, x, new_slots, k_cache, v_cache, padded, valid, cos, sin, weights):
        t = self.template
        attn_norm, ffn_norm, *rest = weights
        bqkv = rest.pop(0) if t.bqkv is not None else None
        modules, at = [], 0
        for name, count in zip(LINEARS, self.counts):
            modules.append((getattr(t, name), rest[at:at + count]))
            at += count
        with contextlib.ExitStack() as stack:
            wqkv, wo, w_gate_up, w_down = (stack.enter_context(holding(m, ts)) for m, ts in modules)
            return layer_steps.decode_layer(x, new_slots, k_cache, v_cache, padded, valid,
                                            attn_norm, wqkv, bqkv, wo, ffn_norm, w_gate_up,
                                            w_down, self.rope, cos, sin, self.config, self.kv_dtype)


def load_decode_layer(layer, rope, config, kv) -> Callable:
    """The artifact for layers like `layer` (built and cached the first time), called as
    f(x, new_slots, k_cache, v_cache, padded, valid, cos, sin, weights) -> x."""
    module = _DecodeLayer(layer, rope, config, kv.k.dtype)
    rows = 2
    cos, sin = rope.tables(torch.zeros(rows, dtype=torch.long))
    example = (torch.zeros(rows, config.dim), torch.full((rows,), kv.scratch),
               kv.k[0], kv.v[0], torch.zeros(rows, 128, dtype=torch.long),
               torch.ones(rows, 128, dtype=torch.bool), cos, sin, layer_tensors(layer))
    key = hashlib.blake2b("|".join([
        torch.__version__, platform.machine(), device_name(torch.device("cpu")), CODE_DIGEST,
        signature(layer), repr(config),
        repr(rope.__dict__.get("neox")), str(kv.k.dtype), str(tuple(kv.k.shape[2:])),
        repr(tuple(t.shape for t in (cos, sin)))]).encode(), digest_size=12).hexdigest()
    path = cache_dir() / "aot" / f"decode-layer-{key}.pt2"
    if path.exists():
        try:
            return _load(path)
        except Exception:  # noqa: BLE001 -- damaged or foreign: build it again
            path.unlink(missing_ok=True)
    _build(module, example, path)
    return _load(path)


def _load(path) -> Callable:
    """The artifact's C++ runner, called with its inputs already flat. The key names this
    machine and torch build, so aoti_load_package's device check (which imports Inductor
    and test-compiles for each vector ISA: ~3 s) and its per-call pytree wrapper (~30 µs
    a call, 30 calls a step) are left out."""
    try:
        loader = torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, -1)
    except (AttributeError, TypeError):  # another torch's binding: its public loader
        loader = torch._inductor.aoti_load_package(str(path)).loader

    def run(x, new_slots, k_cache, v_cache, padded, valid, cos, sin, weights):
        return loader.boxed_run([x, new_slots, k_cache, v_cache, padded, valid, cos, sin,
                                 *weights])[0]
    return run


def _build(module: torch.nn.Module, example: tuple, path) -> None:
    from torch.export import Dim

    rows, context = Dim("rows", min=1, max=MAX_ROWS), Dim("context", min=1, max=1 << 20)
    slots = {0: Dim("slots", min=2, max=1 << 30)}
    by_row = {0: rows}
    shapes = (by_row, by_row, slots, slots, {0: rows, 1: context}, {0: rows, 1: context},
              by_row, by_row, [None] * len(example[-1]))
    with torch.inference_mode():
        program = torch.export.export(module, example, dynamic_shapes=shapes)
    baked = [*program.constants, *program.state_dict]
    if baked:  # a tensor read but not among tensor_attrs: every layer would run layer 0's
        raise RuntimeError(f"the decode layer reads {len(baked)} tensors that are not its "
                           "inputs; they would be compiled in")
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir() / "inductor"))
    path.parent.mkdir(parents=True, exist_ok=True)
    building = path.with_name(f".{path.stem}.{os.getpid()}.pt2")  # renamed whole: never half
    try:
        torch._inductor.aoti_compile_and_package(program, package_path=str(building))
        os.replace(building, path)
    finally:
        building.unlink(missing_ok=True)

