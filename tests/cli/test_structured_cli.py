"""`localchat run` with -j/--json-schema, --grammar (Lark, GBNF) and --json-object, and
`run --batch` lines with response_format, through the real command on the bundled model;
bad schemas and grammars are one-line errors."""

from __future__ import annotations

import pytest
import json

import jsonschema

from helpers.cli import assert_one_line_error, localchat
from helpers.schemas import SCHEMAS

pytestmark = pytest.mark.subprocess  # runs the CLI or starts a process

FLAGS = ("--temp", "0", "-n", "120", "-c", "512", "--no-history")


def test_json_schema_from_a_file_and_inline(tmp_path):
    prompt, schema = SCHEMAS["person"]
    path = tmp_path / "person.json"
    path.write_text(json.dumps(schema))
    from_file = localchat("run", *FLAGS, "-j", str(path), prompt)
    assert from_file.returncode == 0, from_file.stderr
    jsonschema.validate(json.loads(from_file.stdout), schema)
    inline = localchat("run", *FLAGS, "--json-schema", json.dumps(schema), prompt)
    assert inline.stdout == from_file.stdout


def test_grammar_files_lark_and_gbnf(tmp_path):
    lark = tmp_path / "answer.lark"
    lark.write_text('start: "Answer: " ("yes" | "no")\n')
    out = localchat("run", *FLAGS, "--grammar", str(lark), "Is fire hot?")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() in ("Answer: yes", "Answer: no")
    gbnf = tmp_path / "answer.gbnf"
    gbnf.write_text('root ::= "Answer: " ("yes" | "no")\n')
    out = localchat("run", *FLAGS, "--grammar", str(gbnf), "Is fire hot?")
    assert out.stdout.strip() in ("Answer: yes", "Answer: no"), out.stderr


def test_bad_schemas_and_grammars_are_one_line_errors(tmp_path):
    assert_one_line_error(localchat("run", *FLAGS, "-j", "{nope", "Hi"),
                          "-j/--json-schema", "not valid JSON")
    assert_one_line_error(localchat("run", *FLAGS, "-j", str(tmp_path / "missing.json"), "Hi"),
                          "cannot read")
    proc = localchat("run", *FLAGS, "-j", '{"type": "strange"}', "Hi")
    assert_one_line_error(proc, "invalid JSON schema")
    assert proc.returncode == 2
    bad = tmp_path / "bad.lark"
    bad.write_text("start: undefined_rule\n")
    assert_one_line_error(localchat("run", *FLAGS, "--grammar", str(bad), "Hi"),
                          "invalid Lark grammar", "undefined_rule")


def test_batch_lines_with_response_format(tmp_path):
    lines = [{"id": "s", "prompt": SCHEMAS["enum"][0], "response_format": {
                 "type": "json_schema", "json_schema": {"name": "e", "schema": SCHEMAS["enum"][1]}}},
             {"id": "o", "prompt": "Describe a cat.", "max_tokens": 200,
              "response_format": {"type": "json_object"}},
             {"id": "bad", "prompt": "Hi", "response_format": {"type": "xml"}},
             {"id": "free", "prompt": "Hi", "max_tokens": 4}]
    batch = tmp_path / "in.jsonl"
    batch.write_text("".join(json.dumps(line) + "\n" for line in lines))
    proc = localchat("run", "--batch", str(batch), *FLAGS)
    out = {r["id"]: r for r in map(json.loads, proc.stdout.splitlines())}
    jsonschema.validate(json.loads(out["s"]["text"]), SCHEMAS["enum"][1])
    assert isinstance(json.loads(out["o"]["text"]), dict)
    assert "response_format.type" in out["bad"]["error"]
    assert out["free"]["text"]
    assert proc.returncode == 1  # one line failed
