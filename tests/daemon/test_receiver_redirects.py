"""Every receiver obeys the webhook's redirect and address rules (:mod:`diagnoser.notify.outbound`).

PagerDuty and Slack (bot token and incoming webhook) POST to the same real local HTTP receiver
as the webhook's tests (:func:`tests.daemon.test_webhook_safety.receiver`), which answers each
redirect code: a redirect is a refusal, never followed (PagerDuty: unless ``follow_redirects``,
then the same host only); PagerDuty's ``events_url`` and Slack's ``base_url`` and
``webhook_url`` are checked at load and where their names resolve, at each connection.
"""

from __future__ import annotations

import socket
import urllib.parse
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError

from diagnoser.config import SlackSettings
from diagnoser.errors import PagerDutySendError, SlackSendError
from diagnoser.notify.receivers.pagerduty import PagerDutyConfig, PagerDutyEvent, PagerDutyReceiver
from diagnoser.notify.receivers.slack import SlackReceiverConfig
from diagnoser.notify.slack import SlackMessage
from diagnoser.notify.slack_sender import SlackSender
from tests.daemon.test_webhook_safety import LOOPBACK, Receiver, receiver
from tests.fixtures.slack_server import SlackFixtureServer

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
                                    base_url=f"{receiver.url}/redirect/{code}/", allowed_addresses=LOOPBACK))  # fmt: skip
    with pytest.raises(SlackSendError, match=f"HTTP {code}, a redirect to .*not followed") as caught:
        await web.post(SlackMessage("pool exhausted"), marker="dgn-1")
    assert caught.value.permanent and caught.value.error == f"http_{code}"
    hook = SlackSender(SlackSettings(webhook_url=SecretStr(f"{receiver.url}/redirect/{code}?to={to}"),
                                     allowed_addresses=LOOPBACK))
    with pytest.raises(SlackSendError, match="not followed") as caught:
        await hook.post(SlackMessage("pool exhausted"))
    assert caught.value.permanent
    assert [method for method, _, _ in receiver.received] == ["POST", "POST"]  # one each, none followed
    assert "/final" not in receiver.paths()


@pytest.mark.parametrize(
    ("keys", "refused"),
    [
        ({"token": "xoxb-1", "channel": "#oncall", "base_url": "http://10.1.2.3/api/"}, "base_url refused: .*private"),
        ({"webhook_url": "http://127.0.0.1:9/services/T/B/x"}, "webhook_url refused: .*loopback"),
        ({"webhook_url": "http://169.254.169.254/x", "allowed_addresses": ["169.254.0.0/16"]}, "cloud metadata"),
        ({"token": "xoxb-1", "channel": "#oncall", "base_url": "http://10.1.2.3/api/",
          "allowed_addresses": ["10.0.0.0/8"]}, None),
        ({"webhook_url": "http://127.0.0.1:9/services/T/B/x", "allowed_addresses": ["127.0.0.1"]}, None),
    ],
)
def test_slack_urls_are_checked_at_load(keys: dict[str, Any], refused: str | None) -> None:
    # Both spellings: the receiver (notify.receivers) and the older slack.* section.
    for validate in (lambda: SlackReceiverConfig.model_validate({"name": "oncall", "type": "slack", **keys}),
                     lambda: SlackSettings.model_validate(keys)):  # fmt: skip
        if refused is None:
            validate()
            continue
        with pytest.raises(ValidationError, match=refused) as caught:
            validate()
        assert "services/T/B" not in caught.value.errors()[0]["msg"]  # a webhook's path is its secret


@pytest.fixture
def stand_in_name(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """Names the resolver answers as this dict says (``hooks.slack-relay.example``: whatever a test
    puts there); any other name goes to the system's resolver. Nothing leaves 127.0.0.1."""
    answers: dict[str, list[str]] = {}
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host not in answers:
            return real(host, port, *args, **kwargs)
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (a, int(port or 0)))
                for a in answers[host]]  # fmt: skip

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return answers


async def test_slack_refuses_at_connect_a_name_resolving_to_a_private_address(
    receiver: Receiver, stand_in_name: dict[str, list[str]]
) -> None:
    name = "hooks.slack-relay.example"
    port = receiver.http.port
    # Only loopback answers: were the check missing, the attempt would still stay on this host
    # (the receiver would record it), never reach a private network.
    stand_in_name[name] = ["127.0.0.1"]
    web = SlackSender(SlackSettings(token=SecretStr("xoxb-1"), channel="C0123ABCD", base_url=f"http://{name}:{port}/api/"))
    with pytest.raises(SlackSendError, match=rf"Slack refused: '{name}' resolves to 127.0.0.1 is a loopback") as caught:
        await web.post(SlackMessage("pool exhausted"), marker="dgn-1")
    assert caught.value.permanent and caught.value.error == "address_refused"
    # A listed network does not open another: 127.0.0.2 is not in 127.0.0.1/32.
    stand_in_name[name] = ["127.0.0.2"]
    hook = SlackSender(SlackSettings(webhook_url=SecretStr(f"http://{name}:{port}/services/T/B/SECRETPATH"),
                                     allowed_addresses=["127.0.0.1"]))
    with pytest.raises(SlackSendError, match="loopback") as caught:
        await hook.post(SlackMessage("pool exhausted"))
    assert caught.value.permanent and caught.value.error == "address_refused"
    assert "SECRETPATH" not in str(caught.value)
    for door in (web, hook):  # edits and read-back connect through the same guard
        if door.capabilities.update:
            with pytest.raises(SlackSendError, match=r"resolves to 127\.0\.0\.2 is a loopback"):
                await door.update(SlackMessage("edited"), ts="1.2", channel="C0123ABCD")
    assert receiver.received == []  # nothing sent


async def test_slack_reaches_a_listed_address_and_a_name_resolving_to_one(
    slack: SlackFixtureServer, stand_in_name: dict[str, list[str]]
) -> None:
    name = "hooks.slack-relay.example"
    stand_in_name[name] = ["127.0.0.1"]
    for url in (slack.webhook_url, slack.webhook_url.replace("127.0.0.1", name)):
        hook = SlackSender(SlackSettings(webhook_url=SecretStr(url), allowed_addresses=["127.0.0.1"]))
        await hook.post(SlackMessage("pool exhausted"))
    web = SlackSender(SlackSettings(token=SecretStr(slack.token), channel="#oncall", allowed_addresses=["127.0.0.0/8"],
                                    base_url=slack.api_url.replace("127.0.0.1", name)))  # fmt: skip
    await web.post(SlackMessage("pool exhausted"), marker="dgn-1")
    assert [m.text for m in slack.messages] == ["pool exhausted"] * 3
