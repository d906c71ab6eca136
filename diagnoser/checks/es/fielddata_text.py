"""``es: {check: fielddata_text}``: fielddata loaded on a ``text`` field, every term of it on the heap.

Reads ``GET _cat/fielddata`` in bytes and, for the fields holding ``min_fielddata_bytes`` or more
on a node, their mappings (``GET _mapping/field/...``): holds for each node and field that is
mapped ``text`` in some index (a keyword field's fielddata is the normal doc-values case).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from diagnoser.checks.es.base import SOURCE, EsCheckParams, api_source
from diagnoser.checks.registry import CheckContext, CheckResult, check_kind
from diagnoser.models import Evidence, SourceError

__all__ = ["FielddataTextParams", "fielddata_text"]


class FielddataTextParams(EsCheckParams):
    check = "fielddata_text"

    min_fielddata_bytes: int = Field(default=10 * 1024 * 1024, ge=0)


@check_kind("es.fielddata_text", params=FielddataTextParams, reads={"elasticsearch"})
async def fielddata_text(params: FielddataTextParams, ctx: CheckContext) -> CheckResult:
    """One row per node and text field holding at least ``min_fielddata_bytes``, largest first."""
    source = api_source(ctx)
    rows = await source.cat_fielddata()
    if isinstance(rows, SourceError):
        return rows
    sized = _large_fields(rows, params.min_fielddata_bytes)
    if not sized:
        return []
    mappings = await source.field_mappings(sorted({field for _, field, _ in sized}))
    if isinstance(mappings, SourceError):
        return mappings
    evidence = []
    for node, field, size in sorted(sized, key=lambda r: -r[2]):
        text_indices = sorted(index for index, kind, _ in mappings.get(field, []) if kind == "text")
        if not text_indices:
            continue
        evidence.append(
            Evidence(
                source=SOURCE,
                query="GET _cat/fielddata?bytes=b + GET _mapping/field/" + field,
                labels={"node": node, "field": field, "indices": ",".join(text_indices)},
                value=size,
                threshold=float(params.min_fielddata_bytes),
                detail=(
                    f"{node} holds {size / 1024**2:.0f} MiB of fielddata for '{field}', a text field "
                    f"in {', '.join(text_indices)}"
                ),
            )
        )
    return evidence


def _large_fields(rows: list[dict[str, Any]], min_bytes: int) -> list[tuple[str, str, float]]:
    """``(node, field, bytes)`` of the fielddata rows at or over ``min_bytes``."""
    sized: list[tuple[str, str, float]] = []
    for row in rows:
        try:
            size = float(row.get("size") or 0)
        except (TypeError, ValueError):
            continue
        if size >= min_bytes and row.get("field"):
            sized.append((str(row.get("node", "")), str(row["field"]), size))
    return sized
