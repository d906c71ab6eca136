"""The Slack receiver (``type: slack``): Block Kit messages, threads, edits and read-back.

Its renderer is :func:`~diagnoser.notify.outbox.render_entry` (an incident's own message, a
digest, an alert's report) and :func:`~diagnoser.notify.outbox.render_reply` (a change in the
incident's thread), pure functions to :class:`~diagnoser.notify.slack.SlackMessage`; sending is
:class:`~diagnoser.notify.slack_sender.SlackSender` (a bot token and a channel, or an incoming
webhook). ::

    notify:
      receivers:
        - {name: oncall, type: slack, token: xoxb-..., channel: "#oncall"}
"""

from __future__ import annotations

from pydantic import SecretStr, field_validator, model_validator

from diagnoser.config import SlackSettings
from diagnoser.config.sections import slack_api_url, slack_url_refusal
from diagnoser.notify.outbox import OutboxEntry, render_entry, render_reply
from diagnoser.notify.receivers import AddressConfig, receiver_type
from diagnoser.notify.slack import SlackMessage
from diagnoser.notify.slack_sender import SlackSender

__all__ = ["SlackReceiver", "SlackReceiverConfig"]


class SlackReceiverConfig(AddressConfig):
    """A bot token and a channel (threads, edits, exactly-once), or an incoming webhook.

    ``base_url`` and ``webhook_url`` obey every receiver's address rule: an address or a name
    resolving to one that is not public needs ``allowed_addresses`` (a Slack stand-in, a proxy).
    """

    webhook_url: SecretStr | None = None
    token: SecretStr | None = None
    channel: str | None = None
    base_url: str = "https://slack.com/api/"

    @field_validator("base_url")
    @classmethod
    def _api_url(cls, value: str) -> str:
        return slack_api_url(value)

    @model_validator(mode="after")
    def _addresses_allowed(self) -> SlackReceiverConfig:
        refusal = slack_url_refusal(self.base_url, self.webhook_url, self.allowed_addresses)
        if refusal is not None:
            raise ValueError(refusal)
        return self

    def slack_settings(self) -> SlackSettings:
        """The settings the Slack sender takes."""
        return SlackSettings(
            webhook_url=self.webhook_url,
            token=self.token,
            channel=self.channel,
            base_url=self.base_url,
            timeout_s=self.timeout_s,
            messages_per_s=self.messages_per_s,
            message_burst=self.message_burst,
            allowed_addresses=self.allowed_addresses,
        )


@receiver_type("slack", config=SlackReceiverConfig)
class SlackReceiver(SlackSender):
    """A :class:`SlackSender` with its name and its renderers."""

    def __init__(self, config: SlackReceiverConfig) -> None:
        if config.token is None and config.webhook_url is None:
            raise ValueError("a Slack receiver needs token and channel, or webhook_url")
        super().__init__(config.slack_settings())
        self.name = config.name

    def render(self, entry: OutboxEntry) -> SlackMessage | None:
        return render_entry(entry)

    def render_reply(self, entry: OutboxEntry) -> SlackMessage | None:
        return render_reply(entry)

    def plain(self, message: SlackMessage) -> SlackMessage:
        return SlackMessage(message.text)
