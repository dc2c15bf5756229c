"""The torch executor's kernels: exact mappings of GGUF blocks, the choice by measurement
(checked, limited to 1.5x the file's bytes, remembered per machine) and its fallbacks."""

from __future__ import annotations

import itertools
import json
import os
import stat

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

from localchat.engine.executors.torch import kernels, q4q8, q4x8, qlinear
from localchat.formats import gguf_blocks
from localchat.models.gguf_reader import read_gguf
from localchat.engine.executors.torch.kernels import KernelChooser, SourceMatrix, candidates

ROWS, COLS = 96, 256
BLOCK_BYTES = {Q.Q4_0: 18, Q.Q4_1: 20, Q.Q4_K: 144, Q.Q5_0: 22, Q.Q5_1: 24, Q.Q5_K: 176,
               Q.Q8_0: 34, Q.Q6_K: 210, Q.Q3_K: 110, Q.Q2_K: 84}
K_QUANTS = (Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K)
WEIGHTS_PER_BLOCK = {t: 256 if t in K_QUANTS else 32 for t in BLOCK_BYTES}
# where each block's f16 d (and m, or dmin) are
SCALES_AT = {Q.Q4_0: (0,), Q.Q5_0: (0,), Q.Q8_0: (0,), Q.Q6_K: (208,), Q.Q3_K: (108,),
             Q.Q2_K: (80, 82)}


def _random_blocks(ggml_type: int, seed: int = 0) -> np.ndarray:
    """Random bytes laid out as `ggml_type` blocks, with small finite f16 scales."""
    rng = np.random.default_rng(seed)
    n_blocks = ROWS * COLS // WEIGHTS_PER_BLOCK[ggml_type]
    blocks = rng.integers(0, 256, (n_blocks, BLOCK_BYTES[ggml_type]), dtype=np.uint8)
    for at in SCALES_AT.get(ggml_type, (0, 2)):
        scales = (rng.random((n_blocks, 1)) * 0.02 + 0.001).astype(np.float16)
        blocks[:, at:at + 2] = scales.view(np.uint8)
    return blocks.reshape(ROWS, -1)


def _forms(*ggml_types: int) -> dict:
    return gguf_blocks.kernel_forms([(t, _random_blocks(t), ROWS, COLS) for t in ggml_types])


def _source(*ggml_types: int, seed: int = 0) -> SourceMatrix:
    """Matrices of these types stacked by rows, in the forms weights.py gives the chooser."""
    raws = [_random_blocks(t, seed + i) for i, t in enumerate(ggml_types)]
    dense = torch.cat([torch.from_numpy(dequantize(r, t).astype(np.float32))
                       for r, t in zip(raws, ggml_types)])
    forms = gguf_blocks.kernel_forms([(t, r, ROWS, COLS) for t, r in zip(ggml_types, raws)])
    n_bytes = sum(r.nbytes for r in raws)
    kind = Q(ggml_types[0]).name if len(set(ggml_types)) == 1 else "mixed"
    return SourceMatrix(dense, kind, n_bytes, 8 * n_bytes / dense.numel(), **forms)


