"""Chat formats for model files without a chat template, and `--chat-template NAME|FILE`: the
family's control tokens in the vocabulary choose the format, then the architecture, then
ChatML (llama.cpp's fallback)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from localchat.errors import ConfigError

MAX_TEMPLATE_CHARS = 1024 * 1024

# System messages are folded into the next user turn for formats without a system role.
_FOLD_SYSTEM = "{% set ns = namespace(system='') %}"

BUILTIN_TEMPLATES: dict[str, str] = {
    "chatml": (
        "{% for message in messages %}"
        "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    ),
    "llama3": (
        "{{ bos_token }}"
        "{% for message in messages %}"
        "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
        " + message['content'] + '<|eot_id|>' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
        "{% endif %}"
    ),
    "gemma": (
        "{{ bos_token }}" + _FOLD_SYSTEM +
        "{% for message in messages %}"
        "{% if message['role'] == 'system' %}"
        "{% set ns.system = ns.system + message['content'] + '\n\n' %}"
        "{% elif message['role'] == 'user' %}"
        "{{ '<start_of_turn>user\n' + ns.system + message['content'] + '<end_of_turn>\n' }}"
        "{% set ns.system = '' %}"
        "{% else %}"
        "{{ '<start_of_turn>model\n' + message['content'] + '<end_of_turn>\n' }}"
        "{% endif %}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
    ),
    "mistral": (
        "{{ bos_token }}" + _FOLD_SYSTEM +
        "{% for message in messages %}"
        "{% if message['role'] == 'system' %}"
        "{% set ns.system = ns.system + message['content'] + '\n\n' %}"
        "{% elif message['role'] == 'user' %}"
        "{{ '[INST] ' + ns.system + message['content'] + ' [/INST]' }}"
        "{% set ns.system = '' %}"
        "{% else %}"
        "{{ message['content'] + eos_token }}"
        "{% endif %}"
        "{% endfor %}"
    ),
    "llama2": (
        _FOLD_SYSTEM +
        "{% for message in messages %}"
        "{% if message['role'] == 'system' %}"
        "{% set ns.system = ns.system + '<<SYS>>\n' + message['content'] + '\n<</SYS>>\n\n' %}"
        "{% elif message['role'] == 'user' %}"
        "{{ bos_token + '[INST] ' + ns.system + message['content'] + ' [/INST]' }}"
        "{% set ns.system = '' %}"
        "{% else %}"
        "{{ ' ' + message['content'] + ' ' + eos_token }}"
        "{% endif %}"
        "{% endfor %}"
    ),
    "phi3": (
        "{% for message in messages %}"
        "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
    ),
}

# A control token in the vocabulary that only one family's format uses, in the order tried.
CHAT_MARKERS: tuple[tuple[str, str], ...] = (
    ("<|start_header_id|>", "llama3"),
    ("<start_of_turn>", "gemma"),
    ("<|im_start|>", "chatml"),
    ("<|assistant|>", "phi3"),
    ("[INST]", "mistral"),
)

# general.architecture -> format, when the vocabulary has none of the markers.
ARCHITECTURE_TEMPLATES = {
    "gemma": "gemma", "gemma2": "gemma", "gemma3": "gemma", "gemma3n": "gemma",
    "phi3": "phi3", "mistral3": "mistral",
    "qwen2": "chatml", "qwen2moe": "chatml", "qwen3": "chatml", "qwen3moe": "chatml",
}
FALLBACK = "chatml"


@dataclass(frozen=True)
class ChosenTemplate:
    """The Jinja source to render with, and where it came from, for --verbose and /stats."""

    source: str
    name: str


def builtin_for(architecture: str, vocabulary_markers: tuple[str, ...]) -> str:
    """The built-in format's name for a file without a template."""
    for marker, name in CHAT_MARKERS:
        if marker in vocabulary_markers:
            return name
    return ARCHITECTURE_TEMPLATES.get(architecture, FALLBACK)


def choose_template(file_template: str | None, architecture: str,
                    vocabulary_markers: tuple[str, ...], override: str | None = None
                    ) -> ChosenTemplate:
    """--chat-template (a built-in NAME or a Jinja FILE) first, then the file's own template,
    then the built-in format its vocabulary or architecture points to. ConfigError for a bad
    override."""
    if override is not None:
        return _override(override)
    if file_template:
        return ChosenTemplate(file_template, "the model file's")
    name = builtin_for(architecture, vocabulary_markers)
    return ChosenTemplate(BUILTIN_TEMPLATES[name], f"{name} (built in: the file has none)")


def _override(value: str) -> ChosenTemplate:
    if value in BUILTIN_TEMPLATES:
        return ChosenTemplate(BUILTIN_TEMPLATES[value], f"{value} (given)")
    path = Path(value).expanduser()
    names = ", ".join(BUILTIN_TEMPLATES)
    if not path.is_file():
        raise ConfigError("chat_template", f"{value!r} is neither a built-in template "
                         f"({names}) nor a file")
    try:
        if path.stat().st_size > MAX_TEMPLATE_CHARS * 4:
            raise ConfigError("chat_template", f"{path}: longer than {MAX_TEMPLATE_CHARS} characters")
        source = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError("chat_template", f"{path}: not UTF-8 text") from None
    except OSError as exc:
        raise ConfigError("chat_template", f"{path}: cannot read it ({exc.strerror or exc})") \
            from None
    if len(source) > MAX_TEMPLATE_CHARS:
        raise ConfigError("chat_template", f"{path}: longer than {MAX_TEMPLATE_CHARS} characters")
    if not source.strip():
        raise ConfigError("chat_template", f"{path}: the file is empty")
    return ChosenTemplate(source, f"{path} (given)")
