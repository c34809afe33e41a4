"""The staff dashboard's content: summary figures and one panel per chart, built from selectors and charts.

A panel without data carries a "No data yet" message instead of an empty chart.
"""

from dataclasses import dataclass, field
from datetime import datetime

from django.utils import timezone
from django.utils.safestring import SafeString

from portal.credits.models import GPU_SECONDS_PER_HOUR
from provisioning.models import GpuHost

from . import charts, health, selectors
from .timeranges import BUCKET_STEPS, TimeRange

BURN_COLOR = "#e69f00"
GRANT_COLOR = "#009e73"
EMAIL_COLOR = "#0b5cad"
GITHUB_COLOR = "#24292f"
TOTAL_COLOR = "#9aa1a9"
PEAK_COLOR = "#56b4e9"
NO_SAMPLES = (
    "No data yet: there are no capacity samples in this range. The beat task console.record_sample "
    "stores one every few minutes while Celery beat runs."
)


@dataclass
class Panel:
    key: str
    title: str
    svg: SafeString | None = None
    empty_message: str = ""
    note: str = ""
    # Extra rows for a data table under the chart (top users).
    rows: list = field(default_factory=list)


@dataclass(frozen=True)
class Figure:
    label: str
    value: str
    detail: str = ""


def gpu_hours(gpu_seconds: float) -> float:
    return gpu_seconds / GPU_SECONDS_PER_HOUR


def two_decimals(value: float) -> str:
    """GPU-hours are always shown with two decimals (docs/architecture.md, "Credits")."""
    return f"{value:,.2f}"


def short_label(moment: datetime, bucket: str) -> str:
    local = timezone.localtime(moment)
    if bucket == "hour" and (local.hour or local.minute):
        return f"{local:%H:%M}"
    return f"{local:%b} {local.day}"


def long_label(moment: datetime, bucket: str) -> str:
    local = timezone.localtime(moment)
    return f"{local:%Y-%m-%d %H:%M}" if bucket == "hour" else f"{local:%Y-%m-%d}"


def per(bucket: str) -> str:
    return "per hour" if bucket == "hour" else "per day"


def minutes(seconds: float) -> float:
    return round(seconds / 60, 1)


# Side-by-side bars stop being readable past this many buckets (90 days at two series is 2px a bar);
# longer ranges draw the same series as lines.
MAX_GROUPED_BUCKETS = 45


def grouped_chart(
    *,
    chart_id: str,
    title: str,
    desc: str,
    moments: list[datetime],
    bucket: str,
    series: list[charts.Series],
    time_range: TimeRange,
    y_label: str,
    tooltip_labels: list[str] | None = None,
    value_fmt: charts.Formatter | None = None,
) -> SafeString:
    """Grouped bars per bucket, or lines through the buckets' middles when there are too many for bars."""
    if len(moments) <= MAX_GROUPED_BUCKETS:
        return charts.bar_chart(
            chart_id=chart_id,
            title=title,
            desc=desc,
            labels=[short_label(moment, bucket) for moment in moments],
            tooltip_labels=tooltip_labels or [long_label(moment, bucket) for moment in moments],
            series=series,
            y_label=y_label,
            value_fmt=value_fmt,
        )
    half = BUCKET_STEPS[bucket] / 2
    return charts.line_chart(
        chart_id=chart_id,
        title=title,
        desc=desc,
        times=[moment + half for moment in moments],
        series=series,
        start=time_range.start,
        end=time_range.end,
        y_label=y_label,
        value_fmt=value_fmt,
    )


def capacity_series(points: list[selectors.CapacityPoint], *, averaged: bool) -> list[charts.Series]:
    total = charts.Series("Total", [round(point.gpus_total, 2) for point in points], TOTAL_COLOR, dashed=True)
    allocated = [round(point.gpus_allocated, 2) for point in points]
    if not averaged:
        return [total, charts.Series("Allocated", allocated, EMAIL_COLOR, area=True)]
    # An average over an hour or a day hides the busy moments that decide whether a launch waits.
    peak = charts.Series("Peak allocated", [point.peak_allocated for point in points], PEAK_COLOR)
    return [total, peak, charts.Series("Average allocated", allocated, EMAIL_COLOR, area=True)]


