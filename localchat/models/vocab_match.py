"""Whether a draft model may draft for a target: both must share one vocabulary, or the
draft's token ids mean something else to the target. Checked before either loads."""

from __future__ import annotations

from localchat.errors import ConfigError


def tokenizer_metadata(path) -> dict:
    """The file's tokenizer.ggml.* metadata."""
    from localchat.models.gguf_reader import read_gguf  # gguf: only when a draft is checked

    gguf_file = read_gguf(path)
    try:
        return {k: v for k, v in gguf_file.metadata.items() if k.startswith("tokenizer.ggml.")}
    finally:
        gguf_file.close()


def check_same_vocabulary(target_path, draft_path, draft_name: str) -> None:
    """As llama.cpp does before speculating: same tokenizer type, BOS/EOS ids, size, and
    token texts. A draft with another vocabulary proposes meaningless ids."""
    same_vocabulary(tokenizer_metadata(target_path), tokenizer_metadata(draft_path), draft_name)


def same_vocabulary(target: dict, draft: dict, draft_name: str) -> None:
    """check_same_vocabulary() on two files' tokenizer_metadata(); ConfigError if they differ."""
    for key in ("tokenizer.ggml.model", "tokenizer.ggml.bos_token_id",
                "tokenizer.ggml.eos_token_id"):
        if target.get(key) != draft.get(key):
            raise ConfigError("draft", f"{draft_name} does not share the target's "
                                      "vocabulary "
                                      f"({key}: {draft.get(key)!r} vs {target.get(key)!r})")
    ours, theirs = target["tokenizer.ggml.tokens"], draft["tokenizer.ggml.tokens"]
    if len(ours) != len(theirs):
        raise ConfigError("draft", f"{draft_name} has {len(theirs)} tokens, the target "
                                      f"{len(ours)}: they must share one vocabulary")
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            raise ConfigError("draft", f"{draft_name} differs from the target at token {i} "
                                          f"({b!r} vs {a!r}): they must share one vocabulary")
