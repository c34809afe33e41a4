"""Instance pages: the list with the launch form, an instance's live progress, launch and stop.

Every view that takes an instance id looks it up through selectors.instance_of_owner, which answers
404 for someone else's instance exactly as for one that does not exist.
"""

from datetime import UTC, datetime, timedelta

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, JsonResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.cache import add_never_cache_headers
from django.views.decorators.http import require_GET, require_POST

from portal.credits.models import hours

from . import reservations, selectors, services
from .efficiency import instance_efficiency
from .forms import ExtendForm, LaunchForm, ReservationForm
from .sizes import GB, disk_limit_bytes, workspace_limit_bytes


def _list_page(request, form, *, status=200):
    instances = selectors.instances_of(request.user)
    context = {
        "form": form,
        "options": selectors.launch_options(request.user, instances=instances),
        "instances": instances,
        "pay_from": selectors.launch_projects_of(request.user),
        "credits_notice": selectors.credits_exhausted_notice(request.user, instances=instances),
    }
    return render(request, "instances/list.html", context, status=status)


@login_required
@require_GET
def instance_list(request):
    # The dashboard links here with ?size=8x to preselect that size.
    return _list_page(request, LaunchForm(initial={"size": request.GET.get("size", "")}))


@login_required
@require_POST
def instance_launch(request):
    form = LaunchForm(request.POST)
    if form.is_valid():
        try:
            instance = services.instance_launch(
                user=request.user,
                size=form.cleaned_data["size"],
                image_key=form.cleaned_data["image"],
                project=form.cleaned_data["project"] or None,
            )
        except Http404:
            form.add_error("project", "You are not in that project. Choose one of yours, or pay yourself.")
        except services.LaunchUnavailable as error:
            form.add_error(None, error)
            return _list_page(request, form, status=503)
        except ValidationError as error:
            form.add_error(None, error)
        else:
            messages.success(request, "Launch queued. This page follows its progress.")
            return redirect("instances:detail", instance_id=instance.id)
    return _list_page(request, form, status=400)


@login_required
@require_GET
def instance_detail(request, instance_id):
    instance = selectors.instance_of_owner(request.user, instance_id)
    return render(
        request,
        "instances/detail.html",
        {
            "instance": instance,
            "status": selectors.instance_status(instance),
            "simulated": selectors.runs_on_simulated_gpus(instance),
            "efficiency": instance_efficiency(instance),
            "workspace_gb": workspace_limit_bytes(instance.size) // GB,
            "disk_gb": disk_limit_bytes(instance.size) // GB,
            # What its host's engine could not limit (provisioning/drivers/docker.py, under
            # DEVCLOUD_DISK_LIMITS=warn): the page must not promise a limit nobody enforces.
            "unenforced": (instance.driver_state or {}).get("disk_limits_unenforced", []),
            "session": selectors.session_status(instance),
            "extend_form": ExtendForm(auto_id="extend-%s"),
        },
    )


@login_required
@require_GET
def instance_status(request, instance_id):
    instance = selectors.instance_of_owner(request.user, instance_id)
    response = JsonResponse(selectors.instance_status(instance))
    add_never_cache_headers(response)
    return response


@login_required
@require_POST
def instance_stop(request, instance_id):
    try:
        instance = services.instance_stop(user=request.user, instance_id=instance_id)
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
        return redirect("instances:detail", instance_id=instance_id)
    if instance.state == instance.State.STOPPED:
        messages.success(request, "Stopped before it started. Nothing was charged.")
    else:
        messages.success(request, "Stopping. Billing has stopped; your /workspace files are kept.")
    return redirect("instances:detail", instance_id=instance.id)


@login_required
@require_POST
def instance_extend(request, instance_id):
    form = ExtendForm(request.POST)
    if not form.is_valid():
        messages.error(request, " ".join(form.errors["hours"]))
        return redirect("instances:detail", instance_id=instance_id)
    hours = form.cleaned_data["hours"]
    try:
        services.instance_extend(user=request.user, instance_id=instance_id, hours=hours)
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
    else:
        messages.success(request, f"Extended by {hours} hour{'s' if hours != 1 else ''}.")
    return redirect("instances:detail", instance_id=instance_id)


def _calendar_context(now) -> dict:
    return {"calendar": reservations.free_calendar(now=now), "calendar_hours": range(24)}


def _reservations_page(request, form, *, status=200):
    now = timezone.now()
    whole_host_free = reservations.next_free_start(gpus=8, duration=timedelta(hours=1), after=now, now=now)
    context = {
        **_calendar_context(now),
        "form": form,
        "reservations": reservations.reservations_of(request.user),
        "held_hours": hours(selectors.held_gpu_seconds(user=request.user)),
        "whole_host_free": whole_host_free,
        "now": now,
    }
    return render(request, "instances/reservations.html", context, status=status)


def _picked_hour(query) -> dict:
    """The booking form's start and end from an hour picked on the calendar (?starts_at=...&gpus=8): a
    one-hour window to lengthen. Anything unreadable is ignored."""
    try:
        starts_at = datetime.strptime(query.get("starts_at", ""), "%Y-%m-%dT%H:%M")
    except ValueError:
        return {}
    initial = {"starts_at": starts_at, "ends_at": starts_at + timedelta(hours=1)}
    if query.get("gpus", "").isdigit():
        initial["gpus"] = int(query["gpus"])
    return initial


@login_required
def reservation_list(request):
    """The person's bookings and the form to book (GET), or a booking (POST)."""
    if request.method != "POST":
        return _reservations_page(request, ReservationForm(initial=_picked_hour(request.GET)))
    form = ReservationForm(request.POST)
    if form.is_valid():
        data = form.cleaned_data
        try:
            booked = reservations.reservation_book(
                user=request.user,
                gpus=data["gpus"],
                # The form's times are UTC, whatever the server's time zone.
                starts_at=timezone.make_naive(data["starts_at"]).replace(tzinfo=UTC),
                ends_at=timezone.make_naive(data["ends_at"]).replace(tzinfo=UTC),
                project=data["project"] or None,
            )
        except Http404:
            form.add_error("project", "You are not in that project.")
        except PermissionDenied as error:
            form.add_error("project", str(error))
        except ValidationError as error:
            form.add_error(None, error)
        else:
            messages.success(
                request,
                f"Booked {booked.gpus} GPU{'s' if booked.gpus != 1 else ''} from "
                f"{booked.starts_at:%Y-%m-%d %H:%M} to {booked.ends_at:%Y-%m-%d %H:%M} UTC.",
            )
            return redirect("instances:reservations")
    return _reservations_page(request, form, status=400)


@login_required
@require_POST
def reservation_cancel(request, reservation_id):
    try:
        reservations.reservation_cancel(user=request.user, reservation_id=reservation_id)
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
    else:
        messages.success(request, "Booking cancelled. Its credit is free again; nothing was charged.")
    return redirect("instances:reservations")
