"""Where localchat keeps its files: the data dir (history, models.json, exports), config.toml
(both in $LOCALCHAT_HOME when set) and the cache dir. Imports nothing from localchat."""

from __future__ import annotations

import os
from pathlib import Path

CONFIG_FILE = "config.toml"


def data_dir() -> Path:
    """Where localchat keeps its state: $LOCALCHAT_HOME, else the platform's data dir."""
    home = os.environ.get("LOCALCHAT_HOME")
    if home:
        return Path(home).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("localchat"))


def cache_dir() -> Path:
    """Rebuildable files shared by every data dir (compiled kernels): the platform's cache dir."""
    import platformdirs

    return Path(platformdirs.user_cache_dir("localchat"))


def config_path() -> Path:
    """config.toml: in $LOCALCHAT_HOME when set, else the platform's config dir."""
    home = os.environ.get("LOCALCHAT_HOME")
    if home:
        return Path(home).expanduser() / CONFIG_FILE
    import platformdirs

    return Path(platformdirs.user_config_dir("localchat")) / CONFIG_FILE
