"""The Slack sender over real HTTP against the fixture server: both doors, every failure mode."""

from __future__ import annotations

import time

import pytest
from pydantic import SecretStr

from diagnoser.config import SlackSettings
from diagnoser.notify.slack import SlackMessage
from diagnoser.notify.slack_sender import SlackSender, SlackSendError
from tests.fixtures.slack_server import CHANNEL_ID, SlackFixtureServer

#: The fixture's addresses: a Slack stand-in on the loopback is listed, as it must be.
LOOPBACK = ["127.0.0.1"]
MESSAGE = SlackMessage("pool exhausted", [{"type": "section", "text": {"type": "mrkdwn", "text": "*pool*"}}])


def bot(slack: SlackFixtureServer, **extra: object) -> SlackSender:
    values: dict[str, object] = {"token": SecretStr(slack.token), "channel": "#oncall", "base_url": slack.api_url,
                                 "allowed_addresses": LOOPBACK}  # fmt: skip
    return SlackSender(SlackSettings.model_validate(values | extra))


def webhook(slack: SlackFixtureServer) -> SlackSender:
    return SlackSender(SlackSettings(webhook_url=SecretStr(slack.webhook_url), allowed_addresses=LOOPBACK))


async def test_bot_token_posts_and_threads(slack: SlackFixtureServer) -> None:
    sender = bot(slack)
    first = await sender.post(MESSAGE)
    assert first.channel == CHANNEL_ID
    assert first.ts is not None and first.ts.endswith(".000101")
    reply = await sender.post(SlackMessage("resolved"), thread_ts=first.ts)
    assert reply.ts != first.ts
    assert [m.thread_ts for m in slack.messages] == [None, first.ts]
    assert slack.messages[0].blocks == MESSAGE.blocks
    assert slack.messages[0].body["unfurl_links"] is False


async def test_webhook_posts_without_threads(slack: SlackFixtureServer) -> None:
    sender = webhook(slack)
    assert not sender.threads
    delivery = await sender.post(MESSAGE)
    assert (delivery.channel, delivery.ts) == (None, None)
    assert slack.messages[0].via == "webhook"
    assert sender.target == "an incoming webhook"  # never the secret URL


@pytest.mark.parametrize("door", ["bot", "webhook"])
async def test_429_is_reported_with_retry_after_without_sleeping_or_resending(
    slack: SlackFixtureServer, door: str
) -> None:
    sender = bot(slack) if door == "bot" else webhook(slack)
    slack.ratelimit(1, retry_after_s=20)
    started = time.monotonic()
    with pytest.raises(SlackSendError) as caught:
        await sender.post(MESSAGE)
    assert time.monotonic() - started < 5  # the caller reschedules; nothing waits 20 s here
    assert caught.value.retry_after == 20
    assert not caught.value.permanent and not caught.value.in_doubt
    assert [status for _, status in slack.requests] == [429]
    await sender.post(MESSAGE)
    assert len(slack.messages) == 1


@pytest.mark.parametrize("door", ["bot", "webhook"])
async def test_500_and_down_are_transient(slack: SlackFixtureServer, door: str) -> None:
    sender = bot(slack) if door == "bot" else webhook(slack)
    slack.fail()
    with pytest.raises(SlackSendError) as caught:
        await sender.post(MESSAGE)
    assert not caught.value.permanent
    assert caught.value.in_doubt  # a 5xx may come after the message was processed
    assert "500" in str(caught.value)
    slack.down()
    with pytest.raises(SlackSendError) as caught:
        await sender.post(MESSAGE)
    assert "unreachable" in str(caught.value)
    assert not caught.value.in_doubt  # refused connection: certainly not posted
    slack.set_ok()
    await sender.post(MESSAGE)
    assert len(slack.messages) == 1


async def test_a_wrong_token_is_refused_credentials_and_an_unknown_channel_permanent(
    slack: SlackFixtureServer,
) -> None:
    wrong = bot(slack, token=SecretStr("xoxb-wrong"))
    with pytest.raises(SlackSendError, match="invalid_auth") as caught:
        await wrong.post(MESSAGE)
    # Retried with backoff for dead_letter_after_s (a token being rotated), not dead at once.
    assert caught.value.auth and not caught.value.permanent and caught.value.error == "invalid_auth"
    lost = bot(slack, channel="#nowhere")
    with pytest.raises(SlackSendError, match="channel_not_found") as caught:
        await lost.post(MESSAGE)
    assert caught.value.permanent


async def test_a_late_answer_is_in_doubt_and_found_by_its_marker(slack: SlackFixtureServer) -> None:
    sender = bot(slack, timeout_s=1)
    slack.slow(2.5)
    since = time.time()
    with pytest.raises(SlackSendError) as caught:
        await sender.post(MESSAGE, marker="dgn-7-abc")
    assert caught.value.in_doubt and not caught.value.permanent
    assert len(slack.messages) == 1  # Slack took it; only the answer was late
    found = await sender.find_posted("dgn-7-abc", thread_ts=None, since=since)
    assert found is not None and found.ts == slack.messages[0].ts and found.channel == CHANNEL_ID
    assert await sender.find_posted("dgn-8-def", thread_ts=None, since=since) is None
    # A reply is looked for in its thread.
    reply = await sender.post(SlackMessage("resolved"), thread_ts=found.ts, marker="dgn-9-aaa")
    again = await sender.find_posted("dgn-9-aaa", thread_ts=found.ts, since=since)
    assert again is not None and again.ts == reply.ts


async def test_a_reply_into_a_deleted_thread_is_thread_not_found(slack: SlackFixtureServer) -> None:
    sender = bot(slack)
    first = await sender.post(MESSAGE)
    assert first.ts is not None
    slack.delete(first.ts)
    with pytest.raises(SlackSendError) as caught:
        await sender.post(SlackMessage("resolved"), thread_ts=first.ts)
    assert caught.value.permanent and caught.value.error == "thread_not_found"


async def test_a_refused_payload_is_permanent(slack: SlackFixtureServer) -> None:
    with pytest.raises(SlackSendError) as caught:
        await webhook(slack).post(SlackMessage(""))
    assert caught.value.permanent


def test_not_configured_means_no_sender() -> None:
    assert SlackSender.from_settings(SlackSettings()) is None
    with pytest.raises(SlackSendError, match=r"slack\.channel"):
        SlackSender(SlackSettings(token=SecretStr("xoxb-1")))
