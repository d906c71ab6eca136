"""The Slack sender over real HTTP against the fixture server: both doors, every failure mode."""

from __future__ import annotations

import time

import pytest
from pydantic import SecretStr

from diagnoser.config import SlackSettings
from diagnoser.notify.slack import SlackMessage
from diagnoser.notify.slack_sender import SlackSender, SlackSendError
from tests.fixtures.slack_server import CHANNEL_ID, SlackFixtureServer

MESSAGE = SlackMessage("pool exhausted", [{"type": "section", "text": {"type": "mrkdwn", "text": "*pool*"}}])


def bot(slack: SlackFixtureServer, **extra: object) -> SlackSender:
    return SlackSender(SlackSettings(token=SecretStr(slack.token), channel="#oncall", base_url=slack.api_url,
                                     **extra))  # type: ignore[arg-type]


def webhook(slack: SlackFixtureServer) -> SlackSender:
    return SlackSender(SlackSettings(webhook_url=SecretStr(slack.webhook_url)))


async def test_bot_token_posts_and_threads(slack: SlackFixtureServer) -> None:
    sender = bot(slack)
    first = await sender.post(MESSAGE)
    assert first.channel == CHANNEL_ID
    assert first.ts == "1700000000.000101"
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
async def test_429_waits_retry_after_then_delivers_once(slack: SlackFixtureServer, door: str) -> None:
    sender = bot(slack) if door == "bot" else webhook(slack)
    slack.ratelimit(1)
    started = time.monotonic()
    await sender.post(MESSAGE)
    assert time.monotonic() - started >= 1.0  # Retry-After: 1
    assert [status for _, status in slack.requests] == [429, 200]
    assert len(slack.messages) == 1


async def test_429_beyond_the_retries_is_a_transient_failure(slack: SlackFixtureServer) -> None:
    sender = bot(slack, rate_limit_retries=0)
    slack.ratelimit(3)
    with pytest.raises(SlackSendError) as caught:
        await sender.post(MESSAGE)
    assert not caught.value.permanent
    assert "ratelimited" in str(caught.value)


@pytest.mark.parametrize("door", ["bot", "webhook"])
async def test_500_and_down_are_transient(slack: SlackFixtureServer, door: str) -> None:
    sender = bot(slack) if door == "bot" else webhook(slack)
    slack.fail()
    with pytest.raises(SlackSendError) as caught:
        await sender.post(MESSAGE)
    assert not caught.value.permanent
    assert "500" in str(caught.value)
    slack.down()
    with pytest.raises(SlackSendError) as caught:
        await sender.post(MESSAGE)
    assert "unreachable" in str(caught.value)
    slack.set_ok()
    await sender.post(MESSAGE)
    assert len(slack.messages) == 1


async def test_wrong_token_and_channel_are_reported_not_dropped(slack: SlackFixtureServer) -> None:
    wrong = SlackSender(SlackSettings(token=SecretStr("xoxb-wrong"), channel="#oncall", base_url=slack.api_url))
    with pytest.raises(SlackSendError, match="invalid_auth") as caught:
        await wrong.post(MESSAGE)
    assert not caught.value.permanent  # fixed by configuration, then the queue drains
    lost = SlackSender(SlackSettings(token=SecretStr(slack.token), channel="#nowhere", base_url=slack.api_url))
    with pytest.raises(SlackSendError, match="channel_not_found"):
        await lost.post(MESSAGE)


async def test_a_refused_payload_is_permanent(slack: SlackFixtureServer) -> None:
    with pytest.raises(SlackSendError) as caught:
        await webhook(slack).post(SlackMessage(""))
    assert caught.value.permanent


def test_not_configured_means_no_sender() -> None:
    assert SlackSender.from_settings(SlackSettings()) is None
    with pytest.raises(SlackSendError, match=r"slack\.channel"):
        SlackSender(SlackSettings(token=SecretStr("xoxb-1")))
