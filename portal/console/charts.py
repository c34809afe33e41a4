"""Charts drawn on the server as inline SVG: a time line chart, a (stacked or grouped) bar chart, and a
horizontal bar chart. No JavaScript and nothing loaded from elsewhere, so the dashboard works offline and
under a strict Content-Security-Policy.

Every chart is an <svg role="img"> labelled by its <title> and <desc>, and every point or bar carries
its own <title> (the browser shows it as a tooltip; screen readers read it). Each function returns the
markup as a SafeString; every piece of text is escaped here.
"""

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from html import escape
from itertools import pairwise

from django.utils import timezone
from django.utils.safestring import SafeString, mark_safe

# Colours that stay apart for the common forms of colour blindness (Okabe-Ito), led by the portal's blue.
PALETTE = ["#0b5cad", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00"]
GRID = "#e6e9ed"
AXIS = "#9aa1a9"
INK = "#5b6470"

WIDTH = 720
HEIGHT = 280
MARGIN_LEFT = 58
MARGIN_RIGHT = 18
MARGIN_TOP = 40
MARGIN_BOTTOM = 34
# Markers on line charts only while they stay readable.
MAX_MARKERS = 60
MAX_X_LABELS = 8

Formatter = Callable[[float], str]


@dataclass(frozen=True)
class Series:
    name: str
    values: Sequence[float | None]
    color: str = ""
    # Line charts: shade the area under the line (used for the first, "capacity" series).
    area: bool = False
    dashed: bool = False


def format_number(value: float) -> str:
    """Axis and tooltip numbers: '1,234', '12.5', '3.25', '15k' above ten thousand."""
    if abs(value) >= 10_000:
        return f"{value / 1000:,.0f}k"
    if float(value).is_integer():
        return f"{int(value):,}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) < 0.1:
        # Small ranges (a few GPU-minutes) need significant digits, or neighbouring ticks read the same.
        return f"{value:.2g}"
    return f"{value:,.2f}".rstrip("0").rstrip(".")


def nice_scale(maximum: float, *, ticks: int = 4, integer: bool = False) -> tuple[float, float]:
    """(top, step) of a y axis from 0 holding `maximum` in about `ticks` round steps (1, 2, 2.5, 5 x 10^n)."""
    if maximum <= 0:
        return (float(ticks), 1.0) if integer else (1.0, 0.25)
    raw = maximum / ticks
    magnitude = 10 ** math.floor(math.log10(raw))
    step = magnitude * 10
    for multiple in (1, 2, 2.5, 5, 10):
        if multiple * magnitude >= raw:
            step = multiple * magnitude
            break
    if integer:
        step = max(1.0, math.ceil(step))
    return step * math.ceil(maximum / step - 1e-9), step


def _svg_open(chart_id: str, title: str, desc: str, height: int) -> str:
    chart_id = escape(chart_id)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {WIDTH} {height}" '
        f'role="img" aria-labelledby="{chart_id}-title {chart_id}-desc" data-chart="{chart_id}" '
        f'font-family="system-ui, -apple-system, Segoe UI, Roboto, DejaVu Sans, sans-serif" font-size="12">'
        f'<title id="{chart_id}-title">{escape(title)}</title>'
        f'<desc id="{chart_id}-desc">{escape(desc)}</desc>'
    )


def _color(series: Series, index: int) -> str:
    return series.color or PALETTE[index % len(PALETTE)]


def _legend(series: Sequence[Series], *, y_label: str) -> str:
    """The unit at the top left, and one swatch per series at the top right, laid out right to left."""
    parts = []
    if y_label:
        parts.append(
            f'<text x="{MARGIN_LEFT - 8}" y="18" fill="{INK}" font-weight="600">{escape(y_label)}</text>'
        )
    x = WIDTH - MARGIN_RIGHT
    for index in reversed(range(len(series))):
        name = series[index].name
        # Text width estimate: labels are short, and the SVG has no layout engine to ask.
        x -= len(name) * 6.6 + 8
        parts.append(f'<text x="{x:.1f}" y="18" fill="{INK}">{escape(name)}</text>')
        x -= 16
        swatch = (
            f'<line x1="{x:.1f}" y1="14" x2="{x + 12:.1f}" y2="14" stroke="{_color(series[index], index)}" '
            f'stroke-width="3" stroke-dasharray="4 2"/>'
            if series[index].dashed
            else f'<rect x="{x:.1f}" y="8" width="12" height="12" rx="2" '
            f'fill="{_color(series[index], index)}"/>'
        )
        parts.append(swatch)
        x -= 14
    return f'<g class="legend">{"".join(parts)}</g>'