def capacity_panels(time_range: TimeRange) -> list[Panel]:
    points = selectors.capacity_series(time_range)
    capacity = Panel("capacity", "GPUs allocated vs total")
    queue = Panel("queue", "Launch queue length")
    if not points:
        capacity.empty_message = queue.empty_message = NO_SAMPLES
        return [capacity, queue]
    times = [point.at for point in points]
    peak = max(points, key=lambda point: point.peak_allocated)
    latest = points[-1]
    capacity.svg = charts.line_chart(
        chart_id="chart-capacity",
        title=f"GPUs allocated vs total, {time_range.label}",
        desc=(
            f"GPUs allocated and in service, {len(points)} points. Most allocated at once "
            f"{peak.peak_allocated} of {charts.format_number(round(peak.gpus_total, 1))}; "
            f"latest {charts.format_number(round(latest.gpus_allocated, 1))} "
            f"of {charts.format_number(round(latest.gpus_total, 1))}."
        ),
        times=times,
        series=capacity_series(points, averaged=time_range.sample_bucket != "minute"),
        start=time_range.start,
        end=time_range.end,
        y_label="GPUs",
        integer=True,
    )
    longest = max(point.oldest_queued_wait_seconds for point in points)
    queue.svg = charts.line_chart(
        chart_id="chart-queue",
        title=f"Launch queue length, {time_range.label}",
        desc=(
            f"Most launches waiting at once: {max(point.queue_length for point in points)}; "
            f"longest wait of a queued launch: {minutes(longest)} minutes."
        ),
        times=times,
        series=[
            charts.Series("Queued launches", [point.queue_length for point in points], BURN_COLOR, area=True)
        ],
        start=time_range.start,
        end=time_range.end,
        y_label="launches",
        integer=True,
    )
    queue.note = f"Longest any queued launch had waited at a sample: {minutes(longest)} min."
    return [capacity, queue]


def burn_panel(flow: selectors.CreditFlow, time_range: TimeRange) -> Panel:
    panel = Panel("burn", f"GPU-hours burned {per(flow.bucket)}")
    total = sum(value for _, value in flow.burned)
    if not total:
        panel.empty_message = "No data yet: no GPU-hours were burned in this range."
        return panel
    panel.svg = charts.bar_chart(
        chart_id="chart-burn",
        title=f"GPU-hours burned {per(flow.bucket)}, {time_range.label}",
        desc=f"{gpu_hours(total):,.2f} GPU-hours burned in total over {len(flow.burned)} buckets.",
        labels=[short_label(moment, flow.bucket) for moment, _ in flow.burned],
        tooltip_labels=[long_label(moment, flow.bucket) for moment, _ in flow.burned],
        series=[
            charts.Series("Burned", [round(gpu_hours(value), 2) for _, value in flow.burned], BURN_COLOR)
        ],
        y_label="GPU-hours",
        value_fmt=two_decimals,
    )
    return panel


def credits_panel(flow: selectors.CreditFlow, time_range: TimeRange) -> Panel:
    panel = Panel("credits", f"Credits granted vs burned {per(flow.bucket)}")
    granted = sum(value for _, value in flow.granted)
    burned = sum(value for _, value in flow.burned)
    if not granted and not burned:
        panel.empty_message = "No data yet: no credits were granted or burned in this range."
        return panel
    panel.svg = grouped_chart(
        chart_id="chart-credits",
        title=f"Credits granted vs burned {per(flow.bucket)}, {time_range.label}",
        desc=f"Granted {gpu_hours(granted):,.2f} GPU-hours (sign-up grants, operator grants and bonuses); "
        f"burned {gpu_hours(burned):,.2f}.",
        moments=[moment for moment, _ in flow.granted],
        bucket=flow.bucket,
        series=[
            charts.Series("Granted", [round(gpu_hours(value), 2) for _, value in flow.granted], GRANT_COLOR),
            charts.Series("Burned", [round(gpu_hours(value), 2) for _, value in flow.burned], BURN_COLOR),
        ],
        time_range=time_range,
        y_label="GPU-hours",
        value_fmt=two_decimals,
    )
    return panel


def signups_panel(time_range: TimeRange) -> Panel:
    found = selectors.signups(time_range)
    panel = Panel("signups", f"Sign-ups {per(found.bucket)}")
    by_email = sum(count for _, count in found.by_email)
    by_github = sum(count for _, count in found.by_github)
    if not by_email and not by_github:
        panel.empty_message = "No data yet: nobody signed up in this range."
        return panel
    panel.svg = charts.bar_chart(
        chart_id="chart-signups",
        title=f"Sign-ups {per(found.bucket)} by email or GitHub, {time_range.label}",
        desc=f"{by_email + by_github} sign-ups: {by_email} by email, {by_github} with GitHub.",
        labels=[short_label(moment, found.bucket) for moment, _ in found.by_email],
        tooltip_labels=[long_label(moment, found.bucket) for moment, _ in found.by_email],
        series=[
            charts.Series("Email", [count for _, count in found.by_email], EMAIL_COLOR),
            charts.Series("GitHub", [count for _, count in found.by_github], GITHUB_COLOR),
        ],
        stacked=True,
        y_label="accounts",
        integer=True,
    )
    return panel


