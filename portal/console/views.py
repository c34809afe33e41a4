"""Staff pages: the dashboard with charts, the audit log and the GPU efficiency report, with CSV exports."""

import csv
import json
from functools import wraps

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.core.serializers.json import DjangoJSONEncoder
from django.http import StreamingHttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone

from portal.audit.services import AUDIT_ACTIONS
from portal.instances.efficiency import REPORT_WINDOW_DAYS, report_window_days

from . import dashboard as dashboard_content
from . import efficiency as efficiency_content
from . import selectors
from .forms import AuditFilters
from .timeranges import PRESETS, resolve_range

AUDIT_PAGE_SIZE = 50
AUDIT_CSV_HEADER = [
    "created_at",
    "actor",
    "actor_id",
    "action",
    "target_type",
    "target_id",
    "target",
    "reason",
    "details",
]
# Spreadsheets run a cell that starts with one of these as a formula; target names and reasons can
# come from users (names, emails), so exported cells never start with one.
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")


def staff_only(view):
    """Anonymous visitors go to the admin login; signed-in people who are not active staff get 403."""

    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path(), reverse("admin:login"))
        if not (request.user.is_active and request.user.is_staff):
            raise PermissionDenied("The operator console is for staff.")
        return view(request, *args, **kwargs)

    return wrapper


def require_audit_access(user):
    # The same permission that shows the read-only log in Django admin.
    if not user.has_perm("console.view_auditentry"):
        raise PermissionDenied("Reading the audit log needs the 'view audit entry' permission.")


@staff_only
def dashboard(request):
    time_range, errors = resolve_range(request.GET)
    context = dashboard_content.build(time_range)
    context.update(
        {
            "time_range": time_range,
            "range_errors": errors,
            "presets": [(key, label) for key, (label, _) in PRESETS.items()],
            "custom_from": request.GET.get("from", "") if not errors else "",
            "custom_to": request.GET.get("to", "") if not errors else "",
        }
    )
    return render(request, "console/dashboard.html", context)


def action_choices() -> list[tuple[str, str]]:
    codes = sorted(set(AUDIT_ACTIONS) | set(selectors.audit_actions_used()))
    return [(code, AUDIT_ACTIONS.get(code, code)) for code in codes]


@staff_only
def audit(request):
    require_audit_access(request.user)
    filters = AuditFilters.from_params(request.GET)
    entries = selectors.audit_entries(**filters.selector_kwargs())
    page = Paginator(entries, AUDIT_PAGE_SIZE).get_page(request.GET.get("page"))
    return render(
        request,
        "console/audit.html",
        {
            "filters": filters,
            "page": page,
            "action_choices": action_choices(),
            "action_labels": AUDIT_ACTIONS,
            "querystring": filters.querystring(),
        },
    )


class _Echo:
    """A file-like object whose write returns the line, so csv.writer can feed a streaming response."""

    def write(self, value):
        return value


def csv_cell(value) -> str:
    text = "" if value is None else str(value)
    return "'" + text if text.startswith(FORMULA_PREFIXES) else text


def audit_rows(entries):
    yield AUDIT_CSV_HEADER
    for entry in entries.iterator(chunk_size=2000):
        yield [
            entry.created_at.isoformat(),
            csv_cell(entry.actor_name),
            entry.actor_id or "",
            entry.action,
            entry.target_type,
            csv_cell(entry.target_id),
            csv_cell(entry.target_repr),
            csv_cell(entry.reason),
            json.dumps(entry.details, cls=DjangoJSONEncoder, sort_keys=True) if entry.details else "",
        ]


@staff_only
def audit_export(request):
    """The entries matching the page's filters as CSV, streamed (the log can be long), newest first."""
    require_audit_access(request.user)
    filters = AuditFilters.from_params(request.GET)
    entries = selectors.audit_entries(**filters.selector_kwargs())
    writer = csv.writer(_Echo())
    response = StreamingHttpResponse(
        (writer.writerow(row) for row in audit_rows(entries)), content_type="text/csv; charset=utf-8"
    )
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    response["Content-Disposition"] = f'attachment; filename="devcloud-audit-{stamp}.csv"'
    return response


@staff_only
def efficiency(request):
    """The fleet's credit spent while GPUs sat idle, by user, project and image, over ?days= (7, 30, 90)."""
    report = efficiency_content.fleet_efficiency(report_window_days(request.GET.get("days")))
    return render(
        request, "console/efficiency.html", {"report": report, "windows": sorted(REPORT_WINDOW_DAYS)}
    )


@staff_only
def efficiency_export(request):
    """The efficiency report's rows (every user, project and image) as CSV."""
    report = efficiency_content.fleet_efficiency(report_window_days(request.GET.get("days")))
    writer = csv.writer(_Echo())
    response = StreamingHttpResponse(
        (
            writer.writerow([csv_cell(cell) for cell in row])
            for row in efficiency_content.csv_rows(report)
        ),
        content_type="text/csv; charset=utf-8",
    )
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    response["Content-Disposition"] = (
        f'attachment; filename="devcloud-efficiency-{report.days}d-{stamp}.csv"'
    )
    return response
