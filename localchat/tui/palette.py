"""The chat's actions in Textual's command palette (Ctrl+P), the same ones the slash
commands and keys reach."""

from __future__ import annotations

from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider

# (palette title, help, app action name)
PALETTE_ACTIONS = [
    ("New conversation", "start an empty conversation", "new_conversation"),
    ("Regenerate reply", "generate the last reply again (/regen)", "regenerate"),
    ("Continue reply", "keep generating a stopped reply (/continue)", "continue_reply"),
    ("Edit last message", "edit the last message you sent and resend it (/edit)", "edit_last"),
    ("Previous version", "of the selected message, with its branch (Alt+Left)",
     "previous_version"),
    ("Next version", "of the selected message, with its branch (Alt+Right)", "next_version"),
    ("Fork conversation", "copy the branch on screen into a new conversation (/fork)", "fork"),
    ("Copy last reply", "to the clipboard and the clipboard file (/copy)", "copy_reply"),
    ("Copy last code block", "from the last reply (/copy code)", "copy_code"),
    ("Reply stats", "the full stats record of the last reply (/stats)", "show_stats"),
    ("Export as Markdown", "write this conversation to a .md file (/export md)", "export('md')"),
    ("Export as JSON", "write this conversation to a .json file (/export json)", "export('json')"),
    ("Rename conversation", "give this conversation a new title", "rename_current"),
    ("Delete conversation", "delete this conversation (asks first)", "delete_current"),
    ("Parameters", "temperature, top-k, top-p, min-p, repeat penalty, max tokens, context, "
     "seed (F6)", "parameters"),
    ("Choose model", "switch the model or the speculative draft (F7)", "pick_model"),
    ("Toggle speculation", "speculative decoding on/off: reloads the model (F8)",
     "toggle_speculation"),
    ("Toggle conversation list", "show or hide the sidebar", "toggle_sidebar"),
    ("Toggle draft colours", "show which reply tokens a speculative draft proposed (F4)",
     "toggle_draft_colours"),
    ("Toggle thinking", "show or hide the last reply's <think> block (F5)", "toggle_reasoning"),
    ("Toggle light/dark theme", "switch between the light and dark theme", "toggle_dark"),
    ("Help", "keys and slash commands (F1)", "help"),
]


class ChatCommands(Provider):
    async def _run(self, action: str) -> None:
        await self.app.run_action(action)

    async def discover(self) -> Hits:
        for title, help_text, action in PALETTE_ACTIONS:
            yield DiscoveryHit(title, partial(self._run, action), help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, help_text, action in PALETTE_ACTIONS:
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), partial(self._run, action),
                          text=title, help=help_text)
