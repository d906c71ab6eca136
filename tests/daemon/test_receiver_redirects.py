"""Every receiver obeys the webhook's redirect and address rules (:mod:`diagnoser.notify.outbound`).

PagerDuty and Slack (bot token and incoming webhook) POST to the same real local HTTP receiver
as the webhook's tests (:func:`tests.daemon.test_webhook_safety.receiver`), which answers each
redirect code: a redirect is a refusal, never followed (PagerDuty: unless ``follow_redirects``,
then the same host only); PagerDuty's ``events_url`` is checked at load and where its name
resolves, at each send.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError

from diagnoser.config import SlackSettings
from diagnoser.errors import PagerDutySendError, SlackSendError
from diagnoser.notify.receivers.pagerduty import PagerDutyConfig, PagerDutyEvent, PagerDutyReceiver
from diagnoser.notify.slack import SlackMessage
from diagnoser.notify.slack_sender import SlackSender
from tests.daemon.test_webhook_safety import LOOPBACK, Receiver, receiver

__all__ = ["receiver"]  # the fixture, shared

EVENT = PagerDutyEvent("trigger", "diagnoser-1-1000", summary="pool exhausted", severity="critical")


def pagerduty(url: str, **extra: Any) -> PagerDutyReceiver:
    extra.setdefault("allowed_addresses", LOOPBACK)
    config = PagerDutyConfig.model_validate(
        {"name": "pager", "type": "pagerduty", "routing_key": "R" * 32, "events_url": url,
         "messages_per_s": 50, "message_burst": 50, **extra}
    )  # fmt: skip
    return PagerDutyReceiver(config)


@pytest.mark.parametrize("code", [302, 307])
async def test_pagerduty_refuses_a_redirect_unless_told_and_then_only_on_its_host(
    receiver: Receiver, code: int
) -> None:
    with pytest.raises(PagerDutySendError, match="not followed") as caught:
        await pagerduty(f"{receiver.url}/redirect/{code}?to=/final").post(EVENT)
    assert caught.value.permanent and caught.value.error == f"http_{code}"
    elsewhere = f"http://localhost:{receiver.http.port}/final"  # another host name, same server
    follows = pagerduty(
        f"{receiver.url}/redirect/{code}?to={urllib.parse.quote(elsewhere)}", follow_redirects=True
    )
    with pytest.raises(PagerDutySendError, match="only the same host"):
        await follows.post(EVENT)
    assert "/final" not in receiver.paths()  # nothing re-sent, the routing key included
    await pagerduty(f"{receiver.url}/redirect/{code}?to=/final", follow_redirects=True).post(EVENT)
    method, path, body = receiver.received[-1]
    assert (method, path) == ("POST", "/final") and body is not None and body["dedup_key"] == EVENT.dedup_key


async def test_pagerduty_events_url_is_checked_at_load_and_where_it_resolves(receiver: Receiver) -> None:
    with pytest.raises(ValidationError, match=r"PagerDuty events URL refused: .*loopback"):
        pagerduty(f"{receiver.url}/v2/enqueue", allowed_addresses=[])
    with pytest.raises(ValidationError, match="cloud metadata"):
        pagerduty("http://169.254.169.254/v2/enqueue", allowed_addresses=["169.254.0.0/16"])
    named = pagerduty(f"http://localhost:{receiver.http.port}/v2/enqueue", allowed_addresses=[])
    with pytest.raises(PagerDutySendError, match=r"resolves to .* loopback") as caught:
        await named.post(EVENT)
    assert caught.value.error == "address_refused" and caught.value.permanent
    assert receiver.received == []


@pytest.mark.parametrize("code", [301, 302, 307, 308])
async def test_slack_refuses_a_redirect_and_sends_nothing_where_it_points(
    receiver: Receiver, code: int
) -> None:
    to = urllib.parse.quote("http://169.254.169.254/latest/")
    web = SlackSender(SlackSettings(token=SecretStr("xoxb-1"), channel="C0123ABCD",
                                    base_url=f"{receiver.url}/redirect/{code}/"))  # fmt: skip
    with pytest.raises(SlackSendError, match=f"HTTP {code}, a redirect to .*not followed") as caught:
        await web.post(SlackMessage("pool exhausted"), marker="dgn-1")
    assert caught.value.permanent and caught.value.error == f"http_{code}"
    hook = SlackSender(SlackSettings(webhook_url=SecretStr(f"{receiver.url}/redirect/{code}?to={to}")))
    with pytest.raises(SlackSendError, match="not followed") as caught:
        await hook.post(SlackMessage("pool exhausted"))
    assert caught.value.permanent
    assert [method for method, _, _ in receiver.received] == ["POST", "POST"]  # one each, none followed
    assert "/final" not in receiver.paths()
