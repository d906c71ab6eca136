"""The demo's before/after picture: p99 against the offered rate for both capacity searches.

``diagnose capacity --plot`` draws one run; the demo's point is the difference between two (the
pool as it was, the pool Little's law asked for), so both go on one pair of axes with the SLO
line and each run's capacity. matplotlib on its Agg backend, as the command's own plot.
"""

from __future__ import annotations

from pathlib import Path

from diagnoser.capacity.report import CapacityReport

__all__ = ["write_before_after"]


def write_before_after(runs: list[tuple[str, CapacityReport]], path: Path) -> None:
    """Draw each ``(label, report)`` as one p99 curve, failing steps crossed, to ``path`` (.svg/.png)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 3.6))
    try:
        for (label, report), color in zip(runs, ("tab:red", "tab:green"), strict=False):
            steps = sorted(
                (s for s in report.steps if s.counted and s.latency_ms.p99 is not None), key=lambda s: s.rate
            )
            axes.plot([s.rate for s in steps], [s.latency_ms.p99 or 0.0 for s in steps], marker="o",
                      color=color, label=f"p99, {label}")  # fmt: skip
            failed = [s for s in steps if not s.held]
            axes.scatter([s.rate for s in failed], [s.latency_ms.p99 or 0.0 for s in failed], marker="x",
                         s=70, color="black", zorder=3)  # fmt: skip
            if report.capacity_rps is not None:
                axes.axvline(report.capacity_rps, color=color, linestyle="-.", alpha=0.7,
                             label=f"capacity {report.capacity_rps:g} req/s")  # fmt: skip
        slo = runs[0][1].slo.p99_ms
        axes.axhline(slo, color="grey", linestyle=":", label=f"SLO p99 {slo:g} ms")
        axes.set_yscale("log")
        axes.set_xlabel("offered rate (req/s), open loop; x = step over the SLO")
        axes.set_ylabel("p99 from intended send (ms)")
        axes.set_title("diagnose capacity before and after raising the pool", fontsize=10)
        axes.grid(True, which="both", alpha=0.3)
        axes.legend(fontsize=8, loc="upper left")
        figure.tight_layout()
        figure.savefig(path, format=path.suffix.lstrip(".").lower(), dpi=80)
    finally:
        plt.close(figure)
