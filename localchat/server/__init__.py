"""`localchat serve`: an OpenAI-compatible HTTP server on the engine interface."""