@pytest.mark.parametrize("ggml_type", list(BLOCK_BYTES))
def test_gguf_blocks_unpack_exactly(ggml_type):
    raw = _random_blocks(ggml_type)
    expected = dequantize(raw, ggml_type)
    forms = gguf_blocks.kernel_forms([(ggml_type, raw, ROWS, COLS)])
    if "q4_blocks" in forms:
        packed, *held = forms["q4_blocks"]
        q = gguf_blocks.unpack_nibbles(packed)
        assert torch.equal(gguf_blocks.pack_nibbles(q), packed)
        scale, minimum = (torch.from_numpy(t) for t in gguf_blocks.group_scales(*held))
        q_int4, scale_int4, zero, group = kernels._int4(SourceMatrix(
            torch.from_numpy(expected), "Q4", raw.nbytes, 4.5, **forms))
        assert torch.equal(q_int4, q) and group == 32
        w = (q_int4.double().reshape(ROWS, -1, 32) - 8) * scale_int4.double()[..., None] + \
            zero.double()[..., None]  # Int4Linear's form: w = (q − 8)·scale + zero
        np.testing.assert_array_equal(w.reshape(ROWS, COLS).float().numpy(), expected)
        ours = (q.reshape(ROWS, -1, 32) * scale[..., None] + minimum[..., None]).reshape(ROWS, COLS)
    elif ggml_type in (Q.Q5_1, Q.Q5_K):
        q, *held = forms["q5_blocks"]
        scale, minimum = (torch.from_numpy(t).double() for t in gguf_blocks.group_scales(*held))
        assert q.min() >= 0 and q.max() <= 31
        ours = q.double().reshape(ROWS, -1, 32) * scale[..., None] + minimum[..., None]
    elif "q2_blocks" in forms:
        q, scale_bytes, d, dmin = forms["q2_blocks"]
        sc, m = (scale_bytes & 15).double(), (scale_bytes >> 4).double()
        d16, dmin16 = d.double().repeat_interleave(16, 1), dmin.double().repeat_interleave(16, 1)
        ours = q.double().reshape(ROWS, -1, 16) * (d16 * sc)[..., None] - (dmin16 * m)[..., None]
    elif "q6_blocks" in forms or "q3_blocks" in forms:
        codes, sc, d = (t.double() for t in forms.get("q6_blocks") or forms["q3_blocks"])
        ours = (codes.reshape(ROWS, -1, 16) * (sc * d.repeat_interleave(16, 1))[..., None])
    else:
        codes, d = forms["q8_blocks"]
        ours = codes.double().reshape(ROWS, -1, 32) * d.double()[..., None]
        if ggml_type == Q.Q5_0:
            q5, d5, minimum, sup = forms["q5_blocks"]
            assert torch.equal(q5 - 16, codes.int()) and torch.equal(d5, d)
            assert minimum is None and sup is None
    np.testing.assert_array_equal(ours.reshape(ROWS, COLS).float().numpy(), expected)


def test_each_type_rounds_activations_as_llama_cpp_does():
    rounding = gguf_blocks.activation_rounding
    assert rounding({Q.Q4_1}) == "q8_1" and rounding({Q.Q4_0, Q.Q4_1}) == "q8_1"
    assert rounding({Q.Q5_0, Q.Q8_0}) == "q8_0"
    assert rounding({Q.Q4_K}) == rounding({Q.Q5_K}) == rounding({Q.Q6_K}) == "q8_k"
    assert rounding({Q.Q5_1}) == "q8_1" and rounding({Q.Q5_1, Q.Q5_K}) is None
    assert rounding({Q.Q4_K, Q.Q5_0}) is None and rounding({Q.F16}) is None


NEEDS_Q4Q8 = pytest.mark.skipif(not q4q8.available(), reason="no AVX2 CPU or C++ compiler")


@pytest.mark.parametrize("ggml_type,kernel", [
    (Q.Q4_0, "int4pack"), (Q.Q4_1, "int4pack"), (Q.Q4_K, "int4pack"), (Q.Q8_0, "int4pack-x2"),
    *(pytest.param(t, k, marks=NEEDS_Q4Q8) for t, k in [
        (Q.Q4_0, "q4q8"), (Q.Q4_0, "q4s8"), (Q.Q4_0, "q4s8x8"), (Q.Q4_1, "q4q8"),
        (Q.Q4_1, "q41x8"), (Q.Q4_K, "q4q8"), (Q.Q4_K, "q4kx8"), (Q.Q8_0, "q8q8"), (Q.Q5_0, "q5q8"),
        (Q.Q5_0, "q8q8"), (Q.Q5_1, "q5q8"), (Q.Q5_K, "q5q8"), (Q.Q6_K, "q6q8"), (Q.Q6_K, "q6kx8"),
        (Q.Q3_K, "q3q8"),
        (Q.Q2_K, "q2q8")])])
def test_exact_kernels_reproduce_the_dequantized_matrix(ggml_type, kernel):
    m = _source(ggml_type)
    layer = kernels.BY_NAME[kernel].build(m, torch.device("cpu"))
    assert kernels.check(layer, m, kernels.BY_NAME[kernel], torch.device("cpu")) is None
    assert kernels.row_invariant(layer, m, torch.device("cpu"))


