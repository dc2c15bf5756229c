"""Model files without a chat template get their family's format; --chat-template overrides."""

from __future__ import annotations

import pytest

from localchat.prompt.builtin_templates import BUILTIN_TEMPLATES, builtin_for, choose_template
from localchat.prompt.template import render_chat
from localchat.engine import EngineConfig, open_engine
from localchat.engine.base import Message
from localchat.errors import UsageError

from helpers.cli import localchat
from helpers.tiny_models import write_random_model

CONVERSATION = [Message("system", "Be brief."), Message("user", "Hi <start_of_turn> there"),
                Message("assistant", "Hello."), Message("user", "Name a colour.")]
# The bundled vocabulary's ChatML control tokens renamed to Gemma's: a Gemma-like file.
GEMMA_TOKENS = {1: "<start_of_turn>", 2: "<end_of_turn>"}


@pytest.mark.parametrize("name", sorted(BUILTIN_TEMPLATES))
def test_each_builtin_keeps_typed_text_apart_from_its_control_tokens(name):
    prompt = render_chat(BUILTIN_TEMPLATES[name], CONVERSATION, bos_token="<bos>",
                         eos_token="<eos>")
    untrusted = [s.text for s in prompt.segments if not s.trusted]
    assert untrusted == [m.content for m in CONVERSATION]  # each message exactly once
    assert "".join(s.text for s in prompt.segments) == prompt.text


def test_gemma_format_folds_the_system_prompt_and_names_the_model_turn():
    text = render_chat(BUILTIN_TEMPLATES["gemma"], CONVERSATION[:2], bos_token="<bos>").text
    assert text == ("<bos><start_of_turn>user\nBe brief.\n\nHi <start_of_turn> there"
                    "<end_of_turn>\n<start_of_turn>model\n")


def test_the_vocabulary_then_the_architecture_then_chatml_choose_the_format():
    assert builtin_for("llama", ("<|start_header_id|>",)) == "llama3"
    assert builtin_for("llama", ("<start_of_turn>",)) == "gemma"
    assert builtin_for("gemma3", ()) == "gemma"
    assert builtin_for("phi3", ()) == "phi3"
    assert builtin_for("llama", ()) == "chatml"


def test_a_file_template_wins_unless_overridden(tmp_path):
    assert choose_template("{{ x }}", "gemma3", ()).name == "the model file's"
    assert choose_template("{{ x }}", "llama", (), "llama3").source == BUILTIN_TEMPLATES["llama3"]
    jinja = tmp_path / "mine.jinja"
    jinja.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    chosen = choose_template("{{ x }}", "llama", (), str(jinja))
    assert chosen.source == jinja.read_text() and chosen.name == f"{jinja} (given)"


@pytest.mark.parametrize("value, needle", [("gemma4", "neither a built-in template"),
                                           ("{dir}", "neither a built-in template"),
                                           ("{empty}", "the file is empty"),
                                           ("{binary}", "not UTF-8")])
def test_a_bad_override_is_a_usage_error(tmp_path, value, needle):
    (tmp_path / "empty.jinja").write_text("  \n")
    (tmp_path / "binary.jinja").write_bytes(b"\xff\xfe{{")
    value = value.format(dir=tmp_path, empty=tmp_path / "empty.jinja",
                         binary=tmp_path / "binary.jinja")
    with pytest.raises(UsageError, match=needle):
        choose_template(None, "llama", (), value)


@pytest.fixture(scope="module")
def gemma_like(tmp_path_factory):
    path = tmp_path_factory.mktemp("nochat") / "gemma-like.gguf"
    return write_random_model(path, token_texts=GEMMA_TOKENS, chat_template=False)


@pytest.mark.model
def test_a_gemma_vocabulary_without_a_template_renders_gemma_turns(gemma_like):
    engine = open_engine(EngineConfig(str(gemma_like), parallel=1, ctx_size=256))
    try:
        assert engine.info.chat_template == "gemma (built in: the file has none)"
        tokens = engine.tokenize_messages([Message("user", "hi")])
        bos = start = 1  # the vocabulary's BOS is its first control token, here <start_of_turn>
        end = 2  # <end_of_turn>: real control tokens, not text
        text = engine.tokenize_text
        assert tokens == [bos, start, *text("user\nhi"), end, *text("\n"), start,
                          *text("model\n")]
        assert engine.is_end_of_generation(end)
    finally:
        engine.close()


@pytest.mark.model
@pytest.mark.subprocess
def test_chat_template_flag_and_verbose_name_the_template(gemma_like, tmp_path):
    proc = localchat("run", "-m", str(gemma_like), "-n", "2", "--temp", "0", "--verbose", "hi")
    assert proc.returncode == 0, proc.stderr
    assert "chat template:        gemma (built in: the file has none)" in proc.stderr
    proc = localchat("run", "-m", str(gemma_like), "-n", "2", "--chat-template", "chatml",
                     "--verbose", "hi")
    assert proc.returncode == 0, proc.stderr
    assert "chat template:        chatml (given)" in proc.stderr
    proc = localchat("run", "-m", str(gemma_like), "--chat-template", str(tmp_path / "no"), "hi")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"localchat: error: --chat-template '{tmp_path / 'no'}' is neither a built-in template "
        "(chatml, llama3, gemma, mistral, llama2, phi3) nor a file"]
