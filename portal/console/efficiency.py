"""The operators' GPU efficiency report: credit spent, and spent while GPUs sat idle, for the whole fleet
by user, project and image, with a chart of the users who left the most idle, and its CSV rows.

The figures come from portal.instances.efficiency (how busy time is sampled and what counts as idle).
"""

from dataclasses import dataclass
from datetime import timedelta

from django.utils import timezone
from django.utils.safestring import SafeString

from portal.instances import efficiency
from portal.instances.models import Instance

from . import charts
from .dashboard import two_decimals

# Users in the chart; the tables list everyone.
CHART_USERS = 10
IDLE_COLOR = charts.PALETTE[1]
CSV_HEADER = [
    "group",
    "name",
    "instances",
    "charged_gpu_hours",
    "idle_gpu_hours",
    "idle_percent_of_measured",
    "unmeasured_gpu_hours",
]
# (key, heading, field grouped by, label of a null value)
GROUPS = [
    ("user", "User", "user__email", "(no user)"),
    ("project", "Project", "project__slug", "(personal)"),
    ("image", "Image", "image__name", "(no image)"),
]


@dataclass
class FleetEfficiency:
    days: int
    total: efficiency.Efficiency
    # key -> (heading, [(label, Efficiency)])
    groups: dict
    chart: SafeString | None


def fleet_efficiency(days: int) -> FleetEfficiency:
    """The report over the last `days` days: a few aggregate queries, whatever the fleet's size."""
    instances = efficiency.billed_in_window(
        Instance.objects.all(), start=timezone.now() - timedelta(days=days)
    )
    groups = {
        key: (heading, efficiency.efficiency_by(instances, field=field, label=label))
        for key, heading, field, label in GROUPS
    }
    return FleetEfficiency(
        days=days,
        total=efficiency.efficiency_total(instances),
        groups=groups,
        chart=idle_by_user_chart(groups["user"][1], days),
    )


def idle_by_user_chart(rows, days: int) -> SafeString | None:
    """Horizontal bars of the CHART_USERS users with the most idle GPU-hours; None when nobody has any."""
    rows = [(label, row) for label, row in rows if row.idle_charged > 0][:CHART_USERS]
    if not rows:
        return None
    values = [round(row.idle_charged / 3600, 2) for _, row in rows]
    return charts.hbar_chart(
        chart_id="chart-idle-by-user",
        title=f"Top {len(rows)} users by GPU-hours spent while GPUs sat idle, last {days} days",
        desc="; ".join(f"{label}: {value:,.2f}" for (label, _), value in zip(rows, values)),
        labels=[label for label, _ in rows],
        values=values,
        color=IDLE_COLOR,
        fmt=two_decimals,
        unit="GPU-h",
    )


def csv_rows(report: FleetEfficiency):
    """The header, then one row per user, project and image (each group in the report's order)."""
    yield CSV_HEADER
    for key, (_, rows) in report.groups.items():
        for label, row in rows:
            yield [
                key,
                label,
                row.instances,
                f"{row.charged / 3600:.2f}",
                f"{row.idle_charged / 3600:.2f}",
                "" if row.idle_percent is None else row.idle_percent,
                f"{row.unmeasured_charged / 3600:.2f}",
            ]
