"""The JSON webhook's sender, kept importable here: it lives in :mod:`diagnoser.notify.receivers.webhook`."""

from __future__ import annotations

from diagnoser.notify.receivers.webhook import JsonWebhookSender

__all__ = ["JsonWebhookSender"]
