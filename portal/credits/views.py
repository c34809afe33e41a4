"""The developer's credit pages. Every read is scoped to request.user; no page takes another user's id."""

from datetime import timedelta

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET

from portal.instances import efficiency
from portal.instances.models import Instance
from portal.instances.selectors import credits_exhausted_notice

from . import selectors, services
from .forms import BonusApplyForm
from .models import hours


def dashboard(request):
    if not request.user.is_authenticated:
        return _front_page(request)
    # One read gives the latest entries and, through their account, the balance; the account is read on
    # its own only for someone with no entries yet.
    entries = list(selectors.ledger_for(request.user, limit=selectors.DASHBOARD_LEDGER_ROWS + 1))
    balance = entries[0].account.balance_gpu_seconds if entries else selectors.balance_for(request.user)
    # The grant is named only to someone who has yet to confirm their address.
    program = None if request.user.email_verified else selectors.current_signup_program()
    return render(
        request,
        "credits/dashboard.html",
        {
            "balance_gpu_seconds": balance,
            "balance_hours": hours(balance),
            # One row more than is shown tells whether "Full history" has more to show.
            "entries": entries,
            "entries_shown": selectors.DASHBOARD_LEDGER_ROWS,
            "offers": selectors.size_offers(balance),
            "application_counts": selectors.application_counts_for(request.user),
            "signup_grant_hours": hours(program.gpu_seconds) if program else None,
            "credits_notice": credits_exhausted_notice(request.user),
        },
    )


@login_required
@require_GET
def history(request):
    """Every credit movement of the person, newest first, a page at a time (?page=N)."""
    paginator = Paginator(selectors.ledger_of(request.user), selectors.HISTORY_PAGE_ROWS)
    page = paginator.get_page(request.GET.get("page"))
    return render(
        request,
        "credits/history.html",
        {"page": page, "balance_hours": hours(selectors.balance_for(request.user))},
    )


EFFICIENCY_INSTANCE_ROWS = 100


@login_required
@require_GET
def efficiency_report(request):
    """The person's own credit spent, and spent while their GPUs sat idle, over ?days= (7, 30 or 90)."""
    days = efficiency.report_window_days(request.GET.get("days"))
    since = timezone.now() - timedelta(days=days)
    instances = efficiency.billed_in_window(Instance.objects.filter(user=request.user), start=since)
    return render(
        request,
        "credits/efficiency.html",
        {
            "days": days,
            "windows": sorted(efficiency.REPORT_WINDOW_DAYS),
            "total": efficiency.efficiency_total(instances),
            "by_image": efficiency.efficiency_by(instances, field="image__name", label="(no image)"),
            # CI runs can make hundreds in a window; the totals above count them all.
            "by_instance": efficiency.efficiency_per_instance(instances, limit=EFFICIENCY_INSTANCE_ROWS),
            "instance_rows": EFFICIENCY_INSTANCE_ROWS,
        },
    )


def _front_page(request):
    """What a logged-out visitor sees at /: what DevCloud is, in one screen, with Sign up and Log in."""
    from portal.instances.models import Image
    from portal.instances.sizes import SIZES

    program = selectors.current_signup_program()
    return render(
        request,
        "front.html",
        {
            "signup_grant_hours": hours(program.gpu_seconds) if program else None,
            "bonus_cap_hours": settings.BONUS_CAP_GPU_HOURS,
            "sizes": list(SIZES.values()),
            "images": list(Image.objects.filter(is_enabled=True)),
        },
    )


@login_required
def bonus(request):
    programs = selectors.open_programs()
    if request.method == "POST":
        form = BonusApplyForm(request.POST, programs=programs)
        if form.is_valid():
            program = form.cleaned_data["program"]
            try:
                application = services.bonus_apply(
                    user=request.user, program=program, evidence=form.cleaned_data["evidence"]
                )
            except ValidationError as error:
                # The service's message is written for the applicant; the form keeps what they typed.
                form.add_error(None, error)
            else:
                if application.status == application.Status.APPROVED:
                    messages.success(
                        request,
                        f"Your certificate ID is on the {program.name} list: "
                        f"{application.granted_hours} GPU-hours were added.",
                    )
                else:
                    messages.success(request, f"Your application for {program.name} was sent for review.")
                return redirect("credits:bonus")

    applications = list(selectors.applications_for(request.user))
    live = {a.program_id: a for a in applications if a.status != a.Status.REJECTED}
    if request.method != "POST":
        # Preselect a program the user has not applied to yet.
        first_open = next((program for program in programs if program.pk not in live), None)
        form = BonusApplyForm(programs=programs, initial={"program": first_open})
    return render(
        request,
        "credits/bonus.html",
        {
            "form": form,
            "programs": [(program, live.get(program.pk)) for program in programs],
            "applications": applications,
            "can_apply": request.user.email_verified,
            "bonus_cap_hours": settings.BONUS_CAP_GPU_HOURS,
        },
    )
