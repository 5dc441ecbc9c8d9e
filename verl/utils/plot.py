"""Plot training curves from the ``file`` logger's ``metrics.jsonl``.

    python -m verl.utils.plot logs/<project>/<experiment>            # a run directory
    python -m verl.utils.plot path/to/metrics.jsonl --out plots/     # or the file itself

Writes one PNG per panel that has data (reward, validation score, KL, entropy, response
length, throughput) and ``overview.png`` with all of them, into ``--out`` (default: a
``plots`` folder next to ``metrics.jsonl``), and prints each path. Needs ``matplotlib``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PANELS", "Panel", "PlotError", "load_metrics", "main", "plot_run"]

Series = dict[str, list[tuple[int, float]]]


class PlotError(ValueError):
    """The metrics file is missing, empty or not JSON lines."""


@dataclass(frozen=True)
class Panel:
    """One figure: the metrics drawn in it (exact names, or prefixes ending in ``/``)."""

    file: str
    title: str
    metrics: tuple[str, ...]


PANELS = (
    Panel("reward.png", "Training reward", ("critic/score/mean", "critic/rewards/mean")),
    Panel("val_score.png", "Validation score", ("val-core/",)),
    Panel("kl.png", "KL", ("actor/ppo_kl", "actor/kl_loss", "actor/reward_kl_penalty")),
    Panel("entropy.png", "Policy entropy", ("actor/entropy",)),
    Panel("response_length.png", "Response length (tokens)", ("response_length/mean", "response_length/max")),
    Panel("throughput.png", "Throughput (tokens/s per worker)", ("perf/throughput",)),
)


def _resolve(path: Path) -> Path:
    if path.is_dir():
        path = path / "metrics.jsonl"
        if not path.is_file():
            raise PlotError(f"{path}: not found; the 'file' logger writes it (add 'file' to trainer.logger)")
    if not path.is_file():
        raise PlotError(f"{path}: no such file or directory")
    return path


def load_metrics(path: str | Path) -> Series:
    """``{name: [(step, value), ...]}`` sorted by step, from a run directory or a metrics.jsonl.

    A resumed run appends steps it already logged; the last value logged for a step wins.
    ``null`` values (NaN/inf when logged) are skipped.
    """
    path = _resolve(Path(path))
    by_step: dict[int, dict[str, float]] = {}
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise PlotError(f"{path}:{line_no}: not a JSON line ({err.msg})") from err
            if not isinstance(record, dict) or not isinstance(record.get("step"), int):
                raise PlotError(f"{path}:{line_no}: expected an object with an integer 'step'")
            by_step.setdefault(record["step"], {}).update(record)
    if not by_step:
        raise PlotError(f"{path}: no metrics (empty file)")
    series: Series = {}
    for step in sorted(by_step):
        for name, value in by_step[step].items():
            if name != "step" and isinstance(value, int | float) and not isinstance(value, bool):
                series.setdefault(name, []).append((step, float(value)))
    return series


def _panel_names(panel: Panel, series: Series) -> list[str]:
    names = []
    for pattern in panel.metrics:
        if pattern.endswith("/"):
            # a spread (best@k/std) is not a score curve
            names += sorted(n for n in series if n.startswith(pattern) and not n.endswith("/std"))
        elif pattern in series:
            names.append(pattern)
    return names


def _draw(ax, panel: Panel, names: list[str], series: Series) -> None:
    from matplotlib.ticker import MaxNLocator

    for name in names:
        steps, values = zip(*series[name])
        ax.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3, label=name)
    ax.set_title(panel.title)
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")


def _import_pyplot():
    try:
        import matplotlib
    except ImportError as err:
        raise PlotError(
            "plotting needs matplotlib: pip install matplotlib  (or pip install 'verl[loggers]')"
        ) from err
    matplotlib.use("Agg")  # files only; never opens a window
    import matplotlib.pyplot as plt

    return plt


def plot_run(path: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Write the PNGs for a run and return their paths (see the module doc)."""
    plt = _import_pyplot()
    series = load_metrics(path)
    out = Path(out_dir) if out_dir is not None else _resolve(Path(path)).parent / "plots"
    out.mkdir(parents=True, exist_ok=True)
    drawn = [(panel, names) for panel in PANELS if (names := _panel_names(panel, series))]
    if not drawn:
        known = ", ".join(m for panel in PANELS for m in panel.metrics)
        raise PlotError(f"{path}: none of the plotted metrics are present ({known})")
    written = []
    for panel, names in drawn:
        fig, ax = plt.subplots(figsize=(6, 4))
        _draw(ax, panel, names, series)
        written.append(_save(fig, out / panel.file))
    cols = min(3, len(drawn))
    rows = -(-len(drawn) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    for ax, (panel, names) in zip(axes.flat, drawn):
        _draw(ax, panel, names, series)
    for ax in list(axes.flat)[len(drawn) :]:
        ax.set_visible(False)
    written.append(_save(fig, out / "overview.png"))
    plt.close("all")
    return written


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verl.utils.plot", description=__doc__.splitlines()[0])
    parser.add_argument("path", help="run directory (holding metrics.jsonl) or a metrics.jsonl file")
    parser.add_argument("--out", default=None, help="folder for the PNGs (default: <run dir>/plots)")
    args = parser.parse_args(argv)
    try:
        written = plot_run(args.path, args.out)
    except PlotError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
