"""ControlsMixin, ChatApp's keys, slash commands and widget messages: send, stop,
regenerate, continue, edit, select a message and its versions, /fork, copy, the stats and
help screens; conversation and engine actions go to app.conversations and app.switcher."""

from __future__ import annotations

from dataclasses import replace

from textual.actions import SkipAction

from localchat.chat.attachments import read_attachment
from localchat.chat.commands import (Command, apply_set, export_args, parse_command, parse_json,
                                     parse_set, unescape)
from localchat.chat.context import prompt_budget
from localchat.chat.reasoning import split_reply, without_reasoning
from localchat.chat.session import Entry
from localchat.engine.base import Message
from localchat.errors import UsageError
from localchat.tui.chat_log import ChatLog
from localchat.tui.clipboard import copy_text, last_code_block
from localchat.tui.drafts import draft_markdown
from localchat.tui.help import help_markdown
from localchat.tui.screens import InfoScreen
from localchat.tui.sidebar import Sidebar
from localchat.tui.widgets import GaugeBar, MessageView, PromptInput, RateSparkline


class ControlsMixin:
    """The user's side of ChatApp: each action a ChatSession call and its view (through
    the app's public methods only)."""

    async def on_prompt_input_submitted(self, message: PromptInput.Submitted) -> None:
        text = message.text.rstrip("\n")
        try:
            command = parse_command(text)
        except UsageError as exc:
            self.error(str(exc), restore=text)
            return
        if command is not None:
            await self.run_command(command, text)
            return
        if self.session.engine is None or self.generating or self.switcher.reloading is not None:
            self.bell()  # and say why; nothing typed is lost
            self.error("a reply is being generated: Esc stops it, then Enter sends this"
                        if self.generating else "the model is loading: Enter sends once it "
                        "is ready", restore=text)
            return
        editing, self.editing = self.editing, None
        if editing is not None:
            self.show_editing_title()
        blocks = [a.as_message() for a in self.attachments]
        self.attachments = []
        typed = unescape(text)
        text = "\n\n".join([*blocks, typed])
        self._select(None)
        await self.start_reply(self.session.send(text, typed) if editing is None else
                               self.session.edit(self.session.entries[editing].key, text))

    async def run_command(self, command: Command, typed: str = "") -> None:
        try:
            await self._run_command(command)
        except UsageError as exc:
            self.error(str(exc), restore=typed or None)

    async def _run_command(self, command: Command) -> None:
        name, arg = command.name, command.arg
        if name == "help":
            self.action_help()
        elif name == "system":
            self._set_system(arg or None)
        elif name == "set":
            field, value = parse_set(arg)
            sampling, max_tokens = apply_set(self.session.params.sampling, self.session.params.max_tokens,
                                             field, value)
            self.session.set_params(replace(self.session.params, sampling=sampling,
                                            max_tokens=max_tokens))
            self.info(f"{field} = {'default' if value is None else value}")
        elif name == "json":
            constraint = parse_json(arg)
            self.session.set_params(replace(self.session.params, constraint=constraint))
            self.show_constraint()
            self.info("replies are free text" if constraint is None else
                      f"replies follow the {constraint.label}")
        elif name == "model":
            if not arg:
                self.action_pick_model()
            else:
                self.switcher.use_model(arg)
        elif name in ("clear", "new"):
            await self.action_new_conversation()
        elif name == "regen":
            await self.action_regenerate()
        elif name == "continue":
            await self.action_continue_reply()
        elif name == "edit":
            self.action_edit_last()
        elif name == "fork":
            await self.action_fork()
        elif name == "copy":
            copies = {"": self.action_copy_reply, "code": self.action_copy_code,
                      "think": self.action_copy_reasoning}
            if arg not in copies:
                raise UsageError("usage: /copy, /copy code or /copy think")
            copies[arg]()
        elif name == "tools":
            if self.tools is None:
                raise UsageError("no MCP servers: put them in mcp.json in the data dir or "
                                 "start with --mcp FILE")
            self.info(self.tools.command(arg))
        elif name == "stats":
            self.action_show_stats()
        elif name == "export":
            fmt, path = export_args(arg)
            self.action_export(fmt, path)
        elif name == "rename":
            if not arg:
                raise UsageError("usage: /rename TITLE")
            await self.conversations.rename(arg)
        elif name == "attach":
            if not arg:
                raise UsageError("usage: /attach PATH")
            self._attach(arg)

    def _attach(self, path: str) -> None:
        """Read a text file for the next message; say its tokens against the context, and
        refuse one that cannot fit beside a reply."""
        attachment = read_attachment(path)
        if self.session.engine is not None:
            n_ctx = self.session.engine.info.n_ctx
            tokens = self.session.engine.count_prompt_tokens([Message("user", attachment.as_message())])
            if tokens > prompt_budget(n_ctx, self.session.params.max_tokens):
                raise UsageError(f"{attachment.name} is {tokens} tokens: it cannot fit in the "
                                 f"{n_ctx}-token context with room for a reply (F6 sets the context)")
            size = f"{tokens} tokens of the {n_ctx}-token context"
        else:
            size = f"{len(attachment.text)} characters"
        self.attachments.append(attachment)
        self.notice(f"📎 {attachment.name}: {size}; sent with your next message", warning=False)

    def _set_system(self, text: str | None) -> None:
        self.session.set_system(text)
        self.show_system_prompt()
        self.info("system prompt set" if text else "system prompt cleared")

    # -- actions -----------------------------------------------------------------------

    def action_stop(self) -> None:
        """Esc: stop the reply being generated (what was said so far is kept); cancel
        an edit; otherwise let the key through (closing dialogs)."""
        if self.generating:
            self.stop_reply()
        elif self.editing is not None and self.screen is self.screen_stack[0]:
            self.editing = None
            self.query_one(PromptInput).clear()
            self.show_editing_title()
        elif self.selected is not None and self.screen is self.screen_stack[0]:
            self._select(None)
        else:
            raise SkipAction()

    def _ready_for_control(self) -> bool:
        if self.generating:
            self.error("a reply is being generated (Esc stops it)")
            return False
        if self.session.engine is None or self.switcher.reloading is not None:
            self.error("the model is not loaded yet")
            return False
        return True

    async def action_regenerate(self) -> None:
        """A new version of the selected reply (a selected message of yours: of the reply
        to it), else of the last reply; the old one stays as a sibling branch."""
        if not self._ready_for_control():
            return
        entries = self.session.entries
        if not entries:
            self.error("nothing to regenerate yet")
            return
        index = len(entries) - 1 if self.selected is None else self.selected
        if index + (entries[index].role == "user") < len(entries):
            self._select(None)
        await self.start_reply(self.session.regenerate(entries[index].key))

    async def action_continue_reply(self) -> None:
        if not self._ready_for_control():
            return
        last = self.session.entries[-1] if self.session.entries else None
        if last is None or last.role != "assistant" or not last.content:
            self.error("no reply to continue")
            return
        await self.start_reply(self.session.continue_(last.key))

    def action_edit_last(self) -> None:
        """Put the selected (else the last) message of yours into the input; Enter sends it
        as a new version, the old one staying as a sibling branch."""
        if self.generating:
            self.error("a reply is being generated (Esc stops it)")
            return
        entries = self.session.entries
        upto = len(entries) if self.selected is None else self.selected + 1
        users = [i for i, e in enumerate(entries[:upto]) if e.role == "user"]
        if not users:
            self.error("no message to edit yet")
            return
        self.editing = users[-1]
        prompt = self.query_one(PromptInput)
        prompt.text = entries[users[-1]].content
        prompt.move_cursor(prompt.document.end)
        prompt.focus()
        self.show_editing_title()

    def show_editing_title(self) -> None:
        self.query_one(PromptInput).border_title = (
            ("editing your last message" if self.editing == self._last_user_index()
             else "editing an earlier message") + " · Enter sends a new version · Esc cancels"
            if self.editing is not None else None)

    def on_prompt_input_edit_last(self, message: PromptInput.EditLast) -> None:
        if self.session.entries and not self.generating:
            self.action_edit_last()

    def _last_user_index(self) -> int | None:
        entries = self.session.entries
        return next((i for i in range(len(entries) - 1, -1, -1)
                     if entries[i].role == "user"), None)

    def _last_reply(self) -> Entry | None:
        return next((e for e in reversed(self.session.entries) if e.role == "assistant"), None)

    def _copy(self, text: str, what: str) -> None:
        path = copy_text(self, text)
        where = f"; also saved to {path}" if path else ""
        self.info(f"copied {what} to the clipboard (if the terminal allows OSC 52){where}")

    def action_copy_reply(self) -> None:
        reply = self._last_reply()
        if reply is None or not reply.content:
            self.error("no reply to copy")
            return
        self._copy(without_reasoning(reply.content), "the last reply")  # /copy think: its reasoning

    def action_copy_reasoning(self) -> None:
        reply = self._last_reply()
        reasoning = split_reply(reply.content)[0] if reply else ""
        if not reasoning:
            self.error("the last reply has no thinking block")
            return
        self._copy(reasoning, "the last reply's thinking")

    def action_toggle_reasoning(self) -> None:
        """F5: expand or collapse the last reply's thinking block."""
        reply = self._last_reply()
        view = self.query_one(ChatLog).views[reply.key] if reply is not None else None
        if view is None or not view.reasoning:
            self.error("the last reply has no thinking block")
            return
        view.toggle_reasoning()

    def action_copy_code(self) -> None:
        reply = self._last_reply()
        code = last_code_block(reply.content) if reply else None
        if code is None:
            self.error("the last reply has no code block")
            return
        self._copy(code, "the last code block")

    def on_message_view_clicked(self, message: MessageView.Clicked) -> None:
        key = message.view.key
        entry = next((e for e in self.session.entries if e.key == key), None)
        if entry is not None and entry.content:
            self._copy(entry.content, "the message")

    def action_show_stats(self) -> None:
        reply = next((e for e in reversed(self.session.entries)
                      if e.role == "assistant" and e.stats is not None), None)
        if reply is None:
            self.error("no reply with stats yet")
            return
        rows = [(k, v) for k, v in reply.stats.to_dict().items() if k != "draft"]
        rows += [("finish_reason", reply.finish_reason or reply.status), ("status", reply.status)]
        if self.session.engine is not None:
            rows += [("model", self.session.engine.info.name), ("engine", self.session.engine.name),
                     ("chat_template", self.session.engine.info.chat_template)]
        body = "| field | value |\n| --- | --- |\n" + "\n".join(
            f"| {k} | {v:.4g} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in rows)
        if reply.stats.restored_tokens:
            body = f"{reply.stats.restored_note()}\n\n{body}"
        if reply.stats.kv_saved:
            body = f"KV snapshot: {reply.stats.kv_saved}\n\n{body}"
        if reply.stats.draft:
            body += "\n\n**Speculative decoding**\n\n" + draft_markdown(reply.stats.draft)
        self.push_screen(InfoScreen("Stats of the last reply", body))

    def action_help(self) -> None:
        self.push_screen(InfoScreen("localchat help", help_markdown(self.keymap_file)))

    def action_toggle_draft_colours(self) -> None:
        """F4: finished replies generated here with a draft in draft colours, or Markdown."""
        shown = self.query_one(ChatLog).toggle_draft_colours(self.session.entries)
        if not self.draft_colours:
            self.info("replies shown as Markdown")
        elif shown:
            self.info(f"draft tokens coloured in {shown} repl{'y' if shown == 1 else 'ies'} "
                       "(F4 shows Markdown again)")
        else:
            self.info("draft colours on: replies generated here with a draft (--draft ngram, "
                       "--draft-model) show what the draft proposed")

    # -- selecting a message, its versions, /fork --------------------------------------

    def _select(self, index: int | None) -> None:
        """Mark entries[index] as the message the controls act on (None: the last)."""
        self.selected = index
        self.query_one(ChatLog).select(
            self.session.entries[index].key if index is not None else None)

    def action_select_previous(self) -> None:
        """Alt+Up: select the message above (from the input: the last one)."""
        if not self.session.entries:
            self.error("no message to select yet")
            return
        self._select(len(self.session.entries) - 1 if self.selected is None
                     else max(self.selected - 1, 0))

    def action_select_next(self) -> None:
        """Alt+Down: select the message below; past the last one, back to the input."""
        if self.selected is None:
            raise SkipAction()
        below = self.selected + 1
        self._select(below if below < len(self.session.entries) else None)

    async def action_previous_version(self) -> None:
        await self._switch_version(-1)

    async def action_next_version(self) -> None:
        await self._switch_version(+1)

    async def _switch_version(self, step: int) -> None:
        """Show another version of the selected message (or of the lowest message that
        has more than one), with the branch that follows it."""
        if self.generating:
            self.error("a reply is being generated (Esc stops it)")
            return
        if self.editing is not None:
            self.error("finish the edit (Enter) or cancel it (Esc) first")
            return
        entries = self.session.entries
        index = self.selected if self.selected is not None else next(
            (i for i in range(len(entries) - 1, -1, -1) if len(entries[i].siblings) > 1), None)
        entry = entries[index] if index is not None else None
        if entry is None or len(entry.siblings) < 2 or entry.db_id not in entry.siblings:
            self.error("this message has one version: regenerating (Ctrl+R) or editing a "
                        "message adds another (Alt+Up selects an earlier one)")
            return
        at, count = entry.siblings.index(entry.db_id) + 1, len(entry.siblings)
        if not 1 <= at + step <= count:  # the ends stop: no wrapping round
            self.error(f"this is the {'first' if step < 0 else 'last'} version ({at} of {count})")
            return
        if not self.session.switch_version(entry.key, step):
            return
        await self.query_one(ChatLog).show(self.session.entries)
        self.show_branch_context()
        self._select(index)  # the next Alt+Left/Right acts on this message again

    def show_branch_context(self) -> None:
        """The ctx gauge after a branch switch: the tokens of the branch now on screen (its
        last reply's context, else its prompt's tokens), not the last generated reply's."""
        gauges = self.query_one(GaugeBar)
        if gauges.stats is None:
            return
        last = next((e.stats for e in reversed(self.session.entries) if e.stats is not None
                     and e.stats.context_tokens), None)
        if last is not None:
            tokens = last.context_tokens
        elif self.session.engine is not None and self.session.entries:
            tokens = self.session.engine.count_prompt_tokens(self.session.history)
        else:
            tokens = 0
        gauges.stats = replace(gauges.stats, context_tokens=tokens)

    async def action_fork(self) -> None:
        """/fork: a new conversation holding a copy of the branch on screen."""
        if self.session.conversation is None or self.session.store is None:
            self.error("nothing to fork: this conversation is not in the history yet")
            return
        if self.generating:
            self.error("a reply is being generated (Esc stops it)")
            return
        fork = self.session.fork()
        if fork is not None and await self.conversations.open(fork.id):
            self.info(f"forked into “{fork.title}”; the original is unchanged")

    async def reset_chat(self) -> None:
        """An empty chat pane; the gauges drop the last reply's figures (not this chat's)."""
        self.attachments = []
        self.editing = self.selected = None
        self.show_editing_title()
        await self.query_one(ChatLog).clear()
        self.query_one(GaugeBar).stats = None
        self.query_one(RateSparkline).reset()

    # -- conversations (app.conversations) -------------------------------------------

    async def on_sidebar_action(self, message: Sidebar.Action) -> None:
        await self.conversations.act(message.action, message.conversation_id)

    async def on_sidebar_search_changed(self, message: Sidebar.SearchChanged) -> None:
        await self.conversations.search_for(message.text)

    async def action_new_conversation(self) -> None:
        await self.conversations.new()

    async def action_toggle_sidebar(self) -> None:
        await self.conversations.toggle_sidebar()

    def action_rename_current(self) -> None:
        self.conversations.rename_current()

    def action_delete_current(self) -> None:
        self.conversations.delete_current()

    def action_export(self, fmt: str = "md", path: str | None = None) -> None:
        self.conversations.export(fmt, path)

    # -- the engine (app.switcher) ---------------------------------------------------

    def action_parameters(self) -> None:
        self.switcher.parameters()

    def action_pick_model(self) -> None:
        self.switcher.pick_model()

    def action_toggle_speculation(self) -> None:
        self.switcher.toggle_speculation()
