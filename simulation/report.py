"""The simulator's outputs from one list of summaries: a rich table on screen, and in
the results folder a Markdown table, a CSV file and PNG plots of latency percentiles
and throughput: bars for one number of users, lines against it for several; ops grouped by
the role that calls them, so that no panel has more ops than distinct colours.
"""
from __future__ import annotations

import contextlib
import csv
import dataclasses
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

# mysql-connector's C extension loads libstdc++ lazily; once matplotlib's Agg backend has
# taken the static TLS space, that load fails ("cannot allocate memory in static TLS
# block") and MariaDB stops working in this process. Loading it first avoids that.
with contextlib.suppress(ImportError):
    import _mysql_connector  # noqa: F401

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend is chosen first)
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from .mixes import MIXES  # noqa: E402
from .stats import ALL, OpSummary  # noqa: E402


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}"


def _throughput(row: OpSummary) -> str:
    return "-" if math.isnan(row.ops_per_s) else f"{row.ops_per_s:.1f} ± {row.ops_per_s_sd:.1f}"


COLUMNS: list[tuple[str, Callable[[OpSummary], str]]] = [
    ("mix", lambda r: r.mix),
    ("N", lambda r: str(r.users)),
    ("op", lambda r: r.op),
    ("calls", lambda r: str(r.calls)),
    ("errors", lambda r: str(r.errors)),
    ("conflicts", lambda r: str(r.conflicts)),
    ("mean ms", lambda r: _ms(r.mean_ms)),
    ("p50 ms", lambda r: _ms(r.p50_ms)),
    ("p95 ms", lambda r: _ms(r.p95_ms)),
    ("p99 ms", lambda r: _ms(r.p99_ms)),
    ("ops/s (mean ± sd)", _throughput),
    ("ops/s median", lambda r: "-" if math.isnan(r.ops_per_s_median) else f"{r.ops_per_s_median:.1f}"),
]


def scenario_totals(rows: Sequence[OpSummary]) -> list[OpSummary]:
    """The ALL row of every scenario: the aggregate throughput."""
    return [row for row in rows if row.op == ALL]


def rich_table(rows: Sequence[OpSummary], title: str, skip: tuple[str, ...] = ()) -> Table:
    """The summaries as a rich table without the `skip` columns, a line between scenarios."""
    columns = [(header, cell) for header, cell in COLUMNS if header not in skip]
    table = Table(title=title)
    for header, _ in columns:
        table.add_column(header, justify="left" if header in ("mix", "op") else "right")
    for row in rows:
        table.add_row(*(cell(row) for _, cell in columns), end_section=row.op == ALL,
                      style="bold" if row.op == ALL else None)
    return table


def print_tables(rows: Sequence[OpSummary], console: Console) -> None:
    """One per-op table per scenario, then the aggregate of every scenario."""
    for mix, users in dict.fromkeys((row.mix, row.users) for row in rows):
        scenario = [row for row in rows if (row.mix, row.users) == (mix, users)]
        console.print(rich_table(scenario, f"{mix}, N = {users} sellers + {users} buyers",
                                 skip=("mix", "N", "ops/s median")))
    console.print(rich_table(scenario_totals(rows), "aggregate", skip=("op",)))


