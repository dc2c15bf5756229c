"""`python -m localchat`: the same as the `localchat` command."""

from localchat.cli import entry

entry()