def test_candidates_keep_the_files_precision_within_the_memory_limit():
    def names(kind: str, bits: float, **parts) -> set[str]:
        dense = torch.zeros(ROWS * (2 if kind == "mixed" else 1), COLS)
        return {k.name for k in candidates(
            SourceMatrix(dense, kind, int(dense.numel() * bits / 8), bits, **parts))}

    # Q4_1 also 8 rows interleaved in its own 5 bits; int8 would be 1.6x
    assert names("Q4_1", 5.0, **_forms(Q.Q4_1)) == {"int4pack", "q4q8", "q41x8"}
    # Q4_0 also in its own 4.5 bits (q4s8, and 8 rows interleaved); not Q4_1, whose offsets
    # are not −8·d
    assert names("Q4_0", 4.5, **_forms(Q.Q4_0)) == {"int4pack", "q4q8", "q4s8", "q4s8x8"}
    assert names("Q4_K", 4.5, **_forms(Q.Q4_K)) == {"int4pack", "q4q8", "q4kx8"}
    assert names("Q8_0", 8.5, **_forms(Q.Q8_0)) == {"int4pack-x2", "q8q8", "int8pack-bf16",
                                                   "int8pack-f32"}
    # Q5_0 as int8 codes would be 9 bits a weight, 1.64x; int8pack requantizes (lossy)
    assert names("Q5_0", 5.5, **_forms(Q.Q5_0)) == {"q5q8", "int8pack-bf16", "int8pack-f32"}
    assert names("Q6_K", 6.5625, **_forms(Q.Q6_K)) == {"q6q8", "q6kx8", "int8pack-bf16",
                                                      "int8pack-f32"}
    assert names("Q5_K", 5.5, **_forms(Q.Q5_K)) == {"q5q8", "int8pack-bf16", "int8pack-f32"}
    assert names("mixed", 5.5, **_forms(Q.Q4_K, Q.Q6_K)) == {"int8pack-bf16", "int8pack-f32"}
    assert names("Q3_K", 3.4375, **_forms(Q.Q3_K)) == {"q3q8"}  # int8pack would be 2.3x
    assert names("Q2_K", 2.625, **_forms(Q.Q2_K)) == {"q2q8"}
    assert names("mixed", 6.3, **_forms(Q.Q5_0, Q.Q8_0)) == {"q8q8", "int8pack-bf16",
                                                            "int8pack-f32"}
    assert names("F16", 16) == {"f16"}  # never below the file's own precision
    assert names("F32", 32) == {"f32"}


def _fake_timings(monkeypatch, us: dict[type, float]) -> None:
    """Kernels timed at fixed µs per row by layer class (the real ones differ by CPU)."""
    monkeypatch.setattr(kernels, "_time_us", lambda layers, n_in, rows, device:
                        [us.get(type(layer), 1000.0) * rows for layer in layers])


SLOWER_Q8Q8 = {qlinear.Int4PairLinear: 15.0, qlinear.Int8Linear: 10.0, q4q8.Q8Q8Linear: 20.0}


def test_the_choice_is_measured_once_and_remembered_per_machine(tmp_path, monkeypatch):
    m = _source(Q.Q8_0)
    _fake_timings(monkeypatch, SLOWER_Q8Q8)
    first = KernelChooser(torch.device("cpu"), cache_dir=tmp_path)
    first.build(m, "ffn")
    record = json.loads((tmp_path / "kernels.json").read_text())
    (key, entry), = record.items()
    assert kernels.device_name(torch.device("cpu")) in key and torch.__version__ in key
    assert entry["kernel"] == "int4pack-x2"  # exact beats the faster requantized int8
    assert set(entry["us_at_1_plus_16_rows"]) == {"int4pack-x2", "q8q8", "int8pack-bf16",
                                                  "int8pack-f32"}

    def no_timing(*args, **kwargs):
        raise AssertionError("measured again")

    monkeypatch.setattr(kernels, "_time_us", no_timing)
    second = KernelChooser(torch.device("cpu"), cache_dir=tmp_path)
    second.build(m, "ffn")
    assert second.chosen == {f"ffn {ROWS}x{COLS} Q8_0": "int4pack-x2"}
    (tmp_path / "kernels.json").write_text("{not json")
    _fake_timings(monkeypatch, SLOWER_Q8Q8)
    KernelChooser(torch.device("cpu"), cache_dir=tmp_path).build(m, "ffn")  # measured, rewritten
    assert json.loads((tmp_path / "kernels.json").read_text())[key]["kernel"] == "int4pack-x2"


