"""charts.py: axes that read well, gaps that show, and text that cannot break out of the SVG."""

import re
from datetime import UTC, datetime, timedelta

import pytest

from portal.console import charts

START = datetime(2025, 3, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    "maximum, integer, expected",
    [
        (32, True, (40, 10)),
        (7, True, (8, 2)),
        (3, True, (3, 1)),
        (0.8, False, (0.8, 0.2)),
        (14.5, False, (15, 5)),
        (0, True, (4, 1)),
        (0, False, (1, 0.25)),
        (1234, False, (1500, 500)),
    ],
)
def test_it_picks_round_axis_steps(maximum, integer, expected):
    top, step = charts.nice_scale(maximum, integer=integer)

    assert (top, step) == pytest.approx(expected)
    assert top >= maximum


@pytest.mark.parametrize(
    "span",
    [timedelta(hours=6), timedelta(days=1), timedelta(days=7), timedelta(days=90), timedelta(days=400)],
)
def test_it_labels_the_time_axis_with_a_few_round_moments(span):
    ticks = charts.time_ticks(START + timedelta(minutes=7), START + span)

    assert 2 <= len(ticks) <= charts.MAX_X_LABELS
    assert all(START <= moment <= START + span for moment, _ in ticks)


def test_it_names_days_and_hours_on_the_time_axis():
    labels = [
        label for _, label in charts.time_ticks(START - timedelta(hours=12), START + timedelta(hours=12))
    ]

    assert "Mar 1" in labels and "06:00" in labels


def test_it_breaks_a_line_where_samples_are_missing():
    times = [START + timedelta(minutes=5 * n) for n in range(6)] + [START + timedelta(hours=5)]

    segments = charts._segments(times, [1, 2, 3, None, 5, 6, 7])

    assert [[value for _, value in segment] for segment in segments] == [[1, 2, 3], [5, 6], [7]]


def test_it_draws_a_line_chart_with_each_series_and_a_legend():
    times = [START + timedelta(hours=n) for n in range(4)]

    svg = charts.line_chart(
        chart_id="chart-x",
        title="GPUs",
        desc="Two series",
        times=times,
        start=START,
        end=times[-1],
        series=[
            charts.Series("Total", [8, 8, 8, 8], dashed=True),
            charts.Series("Allocated", [1, 4, None, 2], area=True),
        ],
        integer=True,
    )

    assert svg.startswith('<svg xmlns="http://www.w3.org/2000/svg"') and svg.endswith("</svg>")
    assert '<title id="chart-x-title">GPUs</title><desc id="chart-x-desc">Two series</desc>' in svg
    assert re.findall(r'data-series="([^"]+)"', svg) == ["Total", "Allocated"]
    # Allocated is missing at 02:00: two pieces of line, and a tooltip for each value there is.
    allocated = svg.split('data-series="Allocated"')[1]
    assert allocated.count("<polyline") == 2
    assert "2025-03-01 01:00 · Allocated: 4" in svg and "Allocated: None" not in svg


def test_it_stacks_or_groups_bars():
    series = [charts.Series("Email", [1, 2]), charts.Series("GitHub", [3, 0])]

    stacked = charts.bar_chart(
        chart_id="s", title="t", desc="d", labels=["a", "b"], series=series, stacked=True
    )
    grouped = charts.bar_chart(chart_id="g", title="t", desc="d", labels=["a", "b"], series=series)

    def bars(svg):
        return [(float(x), float(y)) for x, y in re.findall(r'<rect x="([\d.]+)" y="([\d.]+)" width', svg)]

    # Stacked: a's GitHub bar sits on its Email bar, at the same x. Grouped: side by side.
    assert bars(stacked)[0][0] == bars(stacked)[2][0] and bars(stacked)[2][1] < bars(stacked)[0][1]
    assert bars(grouped)[0][0] < bars(grouped)[2][0]
    # A zero draws no bar; its tooltip is not there either.
    assert "b · GitHub" not in grouped


def test_it_escapes_labels_names_and_titles():
    evil = '</text><script>alert(1)</script>"'

    svgs = [
        charts.hbar_chart(chart_id="h", title=evil, desc=evil, labels=[evil], values=[3]),
        charts.bar_chart(
            chart_id="b", title=evil, desc=evil, labels=[evil], series=[charts.Series(evil, [1])]
        ),
        charts.line_chart(
            chart_id="l",
            title=evil,
            desc=evil,
            times=[START],
            start=START,
            end=START + timedelta(hours=1),
            series=[charts.Series(evil, [1])],
        ),
    ]

    for svg in svgs:
        assert "<script>" not in svg
        assert "&lt;script&gt;" in svg


def test_it_shortens_long_labels_but_keeps_them_whole_in_the_tooltip():
    label = "a-very-long-address-for-a-developer@university.example.edu"

    svg = charts.hbar_chart(chart_id="h", title="t", desc="d", labels=[label], values=[2.5], unit="GPU-h")

    assert f"<title>{label}: 2.5 GPU-h</title>" in svg
    assert ">a-very-long-address-for-a-develop…</text>" in svg


def test_it_labels_small_axis_ticks_distinctly():
    # A day with a few GPU-minutes burned has ticks 0.0025 apart; they must not all read "0.01".
    from portal.console.charts import format_number

    labels = [format_number(tick) for tick in (0, 0.0025, 0.005, 0.0075, 0.01)]

    assert len(set(labels)) == 5
