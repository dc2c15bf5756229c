"""Validated files' facts are remembered per file (path, size, mtime): the second validation
reads no metadata, a changed file is read and checked again (a damage then is refused), and
a damaged cache file is ignored."""

from __future__ import annotations

import os

import pytest

from helpers.gguf_builder import tiny_model
from localchat.errors import ModelFormatError
from localchat.models import facts_cache, gguf_reader
from localchat.models.files import validate_model_file


@pytest.fixture
def cache(tmp_path, monkeypatch):
    file = tmp_path / "cache" / "model-facts.json"
    monkeypatch.setattr(facts_cache, "_file", lambda: file)
    return file


def test_a_validated_file_is_not_read_again_until_it_changes(tmp_path, cache, monkeypatch):
    path = tmp_path / "tiny.gguf"
    path.write_bytes(tiny_model().build())
    first = validate_model_file(path)
    assert cache.is_file()

    def no_reading(*args, **kwargs):
        raise AssertionError("read again")

    monkeypatch.setattr(gguf_reader, "read_gguf", no_reading)
    assert validate_model_file(path) == first
    monkeypatch.undo()
    monkeypatch.setattr(facts_cache, "_file", lambda: cache)
    data = bytearray(path.read_bytes())
    data[:4] = b"GGUF"
    data[4] = 99  # an unsupported version: once read, refused
    path.write_bytes(bytes(data))
    os.utime(path, ns=(1, 1))
    with pytest.raises(ModelFormatError):
        validate_model_file(path)


def test_a_damaged_cache_is_ignored(tmp_path, cache):
    path = tmp_path / "tiny.gguf"
    path.write_bytes(tiny_model().build())
    cache.parent.mkdir(parents=True)
    cache.write_text('{"version": 1, "entries": {"x": [1, 2]}, "junk"')
    facts = validate_model_file(path)
    cache.write_text('{"version": 1, "entries": {"%s": {"file": "no", "facts": 5}}}' % path)
    assert validate_model_file(path) == facts
