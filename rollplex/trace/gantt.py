"""Planned against measured as one picture for TensorBoard's Images tab.

torch-tb-profiler's DIFF view cannot compare overlapping streams op by op, so this draws the
planned and measured Gantt charts on one time axis, then the per-op table of planned and
measured times, headed by whether the plan was calibrated. Drawn with Pillow.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

from PIL import Image, ImageDraw, ImageFont

from rollplex.trace.diff import DiffRow, diff_timelines
from rollplex.trace.timeline import Timeline

WIDTH, LEFT, ROW, GAP = 1400, 230, 18, 14
PHASE_COLOURS = {
    "rollout": (76, 114, 176),
    "reference": (221, 132, 82),
    "train": (85, 168, 104),
    "update": (196, 78, 82),
}
OTHER = (129, 114, 179)
TABLE_ROWS = 24


def _lanes(timeline: Timeline) -> list[tuple[int, int]]:
    return sorted({(s.device, s.stream) for s in timeline.spans})


def _chart(draw, font, timeline: Timeline, top: int, scale: float, title: str) -> int:
    draw.text((8, top), title, fill="black", font=font)
    top += ROW
    lanes = _lanes(timeline)
    row_of = {lane: top + i * ROW for i, lane in enumerate(lanes)}
    for (dev, stream), y in row_of.items():
        label = timeline.stream_names.get((dev, stream), f"{dev}:{stream}")
        draw.text((8, y + 3), label[:32], fill="black", font=font)
        draw.line([(LEFT, y + ROW - 1), (WIDTH - 10, y + ROW - 1)], fill=(225, 225, 225))
    for a, b in timeline.steps:  # RL step boundaries
        for t in (a, b):
            x = LEFT + t * scale
            draw.line([(x, top), (x, top + len(lanes) * ROW)], fill=(160, 160, 160))
    for s in timeline.spans:
        y = row_of[(s.device, s.stream)]
        x0 = LEFT + s.start_us * scale
        x1 = max(x0 + 1, LEFT + s.end_us * scale)
        colour = PHASE_COLOURS.get(s.phase, OTHER)
        draw.rectangle([x0, y + 2, x1, y + ROW - 3], fill=colour, outline=(40, 40, 40))
        name = s.name.split(".", 1)[-1]
        if x1 - x0 > 6 * len(name):
            draw.text((x0 + 2, y + 3), name, fill="white", font=font)
    return top + len(lanes) * ROW + GAP


def _table(draw, font, rows: Sequence[DiffRow], top: int, header: str) -> int:
    draw.text(
        (8, top), header, fill=(160, 0, 0) if "UNCALIBRATED" in header else "black", font=font
    )
    top += ROW
    cols = (8, 420, 560, 700)
    for x, text in zip(cols, ("op", "planned ms", "measured ms", "measured/planned"), strict=True):
        draw.text((x, top), text, fill="black", font=font)
    for r in rows:
        top += ROW
        ratio = f"{r.ratio:.2f}" if r.ratio != float("inf") else "inf"
        cells = (r.name[:60], f"{r.planned_us / 1e3:.3f}", f"{r.measured_us / 1e3:.3f}", ratio)
        for x, text in zip(cols, cells, strict=True):
            draw.text((x, top), text, fill="black", font=font)
    return top + ROW + GAP


def op_ratios(planned: Timeline, measured: Timeline) -> list[DiffRow]:
    """Per (device, op), planned and measured time summed over the steps, slowest first."""
    rows = diff_timelines(planned, measured, aggregate=True).rows
    return sorted(rows, key=lambda r: -r.measured_us)


def comparison_png(
    planned: Timeline, measured: Timeline, *, calibrated: str | None, title: str = ""
) -> bytes:
    """The panel as PNG bytes. `calibrated`: the calibration file the plan used, or None."""
    end = max(planned.end_us(), measured.end_us(), 1e-9)
    scale = (WIDTH - LEFT - 20) / end
    rows = op_ratios(planned, measured)[:TABLE_ROWS]
    lanes = len(_lanes(planned)) + len(_lanes(measured))
    height = 4 * ROW + lanes * ROW + 3 * GAP + (len(rows) + 3) * ROW + GAP
    image = Image.new("RGB", (WIDTH, height), "white")
    draw, font = ImageDraw.Draw(image), ImageFont.load_default()
    top = 6
    if title:
        draw.text((8, top), title, fill="black", font=font)
        top += ROW
    axis = f"time axis 0 .. {end / 1e3:.3f} ms (both charts)"
    draw.text((LEFT, top), axis, fill=(90, 90, 90), font=font)
    top += ROW
    top = _chart(draw, font, planned, top, scale, f"planned ({planned.label})")
    top = _chart(draw, font, measured, top, scale, f"measured ({measured.label})")
    header = (
        f"calibrated with {calibrated}"
        if calibrated
        else "UNCALIBRATED plan: predicted from the cost model's nominal efficiencies"
    )
    _table(draw, font, rows, top, f"per op, summed over the steps shown - {header}")
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()