def _y_axis(top: float, step: float, plot_top: float, plot_bottom: float, fmt: Formatter) -> str:
    parts = []
    count = round(top / step)
    for index in range(count + 1):
        value = step * index
        y = plot_bottom - (plot_bottom - plot_top) * (value / top)
        stroke = AXIS if index == 0 else GRID
        parts.append(
            f'<line x1="{MARGIN_LEFT}" y1="{y:.1f}" x2="{WIDTH - MARGIN_RIGHT}" y2="{y:.1f}" '
            f'stroke="{stroke}"/><text x="{MARGIN_LEFT - 8}" y="{y + 4:.1f}" text-anchor="end" '
            f'fill="{INK}">{escape(fmt(value))}</text>'
        )
    return f'<g class="y-axis">{"".join(parts)}</g>'


# --- line chart over time ----------------------------------------------------------------------------

TIME_STEPS = [
    timedelta(minutes=5),
    timedelta(minutes=15),
    timedelta(minutes=30),
    timedelta(hours=1),
    timedelta(hours=2),
    timedelta(hours=3),
    timedelta(hours=6),
    timedelta(hours=12),
    timedelta(days=1),
    timedelta(days=2),
    timedelta(days=7),
    timedelta(days=14),
    timedelta(days=30),
    timedelta(days=60),
]


def time_ticks(start: datetime, end: datetime) -> list[tuple[datetime, str]]:
    """Round moments between start and end to label the x axis, at most MAX_X_LABELS of them."""
    span = end - start
    step = next((step for step in TIME_STEPS if span / step <= MAX_X_LABELS - 1), TIME_STEPS[-1])
    local_start = timezone.localtime(start)
    midnight = local_start.replace(hour=0, minute=0, second=0, microsecond=0)
    # Ticks fall on whole multiples of the step counted from midnight of the first day.
    first = midnight + step * math.ceil((local_start - midnight) / step)
    ticks, moment = [], first
    while moment <= end:
        local = timezone.localtime(moment)
        if step >= timedelta(days=1) or (local.hour == 0 and local.minute == 0):
            label = f"{local:%b} {local.day}"
        else:
            label = f"{local:%H:%M}"
        ticks.append((moment, label))
        moment += step
    return ticks


