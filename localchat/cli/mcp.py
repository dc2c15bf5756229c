"""`localchat mcp ls`: the MCP servers of mcp.json (or --mcp FILE), each started to list
its state and tools, then stopped."""

from __future__ import annotations

import json


def add_parser(sub) -> None:
    mcp = sub.add_parser("mcp", help="MCP tool servers: ls lists them and their tools")
    actions = mcp.add_subparsers(dest="mcp_action", metavar="ACTION", required=True)
    ls = actions.add_parser("ls", help="start each server, list its state and tools")
    ls.add_argument("--mcp", default=None, metavar="FILE",
                    help="the servers file (default: mcp.json in the data dir)")
    ls.add_argument("--json", action="store_true", help="print JSON")
    ls.set_defaults(handler=cmd_ls)


def cmd_ls(args) -> int:
    from localchat.tools.config import default_path, load_servers
    from localchat.tools.hub import McpHub

    servers = load_servers(args.mcp)
    if not servers:
        print(f"no MCP servers: put them in {default_path()} "
              '({"mcpServers": {"NAME": {"command": ..., "args": [...]}}}) or give --mcp FILE')
        return 0
    with McpHub(servers) as hub:
        tools = hub.start()
    if args.json:
        print(json.dumps({"servers": [
            {"name": s.name, "state": hub.state[s.name],
             "transport": "http" if s.url else "stdio",
             "tools": [{"name": t.exposed, "description": t.description, "schema": t.schema}
                       for t in tools if t.server == s.name]} for s in servers]}, indent=2))
        return 0
    for s in servers:
        print(f"{s.name} ({'http ' + s.url if s.url else 'stdio ' + (s.command or '')}): "
              f"{hub.state[s.name]}")
        for t in (t for t in tools if t.server == s.name):
            about = t.description.strip().splitlines()[0] if t.description.strip() else ""
            trusted = " (allowed)" if t.name in s.allow else ""
            print(f"  {t.exposed}{trusted}" + (f": {about[:100]}" if about else ""))
    return 0
