"""Model files that crashed or misled the engines (issue 39 #6-#8), each a real two-layer model
with one lie in it: refused in one line naming the field, before llama.cpp or the torch engine
loads it (a duplicate token or a NaN epsilon made llama.cpp abort the process, rc 134)."""

from __future__ import annotations

from pathlib import Path

import pytest

from localchat.models.files import validate_model_file
from localchat.models.gguf_reader import GGUFFormatError, read_gguf
from localchat.models.specs import resolve_model
from helpers.cli import assert_one_line_error, localchat
from helpers.tiny_models import write_random_model

pytestmark = []  # 


def _duplicate_token() -> dict:
    with read_gguf(resolve_model("default")) as bundled:
        tokens = bundled.metadata["tokenizer.ggml.tokens"]
    return {"token_texts": {5: tokens[6]}}  # token 5 spelled like token 6: one byte apart


REFUSED_BY_BOTH = {  # case: (write_random_model arguments, field, words)
    "duplicate token": (_duplicate_token, "tokenizer.ggml.tokens", "appears twice (ids 5 and 6)"),
    "NaN epsilon": (lambda: {"declared": {"layer_norm_rms_eps": float("nan")}},
                    "llama.attention.layer_norm_rms_epsilon", "nan is not a finite number"),
    "infinite epsilon": (lambda: {"declared": {"layer_norm_rms_eps": float("inf")}},
                         "llama.attention.layer_norm_rms_epsilon", "inf is not a finite number"),
    "negative epsilon": (lambda: {"declared": {"layer_norm_rms_eps": -1.0}},
                         "llama.attention.layer_norm_rms_epsilon", "outside 0..1"),
    "unknown tokenizer": (lambda: {"declared": {"tokenizer_model": "foo"}},
                          "tokenizer.ggml.model", "'foo' is not a tokenizer llama.cpp knows"),
}


@pytest.mark.model
@pytest.mark.parametrize("case", list(REFUSED_BY_BOTH))
def test_refused_when_validated(tmp_path: Path, case: str) -> None:
    arguments, field, words = REFUSED_BY_BOTH[case]
    path = write_random_model(tmp_path / "m.gguf", **arguments())
    with pytest.raises(GGUFFormatError) as e:
        validate_model_file(path)
    assert e.value.field == field and words in str(e.value), str(e.value)


@pytest.mark.subprocess
@pytest.mark.parametrize("engine", ["llama.cpp", "torch"])
@pytest.mark.parametrize("case", ["duplicate token", "NaN epsilon"])
def test_run_says_one_line_instead_of_aborting(tmp_path: Path, case: str, engine: str) -> None:
    """The real CLI: one line and exit 1, not SIGABRT (rc 134) with nothing on stderr."""
    arguments, field, words = REFUSED_BY_BOTH[case]
    path = write_random_model(tmp_path / "m.gguf", **arguments())
    done = localchat("run", "-m", str(path), "--engine", engine, "-n", "4", "hi")
    assert done.returncode == 1, (done.returncode, done.stderr[-500:])
    assert_one_line_error(done, field, words)


DISAGREEING = {  # metadata that disagrees with the tensors: the torch engine's load refuses it
    "embedding_length": ({"embedding_length": 96}, "token_embd.weight", "llama.embedding_length=96"),
    "feed_forward_length": ({"feed_forward_length": 128}, "blk.0.ffn_gate.weight",
                            "feed_forward_length=128"),
    "head_count_kv": ({"head_count_kv": 4}, "blk.0.attn_k.weight", "head_count_kv=4"),
    "block_count too small": ({"block_count": 1}, "llama.block_count",
                              "1, but the file holds tensor 'blk.1."),
    "block_count too large": ({"block_count": 3}, "blk.2.attn_norm.weight", "is missing"),
}


@pytest.mark.model
@pytest.mark.parametrize("case", list(DISAGREEING))
def test_torch_engine_checks_shapes_against_metadata(tmp_path: Path, case: str) -> None:
    from localchat.engine.executors.torch.weights import load_weights

    declared, field, words = DISAGREEING[case]
    path = write_random_model(tmp_path / "m.gguf", declared=declared)
    with pytest.raises(GGUFFormatError) as e:
        load_weights(path)
    assert e.value.field == field and words in str(e.value), str(e.value)


@pytest.mark.model
@pytest.mark.subprocess
def test_llama_cpp_names_what_it_refused(tmp_path: Path) -> None:
    """Issue 39 #16: llama.cpp's own refusal ("Failed to load model from file") now says
    what it refused, as llama.cpp logged it: here a layer block_count promises but lacks."""
    path = write_random_model(tmp_path / "m.gguf", declared={"block_count": 3})
    done = localchat("run", "-m", str(path), "--engine", "llama.cpp", "-n", "4", "hi")
    assert_one_line_error(done, "llama.cpp could not load m.gguf: ",
                          "tensor 'blk.2.attn_norm.weight' not found")
