"""Where a receiver may send: the address rule and the redirect rule every receiver obeys.

A receiver's URL comes from configuration, but where it ends up does not: a name may resolve to
a private or a cloud metadata address (now, or later), and an answer may redirect elsewhere. So
every receiver that POSTs (the JSON webhook, PagerDuty, Slack) sends through the same two rules:

- **addresses**: the URL's address and every address its name resolves to, at each connection
  (:class:`AddressGuard`), must be public unless ``allowed_addresses`` lists it or its network;
  a cloud metadata or link-local address needs itself listed
  (:func:`~diagnoser.config.addresses.outbound_refusal`, the probe's rule);
- **redirects** (301, 302, 303, 307, 308): not followed unless ``follow_redirects`` is set, and
  then only on the same host (``http`` to ``https`` allowed, never back), the payload POSTed
  again, at most :data:`MAX_REDIRECTS` times; one not followed is a refusal (dead-lettered, never
  counted as sent).

Errors name the receiver's origin only (``https://hooks.example``): a URL's path and query may be
its secret. ::

    poster = GuardedPoster("https://hooks.example/x", error=WebhookSendError, what="webhook")
    answer = await poster.post({"text": "hello"})   # the final answer, never a redirect
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urljoin, urlsplit

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import ThreadedResolver

from diagnoser.config.addresses import IPNetwork, literal_refusal, outbound_refusal, parse_networks
from diagnoser.errors import SendError
from diagnoser.notify.sender import HttpAnswer, post_json

__all__ = [
    "MAX_REDIRECTS",
    "REDIRECTS",
    "AddressGuard",
    "GuardedPoster",
    "literal_refusal",
    "origin",
    "redirect_refusal",
]

#: Redirects followed per message, with ``follow_redirects``.
MAX_REDIRECTS = 3
#: The statuses that point elsewhere.
REDIRECTS = frozenset({301, 302, 303, 307, 308})


class AddressGuard(AbstractResolver):
    """aiohttp's resolver, refusing a name when any address it resolves to is not allowed.

    Every address, not only the first: a name that answers with a public address and a
    private one would otherwise reach the private one on a retry or a reconnect.
    """

    def __init__(self, allowed: list[IPNetwork]) -> None:
        self.allowed = allowed
        self._resolver = ThreadedResolver()
        #: The last refusal, for the error the sender raises.
        self.refused: str | None = None

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self._resolver.resolve(host, port, family)
        for result in results:
            refusal = outbound_refusal(result["host"], self.allowed)
            if refusal is not None:
                self.refused = f"{host!r} resolves to {refusal}"
                raise OSError(self.refused)  # aiohttp reports it as a failed name lookup
        return results

    async def close(self) -> None:
        await self._resolver.close()


def origin(url: str) -> str:
    """``scheme://host[:port]`` of ``url``: how errors name a receiver (its path may be its secret)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        host = f"[{host}]" if ":" in host else host
        return f"{parts.scheme}://{host}" + (f":{parts.port}" if parts.port else "")
    except ValueError:
        return "an unparsable URL"


def redirect_refusal(url: str, status: int, location: str | None, *, follow: bool) -> tuple[str, str | None]:
    """Where a redirect from ``url`` leads and, when it may not be followed, why (else ``None``)."""
    target = urljoin(url, location or "")
    where = origin(target) if location else "nowhere (no Location)"
    said = f"{origin(url)} answered HTTP {status}, a redirect to {where}:"
    if not follow:
        return target, f"{said} not followed (set follow_redirects, or give the final URL)"
    before, after = urlsplit(url), urlsplit(target)
    same_host = (before.hostname or "").lower() == (after.hostname or "").lower()
    downgrade = before.scheme == "https" and after.scheme != "https"
    if not location or not same_host or downgrade or after.scheme not in ("http", "https"):
        return target, f"{said} refused (only the same host, and never from https to http)"
    return target, None


class GuardedPoster:
    """POSTs JSON to one URL under the address and redirect rules (see the module docstring).

    ``error`` is the receiver's :class:`~diagnoser.errors.SendError`; ``what`` names it in errors
    (``webhook``, ``PagerDuty``).
    """

    def __init__(
        self,
        url: str,
        *,
        error: type[SendError],
        what: str,
        timeout_s: float = 10.0,
        headers: Mapping[str, str] | None = None,
        follow_redirects: bool = False,
        allowed_addresses: Sequence[str] = (),
        keep: int = 500,
    ) -> None:
        self.url = url
        self.error = error
        self.what = what
        self.timeout_s = timeout_s
        self.headers = dict(headers or {})
        self.follow_redirects = follow_redirects
        self.allowed = parse_networks(allowed_addresses)
        self.keep = keep

    async def post(self, body: Any) -> HttpAnswer:
        """The answer of the URL (or of where it may redirect to); a refusal raises ``error``."""
        url = self.url
        for _ in range(MAX_REDIRECTS + 1):
            answer = await self._post(url, body)
            if answer.status not in REDIRECTS:
                return answer
            url, refusal = redirect_refusal(url, answer.status, answer.location, follow=self.follow_redirects)
            if refusal is not None:
                raise self.error(
                    f"the {self.what} at {refusal}", permanent=True, error=f"http_{answer.status}"
                )
        raise self.error(
            f"the {self.what} at {origin(self.url)} redirected more than {MAX_REDIRECTS} times",
            permanent=True,
            error="too_many_redirects",
        )

    def hidden(self, text: str, url: str | None = None) -> str:
        """``text`` with the receiver's URLs (and their paths) replaced by their origins."""
        for known in {url or self.url, self.url}:
            parts = urlsplit(known)
            secret_part = parts.path + (f"?{parts.query}" if parts.query else "")
            text = text.replace(known, origin(known))
            if secret_part.strip("/"):
                text = text.replace(secret_part, "/***")
        return text

    async def _post(self, url: str, body: Any) -> HttpAnswer:
        """One POST to ``url``, its address checked; every error naming the origin only."""
        refusal = literal_refusal(url, self.allowed)
        if refusal is not None:
            raise self.error(f"{self.what} refused: {refusal}", permanent=True, error="address_refused")
        guard = AddressGuard(self.allowed)
        try:
            return await post_json(
                url, body, timeout_s=self.timeout_s, error=self.error, what=self.what, keep=self.keep,
                follow_redirects=False, headers=self.headers, resolver=guard,
            )  # fmt: skip
        except SendError as exc:
            if guard.refused is not None:
                raise self.error(
                    f"{self.what} refused: {guard.refused}", permanent=True, error="address_refused"
                ) from exc
            raise self.error(
                self.hidden(str(exc), url), permanent=exc.permanent, error=exc.error, in_doubt=exc.in_doubt
            ) from exc
