"""A Slack-compatible sink on 127.0.0.1 that prints each message the way Slack would show it.

The daemon talks to it exactly as to Slack (``slack.token`` + ``slack.base_url``): ``POST
/api/chat.postMessage``, ``chat.update`` when an incident's message is edited in place, and
``conversations.list``/``history``/``replies`` when it looks for a post in doubt. The wire
format is the test suite's Slack stand-in (``tests/fixtures/slack_server.py``, written
against Slack's Web API documentation), reused here rather than written twice. Each
accepted message is printed as a Slack client lays it out: who and when, thread replies under
their parent, the header, sections, evidence, the "Runbook" button with its link, the context
line; an edit is printed as the message it now is. :meth:`SlackSink.channel_view` is the channel
as the on-call engineer sees it at the end: each top-level message as last edited, its thread under
it. With ``SLACK_WEBHOOK_URL`` set, each message is also sent to that real incoming webhook
(webhooks cannot thread: a reply says which message it answers). ::

    with SlackSink(print_message=print) as sink:
        ...  # the daemon posts to sink.api_url
        sink.wait_for(lambda m: "Resolved" in m.text, timeout_s=30)
"""

from __future__ import annotations

import os
import queue
import re
import textwrap
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from tests.fixtures.slack_server import PostedMessage, SlackFixtureServer

__all__ = ["SlackSink", "render_for_terminal"]

#: The emoji codes diagnoser's messages use, as a Slack client draws them.
EMOJI = {
    ":red_circle:": "🔴",
    ":large_orange_circle:": "🟠",
    ":large_blue_circle:": "🔵",
    ":white_check_mark:": "✅",
    ":repeat:": "🔁",
    ":warning:": "⚠️",
    ":information_source:": "ℹ️",
}
PANE_WIDTH = 100
_LINK = re.compile(r"<(https?://[^|>]+)\|([^>]+)>")


def _mrkdwn(text: str) -> str:
    """Slack mrkdwn as plain text: links as ``label (url)``, emoji drawn, escapes undone."""
    for code, glyph in EMOJI.items():
        text = text.replace(code, glyph)
    text = _LINK.sub(r"\2 (\1)", text)
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def _block_lines(block: dict[str, Any]) -> list[str]:
    kind = block.get("type")
    if kind == "header":
        return [str(block["text"]["text"]).upper(), ""]
    if kind == "section":
        return _mrkdwn(str(block["text"]["text"])).splitlines()
    if kind == "actions":
        return [f"[ {e['text']['text']} ] → {e.get('url', '')}" for e in block.get("elements", [])]
    if kind == "context":
        return [" · ".join(_mrkdwn(str(e.get("text", ""))) for e in block.get("elements", []))]
    return [f"({kind} block)"]


def _wrap(line: str) -> list[str]:
    # As a Slack pane of about a hundred columns wraps text; a button stays on one line.
    if line.startswith("[ "):
        return [line]
    return textwrap.wrap(line, PANE_WIDTH, break_long_words=False) or [""]


def render_for_terminal(message: PostedMessage, parent: PostedMessage | None = None) -> str:
    """One message as a Slack client shows it, framed; a reply names the thread it sits in."""
    when = datetime.fromtimestamp(float(message.ts), UTC) if message.ts else datetime.now(UTC)
    channel = message.body.get("channel", "webhook")
    head = f"Slack {channel} · diagnoser APP · {when:%H:%M:%S} · ts {message.ts}"
    if message.via == "update":
        head = f"Slack {channel} · diagnoser APP · {datetime.now(UTC):%H:%M:%S} · edited ts {message.ts}"
    if message.thread_ts:
        first = parent.text.splitlines()[0][:70] if parent else ""
        head += f"\n↳ reply in thread {message.thread_ts} ({_mrkdwn(first)})"
    lines_in: list[str] = []
    for block in message.blocks:
        lines_in += _block_lines(block)
    if not lines_in:
        lines_in = _mrkdwn(message.text).splitlines()
    body = [part for line in lines_in for part in _wrap(line)]
    width = max(len(line) for line in [*head.splitlines(), *body])
    rule = "─" * min(width + 2, PANE_WIDTH + 2)
    lines = [f"┌{rule}", *(f"│ {line}" for line in head.splitlines()), f"├{rule}"]
    lines += [f"│ {line}" for line in body]
    return "\n".join([*lines, f"└{rule}"])


