"""Time charts drawn on the server as inline SVG (no script, no CDN: they work offline and with
JavaScript off): bars or lines over a range's points, a scale on the left, times below, a
legend, and each point's value as its tooltip. Text is escaped by `format_html`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

WIDTH, HEIGHT, LEFT, BOTTOM, TOP = 720, 150, 56, 18, 16


def duration(ms: float | None) -> str:
    """Milliseconds as an operator reads them: 850 ms, 1.2 s, 3.4 min, 2.0 h."""
    if ms is None:
        return "—"
    if ms < 1000:
        return f"{ms:.3g} ms"
    if ms < 60_000:
        return f"{ms / 1000:.3g} s"
    if ms < 3_600_000:
        return f"{ms / 60_000:.3g} min"
    return f"{ms / 3_600_000:.3g} h"


def _n(value: float) -> str:
    """A coordinate, to a tenth of a pixel."""
    return f"{value:.1f}"


def _when(moment: datetime, step: int) -> str:
    return moment.strftime("%H:%M" if step < 3600 else "%m-%d %H:%M" if step < 6 * 3600 else "%m-%d")


def time_chart(
    title: str,
    starts: Sequence[datetime],
    step: int,
    lines: Sequence[tuple[str, Sequence[float | None], str]],
    *,
    bars: bool = False,
    unit: str = "",
) -> SafeString:
    """One chart: `lines` are (label, values per point, colour); stacked bars when `bars`,
    else lines (a gap where a value is None). `unit` "ms" shows values as durations."""
    count = max(len(starts), 1)
    top = (
        max(
            (sum(v or 0 for v in col) if bars else max((v or 0 for v in col), default=0))
            for col in zip(*(values for _, values, _ in lines), strict=True)
        )
        if starts
        else 0
    )
    top = top or 1
    slot = (WIDTH - LEFT) / count
    shown = duration if unit == "ms" else (lambda v: f"{v:,.0f}" if v is not None else "—")

    def y(value: float) -> float:
        return TOP + HEIGHT - value * HEIGHT / top

    marks: list[SafeString] = []
    if bars:
        base = [0.0] * count
        for label, values, colour in lines:
            for i, value in enumerate(values):
                if value:
                    marks.append(
                        format_html(
                            '<rect x="{}" y="{}" width="{}" height="{}" fill="{}">'
                            "<title>{} {}: {}</title></rect>",
                            _n(LEFT + i * slot),
                            _n(y(base[i] + value)),
                            _n(max(slot - 1, 0.5)),
                            _n(value * HEIGHT / top),
                            colour,
                            _when(starts[i], step),
                            label,
                            shown(value),
                        )
                    )
                    base[i] += value
    else:
        for label, values, colour in lines:
            runs: list[list[tuple[float, float]]] = [[]]
            for i, value in enumerate(values):
                if value is None:
                    runs.append([])
                    continue
                x = LEFT + (i + 0.5) * slot
                runs[-1].append((x, y(value)))
                marks.append(
                    format_html(
                        '<circle cx="{}" cy="{}" r="2" fill="{}"><title>{} {}: {}</title></circle>',
                        _n(x),
                        _n(y(value)),
                        colour,
                        _when(starts[i], step),
                        label,
                        shown(value),
                    )
                )
            for run in runs:
                if len(run) > 1:
                    points = " ".join(f"{x:.1f},{yy:.1f}" for x, yy in run)
                    marks.append(
                        format_html(
                            '<polyline points="{}" fill="none" stroke="{}" stroke-width="1.5"/>',
                            points,
                            colour,
                        )
                    )
    ticks = format_html_join(
        "",
        '<text x="{}" y="{}" text-anchor="middle">{}</text>',
        (
            (_n(LEFT + (i + 0.5) * slot), TOP + HEIGHT + 13, _when(starts[i], step))
            for i in range(0, len(starts), max(len(starts) // 6, 1))
        ),
    )
    legend = format_html_join(
        "", '<tspan fill="{}">■ {}</tspan> ', ((colour, label) for label, _, colour in lines)
    )
    return format_html(
        '<svg class="jq-history-chart" role="img" aria-label="{}" width="{}" height="{}" '
        'xmlns="http://www.w3.org/2000/svg"><title>{}</title>'
        '<g font-size="10" fill="#777"><text x="{}" y="{}" text-anchor="end">{}</text>'
        '<text x="{}" y="{}" text-anchor="end">0</text>{}</g>'
        '<text x="{}" y="11" font-size="11"><tspan font-weight="bold" fill="#333">{}</tspan> '
        "{}</text>"
        '<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#bbb"/>'
        '<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#bbb"/>{}</svg>',
        title,
        WIDTH + 4,
        TOP + HEIGHT + BOTTOM,
        title,
        LEFT - 4,
        TOP + 8,
        shown(top),
        LEFT - 4,
        TOP + HEIGHT,
        ticks,
        LEFT,
        title,
        legend,
        LEFT - 0.5,
        TOP,
        LEFT - 0.5,
        TOP + HEIGHT,
        LEFT,
        TOP + HEIGHT + 0.5,
        WIDTH,
        TOP + HEIGHT + 0.5,
        mark_safe("".join(marks)),
    )
