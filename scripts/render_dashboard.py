"""Draws the chart's Grafana dashboard as a PNG for the docs, from Prometheus's answers to its own queries.

The answers come from tests/operator/test_dashboard_queries.py run with SPECPILOT_DASHBOARD_CAPTURE=FILE: the real
operator and a real Prometheus through a SpeculativeDeployment's life (speculating at low load, then turned off by
the restart strategy at high load). Panels keep the dashboard's layout, titles, legends, units, stepped lines and
dashed series; decisions and toggles (the dashboard's annotations) are vertical lines on every graph. The capture
records a hash of the dashboard it ran, and tests/unit/test_dashboard.py fails when the dashboard has changed
since, so the picture cannot drift from what the chart ships.

    SPECPILOT_DASHBOARD_CAPTURE=docs/images/dashboard-data.json \\
        .venv/bin/python -m pytest -q tests/operator/test_dashboard_queries.py
    .venv/bin/python scripts/render_dashboard.py docs/images/dashboard-data.json docs/images/dashboard.png
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

DASHBOARD = Path(__file__).resolve().parents[1] / "charts" / "specpilot" / "dashboards" / "specpilot.json"
GRID_COLUMNS = 24
UNIT_FORMATS = {
    "percentunit": lambda v: f"{v:.0%}",
    "currencyUSD": lambda v: f"${v:.2f}",
    "s": lambda v: f"{v * 1000:.0f} ms" if v < 1 else f"{v:.1f} s",
}
ANNOTATION_COLORS = {"blue": "tab:blue", "orange": "tab:orange"}


def legend(template: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template) or \
        ",".join(f"{k}={v}" for k, v in labels.items())


def dashed_patterns(panel: dict) -> list[str]:
    return [o["matcher"]["options"] for o in panel["fieldConfig"]["overrides"]
            if o["matcher"]["id"] == "byRegexp"
            and any(p["id"] == "custom.lineStyle" for p in o["properties"])]


def annotation_times(board: dict, answers: dict, start: float) -> list[tuple[float, str, str]]:
    """(seconds from start, colour, text) for the first point of each run of an annotation query's answer."""
    marks = []
    for annotation in board["annotations"]["list"]:
        result = answers.get(f"annotation/{annotation.get('name')}")
        for series in result or []:
            previous = None
            for t, _ in series["values"]:
                if previous is None or t - previous > 30:
                    marks.append((t - start, ANNOTATION_COLORS.get(annotation["iconColor"], "grey"),
                                  legend(annotation["titleFormat"], series["metric"])))
                previous = t
    return marks


def draw_timeseries(ax, panel: dict, answers: dict, start: float, marks) -> None:
    dashed = dashed_patterns(panel)
    custom = panel["fieldConfig"]["defaults"].get("custom", {})
    stepped = custom.get("lineInterpolation") == "stepAfter"
    lines = []
    for target in panel["targets"]:
        for series in answers.get(f"{panel['id']}/{target['refId']}", []):
            points = {t - start: float(v) for t, v in series["values"] if math.isfinite(float(v))}
            if points:
                lines.append((legend(target["legendFormat"], series["metric"]), points))
    if custom.get("stacking", {}).get("mode") == "normal":
        times = sorted({t for _, points in lines for t in points})
        ax.stackplot(times, *[[points.get(t, 0.0) for t in times] for _, points in lines],
                     labels=[name for name, _ in lines], step="post" if stepped else None, alpha=0.7)
    for name, points in [] if custom.get("stacking", {}).get("mode") == "normal" else lines:
        style = "--" if any(re.fullmatch(p, name) for p in dashed) else "-"
        ax.plot(list(points), list(points.values()), style, label=name, linewidth=1.6,
                drawstyle="steps-post" if stepped else "default")
    for x, color, _ in marks:
        ax.axvline(x, color=color, linewidth=0.8, alpha=0.6)
    unit = panel["fieldConfig"]["defaults"].get("unit")
    if unit in UNIT_FORMATS:
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: UNIT_FORMATS[unit](v)))
    defaults = panel["fieldConfig"]["defaults"]
    if "min" in defaults:
        ax.set_ylim(bottom=defaults["min"])
    if "max" in defaults:
        ax.set_ylim(top=defaults["max"] * 1.05)
    ax.set_xlabel("seconds", fontsize=7)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", frameon=False)


def draw_table(ax, panel: dict, answers: dict) -> None:
    """The decision table: one row per pool, the info series' labels and each other query's value."""
    rename = next(t["options"]["renameByName"] for t in panel["transformations"] if t["id"] == "organize")
    rows: dict[str, dict[str, str]] = {}
    columns = ["pool", "method", "strategy", "schedule"]
    for target in panel["targets"]:
        for series in answers.get(f"{panel['id']}/{target['refId']}", []):
            row = rows.setdefault(series["metric"].get("pool", ""), {"pool": series["metric"].get("pool", "")})
            column = rename.get(f"Value #{target['refId']}")
            if column is None:
                row.update({k: series["metric"].get(k, "") for k in columns[1:]})
            else:
                row[column] = f"{float(series['value'][1]):g}"
                columns += [column] if column not in columns else []
    ax.axis("off")
    table = ax.table(cellText=[[row.get(c, "") or "-" for c in columns] for row in rows.values()],
                     colLabels=columns, loc="upper left", cellLoc="left")
    table.auto_set_font_size(False)
    table.set_fontsize(8)
    table.scale(1, 1.4)


def render(capture: dict, board: dict, out: Path) -> None:
    panels = board["panels"]
    title_units = 2
    height_units = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels) + title_units
    figure = plt.figure(figsize=(18, height_units * 0.32))
    start, answers = capture["start"], capture["answers"]
    marks = annotation_times(board, answers, start)
    variables = capture["variables"]
    figure.suptitle(f"{board['title']}  -  namespace {variables['namespace']}, deployment "
                    f"{variables['deployment']}, pool {variables['pool']}", fontsize=13, x=0.01, y=0.995, ha="left")
    for panel in panels:
        g = panel["gridPos"]
        left, width = g["x"] / GRID_COLUMNS, g["w"] / GRID_COLUMNS
        bottom, height = 1 - (title_units + g["y"] + g["h"]) / height_units, g["h"] / height_units
        if panel["type"] == "row":
            figure.text(left + 0.005, bottom + height * 0.2, panel["title"], fontsize=11, weight="bold")
            continue
        ax = figure.add_axes([left + 0.035 * width, bottom + 0.22 * height, width * 0.93, height * 0.62])
        ax.set_title(panel["title"], fontsize=9, loc="left")
        if panel["type"] == "table":
            draw_table(ax, panel, answers)
        else:
            draw_timeseries(ax, panel, answers, start, marks)
    figure.savefig(out, dpi=80)
    plt.close(figure)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("capture", type=Path, help="JSON written by the dashboard query test")
    parser.add_argument("out", type=Path, help="PNG to write")
    args = parser.parse_args(argv)
    render(json.loads(args.capture.read_text()), json.loads(DASHBOARD.read_text()), args.out)


if __name__ == "__main__":
    main()
