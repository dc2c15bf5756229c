"""Measuring quantization: the schemes' error on real matrices of the bundled model, the
scoring protocol, the quality measures on known distributions, and `localchat eval
--table --json` / `quantize --report` on a reduced run."""

from __future__ import annotations

import json
import math

import pytest
import torch

from localchat.cli import main
from localchat.models.gguf_reader import read_gguf
from localchat.models.specs import resolve_model
from quantize.export_hf import gguf_tensor
from quantize.matrix_stats import matrix_error
from localchat.engine.runtime.speculative.adaptive import expected_speedup as speedup
from quantize.quality import compare, windows
from quantize.schemes import rtn_dequantize, rtn_quantize, simulate

from helpers.tiny_models import write_random_model


@pytest.fixture(scope="module")
def real_matrices() -> dict[str, torch.Tensor]:
    names = ("blk.0.ffn_down.weight", "blk.0.attn_q.weight", "blk.15.attn_k.weight",
             "blk.29.ffn_gate.weight")
    with read_gguf(resolve_model("default")) as g:
        return {n: gguf_tensor(g, n) for n in names}


@pytest.mark.model
def test_granularity_ordering_on_real_matrices(real_matrices):
    """Measured on these four matrices: int4 per tensor loses 0.39-0.62 of ‖W‖, per row
    0.15-0.18, groups of 128 0.12-0.14, NF4 0.09-0.10 (Q4_0, blocks of 32: 0.086-0.099);
    int8 per row ≈ 0.01. The bundled
    weights are Q4_1 already, so re-quantizing to Q4_1 is exact (error 0)."""
    for name, w in real_matrices.items():
        err = {s: matrix_error(name, w, simulate(s, w)[0]).rel_error for s in
               ("int8-tensor", "int8-row", "int4-tensor", "int4-row", "int4-g128", "int4-g32",
                "nf4", "Q4_0", "Q4_1", "Q8_0")}
        assert err["int4-tensor"] > 2 * err["int4-row"], (name, err)
        assert err["int4-row"] > 1.15 * err["int4-g128"], (name, err)
        assert err["int4-row"] > err["int4-g128"] > err["int4-g32"] > err["nf4"], (name, err)
        assert err["int8-tensor"] > err["int8-row"] and err["int8-row"] < 0.02, (name, err)
        assert err["int4-tensor"] > 0.3 and err["Q8_0"] < err["int8-row"], (name, err)
        assert err["Q4_1"] < 1e-6 < err["Q4_0"], (name, err)