def markdown_table(rows: Sequence[OpSummary]) -> str:
    """The summaries as a GitHub Markdown table."""
    lines = ["| " + " | ".join(header for header, _ in COLUMNS) + " |",
             "|" + "|".join("---" if header in ("mix", "op") else "---:" for header, _ in COLUMNS) + "|"]
    lines += ["| " + " | ".join(cell(row) for _, cell in COLUMNS) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_csv(rows: Sequence[OpSummary], path: Path) -> None:
    """Every field of every summary, one row each."""
    fields = [f.name for f in dataclasses.fields(OpSummary)]
    with path.open("w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=fields)
        writer.writeheader()
        writer.writerows(dataclasses.asdict(row) for row in rows)


def plot_latency(rows: Sequence[OpSummary], path: Path) -> None:
    """Each op's latency, one row of panels per mix and group of ops (seller's, buyer's, both's):
    for one N, p50/p95/p99 as bars; for several, p50 and p99 as lines against N."""
    counts = sorted({row.users for row in rows})
    panels = [(mix, group, ops) for mix in sorted({row.mix for row in rows})
              for group, ops in op_groups(mix, {row.op for row in rows if row.mix == mix})]
    wide = len(counts) > 1
    figure, axes = plt.subplots(len(panels), 2 if wide else 1, squeeze=False,
                                figsize=(14 if wide else 9, 0.5 + 3.2 * len(panels)))
    for line, (mix, group, ops) in zip(axes, panels, strict=True):
        series = {op: points for op, points in _series(rows, mix).items() if op in ops}
        if wide:
            for axis, (label, figure_of) in zip(line, (_PERCENTILES[0], _PERCENTILES[2]), strict=True):
                _latency_lines(axis, series, figure_of)
                axis.set_title(f"{mix}, {group}: {label} latency")
                _users_axis(axis, rows)
            line[-1].legend(fontsize="small", loc="center left", bbox_to_anchor=(1, 0.5))
        else:
            _latency_bars(line[0], series)
            line[0].set_title(f"{mix}, {group}: latency at N = {counts[0]} (sellers = buyers)")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def op_groups(mix: str, ops: set[str]) -> list[tuple[str, list[str]]]:
    """The ops of a mix by who calls them: sellers only, buyers only, both; ALL last."""
    weights = MIXES[mix] if mix in MIXES else None
    calls, total = ops - {ALL}, sorted(ops & {ALL})
    seller = set(weights.seller) if weights else set()
    buyer = set(weights.buyer) if weights else calls
    groups = [("seller ops", sorted(calls & seller - buyer)), ("buyer ops", sorted(calls & buyer - seller)),
              ("ops of both roles", sorted(calls & buyer & seller) + total)]
    return [(label, members) for label, members in groups if members]


_COLOURS = plt.get_cmap("tab10").colors  # type: ignore[attr-defined]  # ten that tell apart


def _latency_lines(axis: Any, series: dict[str, list[OpSummary]],
                   figure_of: Callable[[OpSummary], float]) -> None:
    for index, (op, points) in enumerate(series.items()):
        style = ({"color": "black", "linewidth": 2.5} if op == ALL else
                 {"color": _COLOURS[index % 10], "linestyle": "-" if index < 10 else "--"})
        axis.plot([p.users for p in points], [figure_of(p) for p in points], marker="o", label=op, **style)
    _ms_axis(axis, "y")


def _latency_bars(axis: Any, series: dict[str, list[OpSummary]]) -> None:
    ops = list(series)
    height = 0.8 / len(_PERCENTILES)
    for at, (label, figure_of) in enumerate(_PERCENTILES):
        axis.barh([n + at * height for n in range(len(ops))], [figure_of(series[op][0]) for op in ops],
                  height=height, color=_COLOURS[at], label=label)
    axis.set_yticks([n + height for n in range(len(ops))], labels=ops)
    axis.invert_yaxis()  # the first op on top
    axis.legend(fontsize="small", loc="center left", bbox_to_anchor=(1, 0.5))
    _ms_axis(axis, "x")


def _ms_axis(axis: Any, which: str) -> None:
    """A log-scaled latency axis labelled at 1, 2 and 5 of every decade, in plain numbers."""
    getattr(axis, f"set_{which}scale")("log")
    getattr(axis, f"set_{which}label")("latency, ms (log scale)")
    ticks = getattr(axis, f"{which}axis")
    ticks.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ticks.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ticks.set_minor_formatter(NullFormatter())
    axis.grid(True, alpha=0.3)


def plot_throughput(rows: Sequence[OpSummary], path: Path) -> None:
    """Aggregate throughput (mean ± sd across runs): bars per mix for one N, lines against N
    for several."""
    figure, axis = plt.subplots(figsize=(7, 4.5))
    mixes = sorted({row.mix for row in rows})
    totals = {mix: _series(rows, mix).get(ALL, []) for mix in mixes}
    counts = sorted({row.users for row in rows})
    if len(counts) > 1:
        for index, mix in enumerate(mixes):
            points = totals[mix]
            axis.errorbar([p.users for p in points], [p.ops_per_s for p in points], color=_COLOURS[index],
                          yerr=[p.ops_per_s_sd for p in points], marker="o", capsize=4, label=mix)
        _users_axis(axis, rows)
        axis.legend()
    else:
        axis.bar(mixes, [totals[mix][0].ops_per_s for mix in mixes], color=_COLOURS[:len(mixes)],
                 yerr=[totals[mix][0].ops_per_s_sd for mix in mixes], capsize=4)
        axis.set_xlabel(f"mix, at N = {counts[0]} (sellers = buyers)")
        axis.grid(True, axis="y", alpha=0.3)
    axis.set(title="aggregate throughput (mean ± sd across runs)", ylabel="answered calls per second")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


_PERCENTILES: list[tuple[str, Callable[[OpSummary], float]]] = [
    ("p50", lambda r: r.p50_ms), ("p95", lambda r: r.p95_ms), ("p99", lambda r: r.p99_ms)]


def _users_axis(axis: Any, rows: Sequence[OpSummary]) -> None:
    count_axis(axis, sorted({row.users for row in rows}), "N (sellers = buyers = N)")


def count_axis(axis: Any, counts: Sequence[int], label: str) -> None:
    """A log-scaled x axis ticked at these counts, with a light grid."""
    axis.set_xscale("log")
    axis.set_xticks(counts, labels=[str(n) for n in counts])
    axis.minorticks_off()
    axis.set_xlabel(label)
    axis.grid(True, alpha=0.3)


def _series(rows: Sequence[OpSummary], mix: str) -> dict[str, list[OpSummary]]:
    series: dict[str, list[OpSummary]] = {}
    for row in sorted((r for r in rows if r.mix == mix), key=lambda r: r.users):
        series.setdefault(row.op, []).append(row)
    return series


def write_reports(rows: Sequence[OpSummary], out_dir: Path, console: Console, preamble: str) -> list[Path]:
    """Print the tables and write results.md, results.csv, latency.png, throughput.png."""
    out_dir.mkdir(parents=True, exist_ok=True)
    print_tables(rows, console)
    paths = [out_dir / name for name in ("results.md", "results.csv", "latency.png", "throughput.png")]
    paths[0].write_text(f"{preamble}\n\n## Aggregate\n\n{markdown_table(scenario_totals(rows))}\n"
                        f"## Per op\n\n{markdown_table(rows)}")
    write_csv(rows, paths[1])
    plot_latency(rows, paths[2])
    plot_throughput(rows, paths[3])
    return paths
