"""The ``diagnose`` command line: one module per command, all registered on one Typer app.

    diagnose now --prometheus-url http://prometheus:9090            # what is wrong right now
    diagnose now --at 2026-11-29T20:00:00Z --format markdown         # post-incident, as of then
    diagnose rules list | lint | test FILE... | export --recording   # the rule pack
    diagnose probe URL --rate 50 --duration 30                       # an open-loop probe
    diagnose capacity URL --slo-p99-ms 50 --prometheus-url URL       # the rate that holds the SLO
    diagnose verify URL --rate 95 --slo-p99-ms 300                   # is a fix confirmed at that load
    diagnose serve --config diagnoser.yaml                           # the always-on daemon
    diagnose signals --prometheus-url URL                            # what the rules will find there
    diagnose worker --coordinator HOST:PORT                          # a capacity run's worker (pod)
"""

from __future__ import annotations

from diagnoser.cli import capacity, now, probe, rules, serve, signals, verify, worker
from diagnoser.cli.app import app

__all__ = ["app", "main"]

# Importing a command's module registers it; the names keep the imports visibly used.
_COMMANDS = (now, rules, probe, capacity, serve, signals, verify, worker)


def main() -> None:
    """Console-script entry point."""
    app()
