"""Tools in the chat: MCP servers (the Model Context Protocol, through the official `mcp`
SDK) the model may call, each call approved by a policy, results capped and fed back."""
