"""A GGUF's byte-level BPE vocabulary as a Hugging Face tokenizer.json (and its
tokenizer_config.json) whose pre-tokenizer splits as llama.cpp's does; an unknown
`tokenizer.ggml.pre` is refused."""

from __future__ import annotations

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from localchat.errors import ModelFormatError

_GPT2 = "gpt2"  # ByteLevel's own regex: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
_DIGITS_THEN_GPT2 = "digits"  # llama.cpp: "\p{N}" first, then the GPT-2 regex
_QWEN2 = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
          "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
_LLAMA3 = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
           "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
# tokenizer.ggml.pre -> how llama.cpp splits (llama-vocab.cpp's regex_exprs per pre type)
PRE_TOKENIZERS = {
    "gpt-2": _GPT2, "mpt": _GPT2, "olmo": _GPT2,
    "smollm": _DIGITS_THEN_GPT2, "starcoder": _DIGITS_THEN_GPT2, "refact": _DIGITS_THEN_GPT2,
    "codeshell": _DIGITS_THEN_GPT2,
    "qwen2": _QWEN2, "llama-bpe": _LLAMA3,
}
CONTROL, USER_DEFINED = 3, 4  # llama.cpp token types


def pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    kind = PRE_TOKENIZERS.get(pre)
    if kind is None:
        raise ModelFormatError(
            f"unknown tokenizer pre-tokenizer {pre!r} (known: {', '.join(sorted(PRE_TOKENIZERS))})")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=kind in (_GPT2, _DIGITS_THEN_GPT2))
    if kind == _GPT2:
        return byte_level
    if kind == _DIGITS_THEN_GPT2:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(kind), behavior="isolated", invert=False), byte_level])


def build_tokenizer(meta: dict) -> Tokenizer:
    if meta.get("tokenizer.ggml.model") != "gpt2":
        raise ModelFormatError(f"exporting a {meta.get('tokenizer.ggml.model')!r} tokenizer is not "
                               "supported (only byte-level BPE, tokenizer.ggml.model = gpt2)")
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    types = [int(t) for t in meta.get("tokenizer.ggml.token_type", [1] * len(tokens))]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise ModelFormatError("the GGUF vocabulary has duplicate tokens")
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizer(str(meta.get("tokenizer.ggml.pre", "gpt-2")))
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i, t in enumerate(types) if t == CONTROL])
    tok.add_tokens([AddedToken(tokens[i], special=False, normalized=False)
                    for i, t in enumerate(types) if t == USER_DEFINED])
    bos = meta.get("tokenizer.ggml.bos_token_id")
    if meta.get("tokenizer.ggml.add_bos_token") and type(bos) is int:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{tokens[bos]} $A", pair=f"{tokens[bos]} $A $B", special_tokens=[(tokens[bos], bos)])
    return tok


def tokenizer_config(meta: dict, context_length: int) -> dict:
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    types = [int(t) for t in meta.get("tokenizer.ggml.token_type", [1] * len(tokens))]

    def text(key: str) -> str | None:
        i = meta.get(f"tokenizer.ggml.{key}")
        return tokens[i] if type(i) is int and 0 <= i < len(tokens) else None

    added = {str(i): {"content": tokens[i], "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "special": t == CONTROL}
             for i, t in enumerate(types) if t in (CONTROL, USER_DEFINED)}
    return {
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        "added_tokens_decoder": added,
        "additional_special_tokens": [tokens[i] for i, t in enumerate(types) if t == CONTROL],
        "bos_token": text("bos_token_id"),
        "eos_token": text("eos_token_id"),
        "unk_token": text("unknown_token_id"),
        "pad_token": text("padding_token_id"),
        "chat_template": meta.get("tokenizer.chat_template"),
        "clean_up_tokenization_spaces": False,
        "model_max_length": context_length,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
