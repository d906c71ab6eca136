"""Which addresses diagnoser may send to: the rules the probe's targets and the webhook receivers share.

An address is *special* when a request to it reads something other than a service: a cloud's
instance-metadata endpoint (credentials), a link-local address, the loopback, the unspecified
address. The probe refuses those unless permitted by the address itself (never by a pattern);
a webhook receiver, which sends what diagnoser knows to wherever its URL points, refuses every
address that is not public as well (private ranges, carrier-grade NAT, reserved) unless
``allowed_addresses`` covers it. ::

    >>> special_kind(ip_address("169.254.169.254"))
    'cloud metadata'
    >>> outbound_refusal("10.1.2.3", [])
    '10.1.2.3 is a private address: list it (or its network) in allowed_addresses'
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from urllib.parse import urlsplit

__all__ = [
    "METADATA_ADDRESSES",
    "IPAddress",
    "IPNetwork",
    "listed_literally",
    "literal_refusal",
    "outbound_refusal",
    "parse_networks",
    "special_kind",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: Cloud instance-metadata endpoints (AWS/GCP/Azure/OpenStack, AWS over IPv6, Alibaba): a request
#: aimed at them reads credentials, not a service.
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200")
)


def _unmapped(ip: IPAddress) -> IPAddress:
    mapped = getattr(ip, "ipv4_mapped", None)
    return mapped if mapped is not None else ip


def special_kind(ip: IPAddress) -> str | None:
    """``cloud metadata``, ``link-local``, ``loopback`` or ``unspecified``; ``None`` for others."""
    ip = _unmapped(ip)
    if ip in METADATA_ADDRESSES:
        return "cloud metadata"
    if ip.is_link_local:
        return "link-local"
    if ip.is_loopback:
        return "loopback"
    if ip.is_unspecified:
        return "unspecified"
    return None


def listed_literally(ip: IPAddress, entries: Iterable[str]) -> bool:
    """Whether one of ``entries`` is ``ip`` itself, written as an address (not a pattern)."""
    for entry in entries:
        try:
            if ipaddress.ip_address(entry.strip().strip("[]")) == ip:
                return True
        except ValueError:  # a name or a pattern
            continue
    return False


def parse_networks(entries: Iterable[str]) -> list[IPNetwork]:
    """``entries`` (addresses or CIDR networks) as networks; ValueError naming the first that is neither."""
    networks = []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry.strip().strip("[]"), strict=False))
        except ValueError:
            raise ValueError(f"{entry!r} is neither an IP address nor a network (10.0.0.0/8)") from None
    return networks


def outbound_refusal(address: str, allowed: Sequence[IPNetwork]) -> str | None:
    """Why a notification may not go to ``address``, or ``None`` when it may.

    A public address may; any other needs a network of ``allowed`` that holds it. A cloud
    metadata or link-local address needs itself listed (a ``/32`` or ``/128``): a private
    range written for in-cluster receivers must never open the metadata endpoint too.
    """
    try:
        ip = _unmapped(ipaddress.ip_address(address.split("%", 1)[0]))
    except ValueError:
        return f"{address!r} is not an IP address"
    kind = special_kind(ip)
    if kind is None and ip.is_global:
        return None
    if kind in ("cloud metadata", "link-local"):
        if any(net.num_addresses == 1 and ip in net for net in allowed):
            return None
        return f"{ip} is a {kind} address: only {ip} itself in allowed_addresses permits it"
    if any(ip.version == net.version and ip in net for net in allowed):
        return None
    return f"{ip} is a {kind or 'private'} address: list it (or its network) in allowed_addresses"


def literal_refusal(url: str, allowed: Sequence[IPNetwork]) -> str | None:
    """Why ``url``'s host, when it is an address, may not be reached (``None``: it may, or it is a
    name, judged where it resolves at each connection)."""
    host = (urlsplit(url).hostname or "").strip("[]")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return None
    return outbound_refusal(host, allowed)
