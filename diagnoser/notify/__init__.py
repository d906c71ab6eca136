"""Rendering a diagnosis for people and machines: pure functions, one module per format."""

from __future__ import annotations

from diagnoser.notify.console import render_table
from diagnoser.notify.markdown import render_markdown
from diagnoser.redact import scrub_text

__all__ = ["render_json", "render_markdown", "render_table"]


def render_json(diagnosis: object) -> str:
    """The output contract of ``diagnose now --format json``: one JSON object."""
    from diagnoser.models import Diagnosis

    assert isinstance(diagnosis, Diagnosis)
    return scrub_text(diagnosis.model_dump_json(indent=2))