def test_a_remembered_choice_is_checked_again_on_sampled_rows_alone(tmp_path, monkeypatch):
    """The next process checks the remembered kernel on sampled_rows without making the whole
    reference; a kernel that now computes one sampled row wrongly is measured again."""
    cpu = torch.device("cpu")
    _fake_timings(monkeypatch, SLOWER_Q8Q8)
    KernelChooser(cpu, cache_dir=tmp_path).build(_source(Q.Q8_0), "ffn")  # int4pack-x2

    def fresh(made: list) -> SourceMatrix:
        m = _source(Q.Q8_0)
        whole = m.reference

        def no_whole():
            raise AssertionError("the whole reference was made")
        m.reference = no_whole
        m.reference_rows = lambda rows: made.append(rows) or whole[rows]
        return m

    made: list = []
    chooser = KernelChooser(cpu, cache_dir=tmp_path)
    chooser.build(fresh(made), "ffn")
    assert made == [kernels.sampled_rows(ROWS)] and chooser.chosen == {
        f"ffn {ROWS}x{COLS} Q8_0": "int4pack-x2"}

    right = qlinear.Int4PairLinear.forward

    def one_row_wrong(self, x):
        y = right(self, x).clone()
        y[..., 5] += 1e3
        return y
    monkeypatch.setattr(qlinear.Int4PairLinear, "forward", one_row_wrong)
    chooser = KernelChooser(cpu, cache_dir=tmp_path)
    chooser.build(_source(Q.Q8_0), "ffn")
    (record,) = chooser.measured.values()  # measured again, the wrong kernel failing
    assert record["us_at_1_plus_16_rows"]["int4pack-x2"] == "failed its check"
    assert chooser.chosen[f"ffn {ROWS}x{COLS} Q8_0"] != "int4pack-x2"


@pytest.mark.parametrize("n", [8, 100, 257, 960, 49152, 128256])
def test_sampled_rows_cover_every_place_in_a_tile_and_both_ends(n):
    rows = kernels.sampled_rows(n)
    assert rows == sorted(set(rows)) and 0 <= rows[0] and rows[-1] < n
    assert len(rows) <= min(n, kernels.CHECKED_ROWS + 1)
    assert set(range(min(n, 16))) <= set(rows) and set(range(max(0, n - 16), n)) <= set(rows)
    middle = [r for r in rows if 16 <= r < n - 16]
    assert n <= kernels.CHECKED_ROWS or {r % 8 for r in middle} == set(range(8))


def test_a_kernels_file_that_is_not_a_regular_file_is_neither_read_nor_replaced(tmp_path,
                                                                                 monkeypatch):
    """A FIFO at kernels.json would block a read forever, a link would send the write
    elsewhere: the choice is measured and not kept."""
    _fake_timings(monkeypatch, SLOWER_Q8Q8)
    os.mkfifo(tmp_path / "kernels.json")
    (tmp_path / "elsewhere.json").write_text("{}")
    os.symlink(tmp_path / "elsewhere.json", tmp_path / "linked")
    chooser = KernelChooser(torch.device("cpu"), cache_dir=tmp_path)
    chooser.build(_source(Q.Q8_0), "ffn")
    assert chooser.measured and stat.S_ISFIFO(os.lstat(tmp_path / "kernels.json").st_mode)
    linked = KernelChooser(torch.device("cpu"), cache_dir=tmp_path)
    linked.cache_path = tmp_path / "linked"
    linked.build(_source(Q.Q8_0), "ffn")
    assert (tmp_path / "elsewhere.json").read_text() == "{}"
    assert os.path.islink(tmp_path / "linked")


