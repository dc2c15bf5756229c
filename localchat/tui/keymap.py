"""Rebinding keys by action name from the [keys] table of config.toml (in $LOCALCHAT_HOME,
else the platform's config dir): load_keymap() gives Textual's keymap, or a problem to
report while the default keys stay."""

from __future__ import annotations

from pathlib import Path

from localchat.paths import config_path

ACTIONS = ("stop", "toggle_sidebar", "new_conversation", "regenerate", "continue_reply",
           "select_previous", "select_next", "previous_version", "next_version",
           "copy_reply", "copy_code", "toggle_draft_colours", "toggle_reasoning", "parameters",
           "pick_model", "toggle_speculation", "toggle_theme", "help", "quit")


def parse_keymap(data: dict) -> dict[str, str]:
    """{action: "key[,key]"} from the parsed TOML; ValueError on unknown names or values."""
    keys = data.get("keys", {})
    if not isinstance(keys, dict):
        raise ValueError("[keys] must be a table of action = \"key\"")
    keymap = {}
    for action, value in keys.items():
        if action not in ACTIONS:
            raise ValueError(f"unknown action {action!r} in [keys] (actions: {', '.join(ACTIONS)})")
        if isinstance(value, list):
            value = ",".join(value)
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"[keys] {action} must be a key name like \"ctrl+r\"")
        keymap[action] = ",".join(k.strip() for k in value.split(",") if k.strip())
    return keymap


def load_keymap(path: Path | None = None) -> tuple[Path, dict[str, str], str | None]:
    """(the config path, the keymap, a one-line problem or None)."""
    path = path or config_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return path, {}, None
    except OSError as exc:
        return path, {}, f"could not read {path}: {exc}"
    try:
        import tomllib
    except ImportError:  # Python 3.10
        return path, {}, f"key bindings in {path} need Python 3.11 (tomllib)"
    try:
        return path, parse_keymap(tomllib.loads(text)), None
    except (tomllib.TOMLDecodeError, ValueError) as exc:
        return path, {}, f"{path}: {exc}; default keys kept"
