"""Known target -> draft pairs, offline over a fake hub cache: `--draft auto` picks the family's
draft when it is on disk (and its vocabulary matches), `pull --with-draft` names it, `models`
shows it. The cached "models" are the bundled file under hub names (one real vocabulary)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localchat.cli.models import cmd_models, cmd_pull
from localchat.engine.choice import choose_draft
from localchat.engine.config import DraftChoice
from localchat.errors import UsageError
from localchat.models.draft_pairs import family_name, paired_draft
from localchat.models.specs import resolve_model_facts
from helpers.hub_cache import add_to_cache
from helpers.tiny_models import write_random_model
from test_models import bundled, isolated  # noqa: F401  (fixtures)

COMMIT = "0123456789abcdef0123456789abcdef01234567"
TARGET = ("bartowski/SmolLM2-360M-Instruct-GGUF", "SmolLM2-360M-Instruct-Q4_K_M.gguf")
DRAFT = ("bartowski/SmolLM2-135M-Instruct-GGUF", "SmolLM2-135M-Instruct-Q4_K_M.gguf")


@pytest.fixture
def hub(tmp_path: Path) -> Path:
    """test_models' isolated (autouse here too): an empty offline hub cache, no network."""
    return tmp_path / "hub"


@pytest.fixture
def target(hub, bundled, tmp_path):
    """The "360M" target: a copy of the bundled file (the draft is the file itself)."""
    copy = tmp_path / "target.gguf"
    copy.write_bytes(bundled.read_bytes())
    add_to_cache(hub, *TARGET, source=copy, commit=COMMIT)
    return resolve_model_facts("smollm2:360m", local_only=True)


def test_the_table_pairs_each_family_with_its_small_model():
    cases = {"bartowski/smollm2-1.7b-instruct-gguf": "smollm2:135m",
             "qwen/qwen2.5-7b-instruct-gguf": "qwen2.5:0.5b",
             "bartowski/llama-3.2-3b-instruct-gguf": "llama3.2:1b",
             "bartowski/meta-llama-3.1-8b-instruct-gguf": "llama3.2:1b",
             "ggml-org/gemma-3-4b-it-gguf": "gemma3:270m",
             "bartowski/smollm2-135m-instruct-gguf": None,  # the draft itself
             "qwen/qwen2.5-0.5b-instruct-gguf": None,
             "bartowski/phi-3-mini-gguf": None}
    for name, draft in cases.items():
        facts = type("F", (), {"path": Path("/x") / ("models--" + name.replace("/", "--"))
                                       / "snapshots" / COMMIT / "m.gguf"})()
        assert family_name(facts.path) == name
        assert paired_draft(facts) == draft, name
    local = type("F", (), {"path": Path("/models/Qwen2.5-14B-Instruct-Q4_K_M.gguf")})()
    assert paired_draft(local) == "qwen2.5:0.5b"  # a local file by its name


def test_auto_uses_the_paired_draft_only_when_it_is_on_disk(hub, bundled, target):
    assert choose_draft(DraftChoice("auto"), target).facts is None  # not pulled: lookup
    add_to_cache(hub, *DRAFT, source=bundled, commit=COMMIT)
    plan = choose_draft(DraftChoice("auto"), target)
    assert plan.auto and plan.facts is not None
    assert plan.facts.path.name == DRAFT[1] and "SmolLM2-135M" in str(plan.facts.path)


@pytest.mark.model
def test_auto_skips_a_paired_draft_with_another_vocabulary(hub, target, tmp_path):
    other = write_random_model(tmp_path / "other.gguf", renamed_token=1000)
    add_to_cache(hub, *DRAFT, source=other, commit=COMMIT)
    assert choose_draft(DraftChoice("auto"), target).facts is None


def test_pull_with_draft_fetches_the_pair_and_models_shows_it(hub, bundled, target, capsys):
    assert cmd_models() == 0
    assert "draft: smollm2:135m (pull --with-draft)" in capsys.readouterr().out
    add_to_cache(hub, *DRAFT, source=bundled, commit=COMMIT)  # what the download would write (offline here)
    assert cmd_pull("smollm2:360m", with_draft=True) == 0
    printed = capsys.readouterr().out.split()
    assert printed[0].endswith(TARGET[1]) and printed[1].endswith(DRAFT[1])
    assert cmd_models(as_json=True) == 0
    rows = {r["spec"].split("-")[0]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["smollm2:360m"]["draft"] == {"name": "smollm2:135m", "on_disk": True}
    assert rows["smollm2:135m"]["draft"] is None


def test_pull_with_draft_of_a_model_without_a_pair_is_a_usage_error(bundled):
    with pytest.raises(UsageError, match="no known draft model"):
        cmd_pull("default", with_draft=True)
