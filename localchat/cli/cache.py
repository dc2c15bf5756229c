"""`localchat cache ls|clear`: the KV snapshots on disk (saved conversation prefixes that
reopen without a prefill), what each holds and the space they take."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from localchat.storage.kv_snapshots import KVSnapshotStore
from localchat.units import human_bytes


def add_parser(sub) -> None:
    cache = sub.add_parser("cache", help="KV snapshots on disk: ls lists them, clear removes them")
    actions = cache.add_subparsers(dest="cache_action", metavar="ACTION", required=True)
    ls = actions.add_parser("ls", help="list the snapshots, least recently used first")
    ls.add_argument("--json", action="store_true", help="print JSON")
    ls.set_defaults(handler=lambda args: cmd_ls(as_json=args.json))
    clear = actions.add_parser("clear", help="remove every snapshot")
    clear.set_defaults(handler=lambda args: cmd_clear())


def cmd_ls(as_json: bool = False) -> int:
    store = KVSnapshotStore()
    rows = [{"model": e.model, "engine": e.identity.split("|", 1)[0], "tokens": e.n_tokens,
             "bytes": e.size, "last_used": e.used} for e in store.entries()]
    unfinished = sum(store.unfinished.values())
    if as_json:
        print(json.dumps({"folder": str(store.path), "total_bytes": store.total_bytes(),
                          "unfinished_writes": len(store.unfinished),
                          "unfinished_bytes": unfinished, "snapshots": rows,
                          "notes": store.notes}, indent=2))
        return 0
    for note in store.notes:
        print(f"note: {note}", file=sys.stderr)
    if rows:
        width = max(len("MODEL"), *(len(Path(r["model"]).name) for r in rows))
        print(f"{'MODEL':<{width}} {'ENGINE':<10} {'TOKENS':>7} {'SIZE':>10}  LAST USED")
        for row in rows:
            used = time.strftime("%Y-%m-%d %H:%M", time.localtime(row["last_used"]))
            print(f"{Path(row['model']).name:<{width}} {row['engine']:<10} {row['tokens']:>7,} "
                  f"{human_bytes(row['bytes']):>10}  {used}")
        print(f"{len(rows)} snapshot(s), {human_bytes(store.total_bytes())} in {store.path}")
    else:
        print(f"no KV snapshots in {store.path}")
    if store.unfinished:
        print(f"{len(store.unfinished)} unfinished write(s), {human_bytes(unfinished)} "
              "(a process writing a snapshot, or one that stopped mid-write: `cache clear` "
              "removes those whose process is gone)")
    return 0


def cmd_clear() -> int:
    store = KVSnapshotStore()
    for note in store.notes:
        print(f"note: {note}", file=sys.stderr)
    n = len(store.entries())
    freed = store.clear()
    print(f"removed {n} KV snapshot(s), {human_bytes(freed)}")
    return 0
