"""Instants on the command line: RFC 3339 (``2026-11-29T20:00:00Z``) or unix seconds."""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["parse_instant"]


def parse_instant(text: str) -> datetime:
    """Parse ``text`` as unix seconds or RFC 3339; naive times are UTC. Raises ValueError."""
    value = text.strip()
    try:
        return datetime.fromtimestamp(float(value), UTC)
    except ValueError:
        pass
    except (OverflowError, OSError) as exc:
        raise ValueError(f"{text!r} is out of range for a unix time") from exc
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError as exc:
        raise ValueError(f"{text!r} is neither RFC 3339 (2026-11-29T20:00:00Z) nor unix seconds") from exc
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)