def wait_panel(time_range: TimeRange) -> Panel:
    bucket, waits = selectors.queue_waits(time_range)
    panel = Panel("wait", f"Wait in the launch queue {per(bucket)}")
    launches = sum(wait.launches for wait in waits)
    if not launches:
        panel.empty_message = "No data yet: no launch got its GPUs in this range."
        return panel
    longest = max(wait.longest_seconds for wait in waits)
    panel.svg = grouped_chart(
        chart_id="chart-wait",
        title=f"Wait in the launch queue {per(bucket)}, {time_range.label}",
        desc=(
            f"{launches} launch{'es' if launches != 1 else ''} got GPUs; "
            f"the longest waited {minutes(longest)} minutes."
        ),
        moments=[wait.at for wait in waits],
        bucket=bucket,
        tooltip_labels=[f"{long_label(wait.at, bucket)} ({wait.launches} launches)" for wait in waits],
        series=[
            charts.Series("Average", [minutes(wait.average_seconds) for wait in waits], EMAIL_COLOR),
            charts.Series("Longest", [minutes(wait.longest_seconds) for wait in waits], BURN_COLOR),
        ],
        time_range=time_range,
        y_label="minutes",
    )
    panel.note = "From the launch request to its first GPU, by the hour or day the launch was requested."
    return panel


def top_users_panel(time_range: TimeRange) -> Panel:
    burners = selectors.top_burners(time_range)
    panel = Panel("top-users", "Top users by burn")
    if not burners:
        panel.empty_message = "No data yet: nobody burned GPU-hours in this range."
        return panel
    panel.svg = charts.hbar_chart(
        chart_id="chart-top-users",
        title=f"Top {len(burners)} users by GPU-hours burned, {time_range.label}",
        desc="; ".join(f"{burner.email}: {gpu_hours(burner.gpu_seconds):,.2f}" for burner in burners),
        labels=[burner.email for burner in burners],
        values=[round(gpu_hours(burner.gpu_seconds), 2) for burner in burners],
        color=BURN_COLOR,
        fmt=two_decimals,
        unit="GPU-h",
    )
    panel.rows = [(burner, f"{gpu_hours(burner.gpu_seconds):,.2f}") for burner in burners]
    return panel


def figures(time_range: TimeRange, flow: selectors.CreditFlow) -> list[Figure]:
    fleet = selectors.fleet_now()
    share = (
        f"{fleet.gpus_allocated / fleet.gpus_total:.0%} in use" if fleet.gpus_total else "no GPUs in service"
    )
    queue_detail = (
        f"oldest waiting {minutes(fleet.oldest_queued_wait_seconds)} min"
        if fleet.queue_length
        else "nobody waiting"
    )
    return [
        Figure("GPUs allocated now", f"{fleet.gpus_allocated} / {fleet.gpus_total}", share),
        Figure("Running instances", str(fleet.running_instances)),
        Figure("Queued launches", str(fleet.queue_length), queue_detail),
        Figure(
            "GPU-hours burned", f"{gpu_hours(sum(v for _, v in flow.burned)):,.2f}", time_range.label.lower()
        ),
        Figure(
            "GPU-hours granted",
            f"{gpu_hours(sum(v for _, v in flow.granted)):,.2f}",
            time_range.label.lower(),
        ),
    ]


def build(time_range: TimeRange) -> dict:
    """Template context for the dashboard: `figures` (the fleet now, totals in range) and `panels`."""
    flow = selectors.credit_flow(time_range)
    capacity, queue = capacity_panels(time_range)
    panels = [
        capacity,
        burn_panel(flow, time_range),
        signups_panel(time_range),
        credits_panel(flow, time_range),
        queue,
        wait_panel(time_range),
        top_users_panel(time_range),
    ]
    return {
        "figures": figures(time_range, flow),
        "panels": panels,
        "blockers": selectors.launch_blockers(),
        # The Celery workers and beat: a ping per queue, and when each beat task last ran.
        "background": health.background(),
        "simulated_hosts": list(GpuHost.objects.filter(is_simulated=True).exclude(state=GpuHost.State.RETIRED)),
    }
