"""A conversation as a tree of messages: each message has a parent (None for a first
message), and an edit or a regeneration adds a sibling instead of replacing one. These
functions work on {id: parent_id} maps; the store (conversations.py) does the SQL."""

from __future__ import annotations

from collections import defaultdict


def children_of(parents: dict[int, int | None]) -> dict[int | None, list[int]]:
    """{parent: [child ids, oldest first]}; first messages are under None."""
    children: dict[int | None, list[int]] = defaultdict(list)
    for message_id in sorted(parents):
        children[parents[message_id]].append(message_id)
    return children


def path_to(leaf: int | None, parents: dict[int, int | None]) -> list[int]:
    """The message ids from the first message down to `leaf` (empty for None or an id
    that is not there); a damaged cycle ends the walk instead of looping."""
    path, seen = [], set()
    while leaf is not None and leaf in parents and leaf not in seen:
        seen.add(leaf)
        path.append(leaf)
        leaf = parents[leaf]
    return path[::-1]


def subtree(message_id: int, parents: dict[int, int | None]) -> list[int]:
    """`message_id` and every message that followed it, in any branch."""
    children = children_of(parents)
    found, seen, todo = [], set(), [message_id]
    while todo:
        node = todo.pop()
        if node in parents and node not in seen:
            seen.add(node)
            found.append(node)
            todo.extend(children.get(node, ()))
    return found


def latest_leaf(message_id: int, parents: dict[int, int | None]) -> int:
    """Where switching to `message_id` lands: the newest message written under it (the
    branch last worked on there), or the message itself."""
    return max(subtree(message_id, parents), default=message_id)