def _segments(
    times: Sequence[datetime], values: Sequence[float | None]
) -> list[list[tuple[datetime, float]]]:
    """Split a series where a value is missing or where the points are much further apart than usual."""
    gaps = sorted((later - earlier) for earlier, later in pairwise(times))
    usual = gaps[len(gaps) // 2] if gaps else None
    segments, current, previous = [], [], None
    for moment, value in zip(times, values):
        broken = value is None or (previous is not None and usual and moment - previous > usual * 3)
        if broken and current:
            segments.append(current)
            current = []
        if value is not None:
            current.append((moment, value))
        previous = moment
    if current:
        segments.append(current)
    return segments


def line_chart(
    *,
    chart_id: str,
    title: str,
    desc: str,
    times: Sequence[datetime],
    series: Sequence[Series],
    start: datetime,
    end: datetime,
    y_label: str = "",
    integer: bool = False,
    fmt: Formatter = format_number,
    value_fmt: Formatter | None = None,
) -> SafeString:
    """Lines over time from `start` to `end`; each series has one value (or None) per entry of `times`.

    `fmt` writes the axis numbers, `value_fmt` (default: `fmt`) the values in tooltips.
    """
    value_fmt = value_fmt or fmt
    plot_top, plot_bottom = MARGIN_TOP, HEIGHT - MARGIN_BOTTOM
    plot_left, plot_right = MARGIN_LEFT, WIDTH - MARGIN_RIGHT
    values = [value for one in series for value in one.values if value is not None]
    top, step = nice_scale(max(values, default=0), integer=integer)
    span = max((end - start).total_seconds(), 1.0)

    def x_of(moment: datetime) -> float:
        return plot_left + (plot_right - plot_left) * ((moment - start).total_seconds() / span)

    def y_of(value: float) -> float:
        return plot_bottom - (plot_bottom - plot_top) * (value / top)

    parts = [_svg_open(chart_id, title, desc, HEIGHT), _y_axis(top, step, plot_top, plot_bottom, fmt)]
    for moment, label in time_ticks(start, end):
        x = x_of(moment)
        parts.append(
            f'<line x1="{x:.1f}" y1="{plot_bottom}" x2="{x:.1f}" y2="{plot_bottom + 5}" stroke="{AXIS}"/>'
            f'<text x="{x:.1f}" y="{plot_bottom + 19}" text-anchor="middle" '
            f'fill="{INK}">{escape(label)}</text>'
        )
    show_markers = len(times) <= MAX_MARKERS
    for index, one in enumerate(series):
        color = _color(one, index)
        group = [f'<g class="series" data-series="{escape(one.name)}">']
        for segment in _segments(times, one.values):
            coords = " ".join(f"{x_of(moment):.1f},{y_of(value):.1f}" for moment, value in segment)
            if one.area and len(segment) > 1:
                group.append(
                    f'<polygon points="{x_of(segment[0][0]):.1f},{plot_bottom} {coords} '
                    f'{x_of(segment[-1][0]):.1f},{plot_bottom}" fill="{color}" fill-opacity="0.12"/>'
                )
            dash = ' stroke-dasharray="6 4"' if one.dashed else ""
            group.append(
                f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="2.25" '
                f'stroke-linejoin="round" stroke-linecap="round"{dash}/>'
            )
            if show_markers or len(segment) == 1:
                for moment, value in segment:
                    local = timezone.localtime(moment)
                    group.append(
                        f'<circle cx="{x_of(moment):.1f}" cy="{y_of(value):.1f}" r="3" fill="{color}">'
                        f"<title>{escape(f'{local:%Y-%m-%d %H:%M} · {one.name}: {value_fmt(value)}')}"
                        "</title></circle>"
                    )
        group.append("</g>")
        parts.append("".join(group))
    parts.append(_legend(series, y_label=y_label))
    parts.append("</svg>")
    return mark_safe("".join(parts))


# --- vertical bars -----------------------------------------------------------------------------------


def bar_chart(
    *,
    chart_id: str,
    title: str,
    desc: str,
    labels: Sequence[str],
    series: Sequence[Series],
    tooltip_labels: Sequence[str] | None = None,
    stacked: bool = False,
    y_label: str = "",
    integer: bool = False,
    fmt: Formatter = format_number,
    value_fmt: Formatter | None = None,
) -> SafeString:
    """One group of bars per label: side by side (grouped) or on top of each other (`stacked`).

    Only every n-th label is written under the axis when there are many; every bar's tooltip names its
    own (`tooltip_labels`, defaulting to `labels`). `fmt` writes the axis numbers, `value_fmt` (default:
    `fmt`) the values in tooltips.
    """
    value_fmt = value_fmt or fmt
    plot_top, plot_bottom = MARGIN_TOP, HEIGHT - MARGIN_BOTTOM
    plot_left, plot_right = MARGIN_LEFT, WIDTH - MARGIN_RIGHT
    tooltip_labels = tooltip_labels or labels
    count = max(len(labels), 1)
    if stacked:
        heights = [sum((one.values[i] or 0) for one in series) for i in range(len(labels))]
    else:
        heights = [value or 0 for one in series for value in one.values]
    top, step = nice_scale(max(heights, default=0), integer=integer)

    def y_of(value: float) -> float:
        return plot_bottom - (plot_bottom - plot_top) * (value / top)

    band = (plot_right - plot_left) / count
    inner = band * (0.7 if count > 1 else 0.4)
    bar_width = inner if stacked else inner / max(len(series), 1)
    parts = [_svg_open(chart_id, title, desc, HEIGHT), _y_axis(top, step, plot_top, plot_bottom, fmt)]
    label_every = math.ceil(count / MAX_X_LABELS)
    for index, label in enumerate(labels):
        if index % label_every == 0:
            x = plot_left + band * (index + 0.5)
            parts.append(
                f'<text x="{x:.1f}" y="{plot_bottom + 19}" text-anchor="middle" '
                f'fill="{INK}">{escape(label)}</text>'
            )
    for series_index, one in enumerate(series):
        color = _color(one, series_index)
        group = [f'<g class="series" data-series="{escape(one.name)}">']
        for index, value in enumerate(one.values):
            value = value or 0
            left = plot_left + band * index + (band - inner) / 2
            if stacked:
                base = sum((other.values[index] or 0) for other in series[:series_index])
            else:
                base, left = 0, left + bar_width * series_index
            y_high, y_low = y_of(base + value), y_of(base)
            tooltip = escape(f"{tooltip_labels[index]} · {one.name}: {value_fmt(value)}")
            if value <= 0:
                continue
            group.append(
                f'<rect x="{left:.1f}" y="{y_high:.1f}" width="{max(bar_width - 1, 1):.1f}" '
                f'height="{max(y_low - y_high, 0.5):.1f}" fill="{color}" rx="1.5">'
                f"<title>{tooltip}</title></rect>"
            )
        group.append("</g>")
        parts.append("".join(group))
    parts.append(_legend(series, y_label=y_label))
    parts.append("</svg>")
    return mark_safe("".join(parts))


# --- horizontal bars ---------------------------------------------------------------------------------

ROW_HEIGHT = 28
LABEL_WIDTH = 230
MAX_LABEL_CHARS = 34


def hbar_chart(
    *,
    chart_id: str,
    title: str,
    desc: str,
    labels: Sequence[str],
    values: Sequence[float],
    color: str = PALETTE[0],
    fmt: Formatter = format_number,
    unit: str = "",
) -> SafeString:
    """One labelled bar per row, longest first as given; the value is written at the end of each bar."""
    height = MARGIN_TOP // 2 + ROW_HEIGHT * max(len(labels), 1) + 8
    plot_left, plot_right = LABEL_WIDTH, WIDTH - 90
    top = max(values, default=0) or 1
    parts = [_svg_open(chart_id, title, desc, height)]
    for index, (label, value) in enumerate(zip(labels, values)):
        y = MARGIN_TOP // 2 + ROW_HEIGHT * index
        width = max((plot_right - plot_left) * (value / top), 1)
        shown = label if len(label) <= MAX_LABEL_CHARS else label[: MAX_LABEL_CHARS - 1] + "…"
        text = f"{fmt(value)} {unit}".strip()
        parts.append(
            f'<g class="row"><title>{escape(f"{label}: {text}")}</title>'
            f'<text x="{plot_left - 10}" y="{y + ROW_HEIGHT / 2 + 4:.1f}" text-anchor="end" '
            f'fill="#1b1f24">{escape(shown)}</text><rect x="{plot_left}" y="{y + 4}" width="{width:.1f}" '
            f'height="{ROW_HEIGHT - 8}" rx="3" fill="{color}"/>'
            f'<text x="{plot_left + width + 8:.1f}" y="{y + ROW_HEIGHT / 2 + 4:.1f}" fill="{INK}" '
            f'font-variant-numeric="tabular-nums">{escape(text)}</text></g>'
        )
    parts.append(
        f'<line x1="{plot_left}" y1="{MARGIN_TOP // 2}" x2="{plot_left}" y2="{height - 8}" stroke="{AXIS}"/>'
    )
    parts.append("</svg>")
    return mark_safe("".join(parts))
