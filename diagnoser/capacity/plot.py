"""``--plot FILE``: p99 and p50 against the offered rate, the SLO line and the knee, as SVG or PNG.

Drawn with matplotlib, an optional extra (``pip install 'diagnoser[plot]'``) imported only when
a plot is asked for, on its non-interactive Agg backend so that it works without a display. The
file's extension picks the format.
"""

from __future__ import annotations

from pathlib import Path

from diagnoser.capacity.report import CapacityReport
from diagnoser.errors import ConfigError

__all__ = ["PLOT_FORMATS", "check_plot_path", "write_plot"]

PLOT_FORMATS = {".svg": "svg", ".png": "png"}


def check_plot_path(path: Path) -> str:
    """The format for ``path``; :class:`ConfigError` for another extension or a missing matplotlib.

    Called before any load is sent, so a typo never costs a capacity run.
    """
    fmt = PLOT_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise ConfigError(f"--plot {path}: the file must end in .svg or .png")
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            "--plot needs matplotlib, an optional extra: pip install 'diagnoser[plot]'"
        ) from exc
    if not path.parent.exists():
        raise ConfigError(f"--plot {path}: directory {path.parent} does not exist")
    return fmt


def write_plot(report: CapacityReport, path: Path) -> None:
    """Write the latency-against-rate picture of ``report`` to ``path`` (.svg or .png)."""
    fmt = check_plot_path(path)
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    steps = sorted(
        (s for s in report.steps if s.counted and s.latency_ms.p99 is not None), key=lambda s: s.rate
    )
    rates = [s.rate for s in steps]
    figure, axes = plt.subplots(figsize=(8, 4.5))
    try:
        axes.plot(rates, [s.latency_ms.p99 or 0.0 for s in steps], marker="o", label="p99")
        axes.plot(rates, [s.latency_ms.p50 or 0.0 for s in steps], marker=".", linestyle="--", label="p50")
        failed = [s for s in steps if not s.held]
        if failed:
            axes.scatter(
                [s.rate for s in failed],
                [s.latency_ms.p99 or 0.0 for s in failed],
                marker="x",
                s=80,
                color="red",
                zorder=3,
                label="did not hold",
            )
        axes.axhline(
            report.slo.p99_ms, color="grey", linestyle=":", label=f"SLO p99 {report.slo.p99_ms:g} ms"
        )
        if report.capacity_rps is not None:
            axes.axvline(
                report.capacity_rps,
                color="green",
                linestyle="-.",
                label=f"capacity {report.capacity_rps:g} req/s",
            )
        axes.set_yscale("log")
        axes.set_xlabel("offered rate (req/s)")
        axes.set_ylabel("latency from intended send (ms)")
        title = f"{report.target}: limit {report.limit.value}"
        if report.bottleneck is not None:
            title += f", bottleneck {report.bottleneck.cause}"
        axes.set_title(title, fontsize=9)
        axes.grid(True, which="both", alpha=0.3)
        axes.legend(fontsize=8)
        figure.tight_layout()
        figure.savefig(path, format=fmt)
    finally:
        plt.close(figure)