def test_rtn_codes_scales_and_bits():
    w = torch.randn(8, 200, generator=torch.Generator().manual_seed(0))
    codes, scales = rtn_quantize(w, 4, 64)  # 200 = 3·64 + a short group of 8
    assert scales.shape == (8, 4) and codes.dtype == torch.int8 and int(codes.abs().max()) == 7
    assert torch.allclose(scales[:, 3], w[:, 192:].abs().amax(1) / 7)
    back = rtn_dequantize(codes, scales, 64)
    assert ((back - w).abs() <= scales[:, torch.arange(200) // 64] / 2 + 1e-6).all()
    assert simulate("int4-row", w)[1] == 4 + 32 / 200
    assert simulate("int8-tensor", w)[1] == 8 + 32 / 1600
    assert simulate("Q4_0", torch.randn(4, 64))[1] == 4.5 and simulate("nf4", w)[1] == 4.5


def test_windows_score_each_token_once_with_context():
    for n, window, stride in ((1024, 512, 256), (700, 512, 256), (100, 512, 256), (130, 64, 16)):
        spans = windows(n, window, stride)
        scored = [s + i for s, e, first in spans for i in range(first, e - s)]
        assert scored == list(range(1, n + 1))  # every target once, in order
        assert all(e - s <= window for s, e, _ in spans)
        assert all(first >= window - stride for _, _, first in spans[1:])


def test_quality_measures_on_known_distributions():
    logp = torch.log_softmax(torch.randn(50, 30, generator=torch.Generator().manual_seed(1)), -1)
    target = torch.randint(0, 30, (50,), generator=torch.Generator().manual_seed(2))
    same = compare(logp, logp, target)
    assert same["kl_divergence"] == pytest.approx(0, abs=1e-6) and same["agreement"] == 1
    assert same["alpha"] == pytest.approx(1) and same["predicted_speedup"] == pytest.approx(5 / 2.2)
    uniform = torch.full_like(logp, -math.log(30))
    other = compare(logp, uniform, target)
    assert other["perplexity"] == pytest.approx(30, rel=1e-6)
    assert 0 < other["alpha"] < 1 and other["kl_divergence"] > 0
    assert speedup(0.8, 4, 0.3) == pytest.approx((1 - 0.8 ** 5) / (0.2 * 2.2))
    assert speedup(0.0, 4, 0.3) == pytest.approx(1 / 2.2)


@pytest.mark.model  # evaluates the bundled model
def test_eval_table_json_shape(capsys):
    """A reduced table (64 scored tokens, two schemes) through the real CLI."""
    assert main(["eval", "--table", "--schemes", "int4-tensor,Q8_0", "--tokens", "64",
                 "--window", "96", "--json"]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert {"perplexity", "perplexity_ci95", "model"} <= result["reference"].keys()
    # progress on stderr (stdout here is no terminal): the reference, then a line per row
    progress = captured.err.splitlines()
    assert progress[0].startswith(f"eval --table: reference perplexity "
                                  f"{result['reference']['perplexity']:.3f} (")
    assert [line.split(" (")[0] for line in progress[1:]] == [
        f"eval --table: {i}/2 {r['scheme']}: perplexity {r['perplexity']:.3f}, top-1 agreement "
        f"{r['agreement']:.1%}" for i, r in enumerate(result["rows"], 1)]
    keys = {"scheme", "bits_per_weight", "worst_rel_error", "median_rel_error", "perplexity",
            "agreement", "alpha"}
    rows = {r["scheme"]: r for r in result["rows"]}
    assert list(rows) == ["int4-tensor", "Q8_0"] and all(keys <= r.keys() for r in rows.values())
    assert result["protocol"]["tokens"] == 64 and "simulated" in result["note"]
    q8, int4 = rows["Q8_0"], rows["int4-tensor"]
    assert q8["bits_per_weight"] == 8.5 and int4["bits_per_weight"] == pytest.approx(4, abs=1e-3)
    assert q8["agreement"] > 0.9 and q8["alpha"] > 0.9 and int4["alpha"] < q8["alpha"]
    assert int4["perplexity"] > q8["perplexity"] and int4["worst_rel_error"] > q8["worst_rel_error"]


@pytest.mark.model
@pytest.mark.slow
def test_eval_table_scores_a_draft_beside_the_schemes(tmp_path, capsys):
    """A draft with fewer layers (random weights, the bundled vocabulary) gets a row with α
    and no matrix columns; --drafts without --table is refused in one line."""
    draft = write_random_model(tmp_path / "draft.gguf")
    assert main(["eval", "--table", "--schemes", "Q8_0", "--drafts", str(draft), "--tokens", "64",
                 "--window", "96"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| draft: 2 of 30 layers"))
    assert row.count("| – ") == 3  # no bits per weight or matrix error for a cut-down model
    alpha = float(row.split("|")[8])
    assert 0 <= alpha < 0.2  # random weights: the target's token is rarely its top one
    assert main(["eval", "--drafts", str(draft)]) == 2
    assert "--drafts adds rows to --table" in capsys.readouterr().err


@pytest.mark.slow
def test_quantize_report_against_the_source(tmp_path, capsys):
    out = tmp_path / "q.gguf"
    assert main(["quantize", "default", "-o", str(out), "--type", "Q4_0", "--report",
                 "--tokens", "128", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["quant_type"] == "Q4_0" and report["bits_per_weight"] == 4.5
    assert 0.05 < report["median_rel_error"] < 0.15 and report["agreement"] > 0.5
    assert report["reference"]["quant_type"] == "Q4_1"