@NEEDS_Q4Q8
@pytest.mark.parametrize("int4pack_us,chosen", [(100.0, "q4q8"), (85.0, "q4q8"), (75.0, "int4pack")])
def test_llama_cpps_rounding_wins_unless_another_kernel_is_25_percent_faster(
        monkeypatch, int4pack_us, chosen):
    _fake_timings(monkeypatch, {qlinear.Int4Linear: int4pack_us, q4q8.Q4Q8Linear: 100.0})
    chooser = KernelChooser(torch.device("cpu"))
    chooser.build(_source(Q.Q4_1), "ffn")
    assert chooser.chosen == {f"ffn {ROWS}x{COLS} Q4_1": chosen}


def test_a_kernel_that_is_missing_or_wrong_is_not_used(monkeypatch):
    """A kernel this build lacks (it raises) or that computes something else (it fails the
    reference check) is skipped; float32 is the fallback of last resort."""
    def missing(*args, **kwargs):
        raise RuntimeError("no kernel for this device")

    monkeypatch.setattr(qlinear.Int4Linear, "__init__", missing)
    monkeypatch.setattr(q4q8.Q4Q8Linear, "__init__", missing)
    monkeypatch.setattr(q4x8.Q41x8Linear, "__init__", missing)
    chooser = KernelChooser(torch.device("cpu"))
    layer = chooser.build(_source(Q.Q4_1), "ffn")
    assert isinstance(layer, qlinear.DenseLinear) and chooser.chosen == {"ffn 96x256 Q4_1": "f32"}
    monkeypatch.undo()

    monkeypatch.setattr(qlinear.Int4Linear, "forward", lambda self, x: x.new_zeros(
        *x.shape[:-1], self.out_features))
    chooser = KernelChooser(torch.device("cpu"))
    chooser.build(_source(Q.Q8_0), "ffn")
    (record,) = chooser.measured.values()
    assert record["us_at_1_plus_16_rows"]["int4pack-x2"] == "failed its check"
    assert record["kernel"] in ("q8q8", "int8pack-bf16", "int8pack-f32")


@pytest.mark.model  # loads the bundled model
def test_the_bundled_model_keeps_its_file_size_and_names_each_layers_kernel():
    from localchat.engine import EngineConfig, open_engine

    engine = open_engine(EngineConfig("default", engine="torch", ctx_size=256, threads=2,
                         kv_memory=512 * 23040))
    try:
        info = engine.info
    finally:
        engine.close()
    tensor_bytes = sum(t.n_bytes for t in read_gguf(info.path).tensors.values())
    # the embedding stays mapped from the file (rows paged in when looked up), not held
    # int4pack and q41x8 hold Q4_1 in 1.0x its bytes, q4q8 (float32 scales) in 1.2x
    assert info.weights_bytes <= 1.25 * tensor_bytes, (info.weights_bytes, tensor_bytes)
    layers = {"attn_qkv 960x576 Q4_1", "attn_output 576x576 Q4_1", "ffn_gate_up 3072x576 Q4_1",
              "ffn_down 576x1536 Q4_1"}
    assert info.kernels.keys() == layers | {"output (tied) 49152x576 Q8_0", "generated-token layers"}
    assert all(info.kernels[name] in ("int4pack", "q4q8", "q41x8") for name in layers)  # exact
    assert info.kernels["output (tied) 49152x576 Q8_0"] in ("int4pack-x2", "q8q8")
    assert info.kernels["generated-token layers"] == "eager"  # LOCALCHAT_EAGER=1 (conftest.py)


def test_candidates_are_timed_taking_turns():
    """Each run of one kernel is followed by a run of the next, so a slow spell on the machine
    falls on all of them rather than on the one being timed."""
    calls: list[str] = []

    class Probe(torch.nn.Module):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            calls.append(self.name)
            return x

    us = kernels._time_us([Probe("a"), Probe("b")], 8, 1, torch.device("cpu"))
    assert len(us) == 2 and all(0 < t < 1e6 for t in us)
    turns = [name for name, _ in itertools.groupby(calls)]
    assert turns.count("a") >= 5 and turns.count("b") >= 5
