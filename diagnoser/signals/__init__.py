"""Named signals (``pool.used``, ``http.server.duration``) resolved against every naming convention.

See :mod:`diagnoser.signals.catalogue` for the catalogue and :mod:`diagnoser.signals.expand` for
how a rule's query becomes PromQL per convention.
"""

from __future__ import annotations

from diagnoser.signals.catalogue import Catalogue, Convention, Form, SignalDef, load_catalogue
from diagnoser.signals.expand import Expansion, expansions, normalise_labels, references, validate_template

__all__ = [
    "Catalogue",
    "Convention",
    "Expansion",
    "Form",
    "SignalDef",
    "expansions",
    "load_catalogue",
    "normalise_labels",
    "references",
    "validate_template",
]