class SlackSink(SlackFixtureServer):
    """The Slack stand-in, plus a printer thread (and an optional forward to a real webhook)."""

    def __init__(self, print_message: Callable[[str], None], forward_url: str | None = None) -> None:
        super().__init__(token="xoxb-demo-local-sink")
        self.print_message = print_message
        self.forward_url = forward_url if forward_url is not None else os.environ.get("SLACK_WEBHOOK_URL")
        self._arrived: queue.Queue[PostedMessage | None] = queue.Queue()
        self._printer: threading.Thread | None = None

    def start(self) -> SlackSink:
        super().start()
        if self._printer is None:
            self._printer = threading.Thread(target=self._print_loop, name="slack-sink-printer", daemon=True)
            self._printer.start()
        return self

    def stop(self) -> None:
        super().stop()
        if self._printer is not None:
            self._arrived.put(None)
            self._printer.join(timeout=10)
            self._printer = None

    def __enter__(self) -> SlackSink:
        return self.start()

    def _post_message(self, headers: dict[str, str], raw: bytes) -> tuple[int, dict[str, str], bytes]:
        before = len(self.messages)
        answer = super()._post_message(headers, raw)
        for message in self.messages[before:]:
            self._arrived.put(message)
        return answer

    def _update_message(self, headers: dict[str, str], raw: bytes) -> tuple[int, dict[str, str], bytes]:
        before = len(self.updates)
        answer = super()._update_message(headers, raw)
        for message in self.updates[before:]:
            self._arrived.put(message)
        return answer

    def wait_for(
        self, matches: Callable[[PostedMessage], bool], timeout_s: float, *, edits: bool = False
    ) -> PostedMessage | None:
        """The first accepted message (or edit, with ``edits``) that ``matches``, waiting up to
        ``timeout_s`` for it."""
        deadline = time.monotonic() + timeout_s
        while True:
            seen = list(self.messages)
            if edits:
                seen = sorted([*seen, *self.updates], key=lambda m: m.at)
            found = next((m for m in seen if matches(m)), None)
            if found is not None or time.monotonic() >= deadline:
                return found
            time.sleep(0.2)

    def counts(self) -> tuple[int, int, int]:
        """``(top-level messages, thread replies, edits)`` so far."""
        top = len(self.top_level())
        return top, len(self.messages) - top, len(self.updates)

    def channel_view(self) -> str:
        """The channel as it reads now: each top-level message as last edited, its replies under it."""
        parts = []
        for message in self.top_level():
            body = {**message.body, **self.current(message.ts)}
            shown = PostedMessage("api", body, message.ts, message.channel)
            parts.append(render_for_terminal(shown))
            for reply in self.replies(message.ts):
                box = render_for_terminal(reply, message)
                parts.append("\n".join("      " + line for line in box.splitlines()))
        return "\n".join(parts)

    def _print_loop(self) -> None:
        while (message := self._arrived.get()) is not None:
            parent = next((m for m in list(self.messages) if m.ts == message.thread_ts), None)
            self.print_message(render_for_terminal(message, parent))
            if self.forward_url and message.via != "update":
                self._forward(message, parent)

    def _forward(self, message: PostedMessage, parent: PostedMessage | None) -> None:
        from slack_sdk.webhook import WebhookClient

        text = message.text
        if parent is not None:
            text = f"(in reply to: {parent.text.splitlines()[0][:80]}) {text}"
        try:
            reply = WebhookClient(self.forward_url or "", timeout=10).send(text=text, blocks=message.blocks)
            if reply.status_code != 200:
                self.print_message(f"(SLACK_WEBHOOK_URL answered {reply.status_code} {reply.body})")
        except Exception as exc:  # a real Slack that is unreachable must not stop the demo
            self.print_message(f"(SLACK_WEBHOOK_URL not reached: {type(exc).__name__})")
