"""Reservations: booking N GPUs of one host (8: the whole host) for a time window.

Rules (docs/architecture.md, "Reservations"):
- Booking checks the window (not past, not too long, not too far ahead), the person's weekly hours, the
  paying account's credit, and finds one host with the GPUs free for the whole window: after the other
  bookings that overlap it and the instances there that may still run when it opens. Under the payer's
  CreditAccount lock (accounts in id order, the house order), then the chosen host's row lock, so two
  bookings racing for the last credit or the last host serialise and one wins.
- The credit is held, not spent (selectors.held_gpu_seconds counts it against every launch, extension
  and booking), until the window ends; then reservations_settle releases it and posts the unused charge.
- The scheduler keeps the booked GPUs clear of instances that could run into the window
  (provisioning.scheduler, "Reservations"); instance_extend refuses hours that would (extension_refusal).
- Inside the window only the booker launches on it, at once (services.instance_launch, launch_booking).
"""

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Q, Sum
from django.http import Http404
from django.utils import timezone

from portal.audit.services import audit_record
from portal.credits.models import CreditAccount, LedgerEntry, hours
from portal.credits.services import ledger_post
from portal.notifications.services import notify_reservation_cancelled, notify_reservation_ending
from portal.projects.models import Project, ProjectMembership
from provisioning.models import Gpu, GpuHost

from . import entitlements, selectors, sessions
from .models import Instance, LaunchPolicy, Reservation
from .sizes import SIZES
from .stop_reasons import STOP_NOTE_MAX

logger = logging.getLogger(__name__)

WHOLE_HOST_GPUS = 8
# The shortest window one may book.
MIN_MINUTES = 15
# A start this close behind now is taken as "now" (the form's clock and ours differ a little).
START_SLACK = timedelta(minutes=1)
# Instances that count as on a host for its bookings' room: stopping ones are on their way out.
_ON_HOST_STATES = (Instance.State.QUEUED, Instance.State.PROVISIONING, Instance.State.RUNNING)


def _aware(moment: datetime, name: str) -> datetime:
    if not isinstance(moment, datetime):
        raise ValidationError(f"Give {name} as a date and time (ISO 8601, UTC).", code="invalid")
    return moment if timezone.is_aware(moment) else moment.replace(tzinfo=UTC)


def _week_start(moment: datetime) -> datetime:
    day = moment.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return day - timedelta(days=day.weekday())


def _payer_filter(*, user, project) -> Q:
    return Q(project=project) if project is not None else Q(user=user, project__isnull=True)


# --- Room on a host ------------------------------------------------------------------------------------


def host_room(
    host: GpuHost,
    starts_at: datetime,
    ends_at: datetime,
    *,
    policy: LaunchPolicy,
    now: datetime,
    ignore_reservation_id=None,
    instance_ends: dict | None = None,
) -> int:
    """GPUs of `host` free for all of [starts_at, ends_at): its present GPUs less those booked by standing
    reservations overlapping the window (all of them: a conservative sum) and those of its live instances
    that may still run at starts_at (sessions.runs_until; instances on a booking that overlaps are counted
    with it). `instance_ends` replaces some instances' ends by id (an extension being checked)."""
    present = Gpu.objects.filter(host=host, is_present=True, is_drained=False).count()
    overlapping = Reservation.objects.filter(
        host=host, state=Reservation.State.BOOKED, starts_at__lt=ends_at, ends_at__gt=starts_at
    ).exclude(id=ignore_reservation_id)
    overlapping_ids = set(overlapping.values_list("id", flat=True))
    reserved = overlapping.aggregate(total=Sum("gpus"))["total"] or 0
    occupied = 0
    live = Instance.objects.filter(host=host, state__in=_ON_HOST_STATES).select_related("project")
    for instance in live:
        if instance.reservation_id is not None and (
            instance.reservation_id in overlapping_ids or instance.reservation_id == ignore_reservation_id
        ):
            continue
        end = (instance_ends or {}).get(instance.id) or sessions.runs_until(
            instance, policy, now, ready_within=settings.READY_TIMEOUT_SECONDS
        )
        if end is None or end > starts_at:
            occupied += SIZES[instance.size].gpus
    return present - reserved - occupied


def _hosts_for(gpus: int):
    hosts = GpuHost.objects.filter(state=GpuHost.State.ACTIVE).exclude(backend=GpuHost.Backend.SLURM)
    return hosts.order_by("name", "id")


def _book_host(*, gpus: int, starts_at, ends_at, policy, now) -> GpuHost | None:
    """The host to book, locked: the first (by name) with `gpus` GPUs free for the window, checked again
    once its row lock is held; None when none has. A whole-host booking needs a host of eight present."""
    for host in _hosts_for(gpus):
        if (
            gpus == WHOLE_HOST_GPUS
            and Gpu.objects.filter(host=host, is_present=True, is_drained=False).count() != 8
        ):
            continue
        if host_room(host, starts_at, ends_at, policy=policy, now=now) < gpus:
            continue
        # Locked, then read again: a booking or a placement that held the lock has committed by now.
        locked = GpuHost.objects.select_for_update().get(pk=host.pk)
        if (
            locked.state == GpuHost.State.ACTIVE
            and host_room(locked, starts_at, ends_at, policy=policy, now=now) >= gpus
        ):
            return locked
    return None


class _FleetRoom:
    """The hosts a booking may use, their present GPUs, standing bookings and live instances, read once:
    room() then answers host_room's rule for any window without a query, so a search over every hour of
    the booking horizon, or a week's calendar, costs a few queries however many hours it tries."""

    def __init__(self, *, policy: LaunchPolicy, now: datetime, until: datetime):
        self.hosts = [host.pk for host in _hosts_for(WHOLE_HOST_GPUS)]
        self.present = dict.fromkeys(self.hosts, 0)
        for host_id in Gpu.objects.filter(
            host_id__in=self.hosts, is_present=True, is_drained=False
        ).values_list("host_id", flat=True):
            self.present[host_id] += 1
        self.bookings = {host_id: [] for host_id in self.hosts}
        for booking in Reservation.objects.filter(
            host_id__in=self.hosts, state=Reservation.State.BOOKED, starts_at__lt=until, ends_at__gt=now
        ):
            self.bookings[booking.host_id].append(booking)
        self.instances = {host_id: [] for host_id in self.hosts}
        for instance in Instance.objects.filter(
            host_id__in=self.hosts, state__in=_ON_HOST_STATES
        ).select_related("project"):
            ends = sessions.runs_until(instance, policy, now, ready_within=settings.READY_TIMEOUT_SECONDS)
            self.instances[instance.host_id].append((SIZES[instance.size].gpus, ends, instance.reservation_id))

    def room(self, host_id, starts_at: datetime, ends_at: datetime) -> int:
        """host_room(host, starts_at, ends_at), from what was read."""
        overlapping = [b for b in self.bookings[host_id] if b.starts_at < ends_at and b.ends_at > starts_at]
        ids = {b.id for b in overlapping}
        left = self.present[host_id] - sum(b.gpus for b in overlapping)
        for gpus, ends, reservation_id in self.instances[host_id]:
            if reservation_id not in ids and (ends is None or ends > starts_at):
                left -= gpus
        return left


def next_free_start(
    *, gpus: int, duration: timedelta, after: datetime, now: datetime | None = None
) -> datetime | None:
    """The earliest whole hour from `after` (within the booking horizon) at which some host has `gpus`
    GPUs free for `duration`; None when none is found. For the refusal's hint and the booking page."""
    now = now or timezone.now()
    horizon = now + timedelta(days=settings.RESERVATION_MAX_AHEAD_DAYS)
    start = max(after, now).replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    fleet = _FleetRoom(policy=LaunchPolicy.current(), now=now, until=horizon + duration)
    while start <= horizon:
        if any(fleet.room(host_id, start, start + duration) >= gpus for host_id in fleet.hosts):
            return start
        start += timedelta(hours=1)
    return None


@dataclass(frozen=True)
class CalendarHour:
    """One hour of the booking calendar: what could be booked for it. starts_at None: already begun."""

    starts_at: datetime | None
    # Hosts with all eight GPUs free for the hour, and GPUs free on all hosts together.
    whole_hosts: int = 0
    gpus: int = 0


def free_calendar(*, now: datetime | None = None, days: int = 7) -> list[tuple[datetime, list[CalendarHour]]]:
    """The booking calendar: for each UTC day from today, for each of its 24 hours, what is free for
    that hour by host_room's rule (present GPUs, less standing bookings overlapping the hour, less live
    instances that may still run when it starts). Hours already begun are None. Reads the hosts, their
    bookings and their instances once, so the whole week costs a few queries."""
    now = now or timezone.now()
    today = now.replace(hour=0, minute=0, second=0, microsecond=0)
    end = today + timedelta(days=days)
    fleet = _FleetRoom(policy=LaunchPolicy.current(), now=now, until=end)
    hosts, present = fleet.hosts, fleet.present

    def room(host_id, start: datetime) -> int:
        return max(fleet.room(host_id, start, start + timedelta(hours=1)), 0)

    calendar = []
    for day in range(days):
        day_start = today + timedelta(days=day)
        cells = []
        for hour in range(24):
            start = day_start + timedelta(hours=hour)
            if start < now:
                cells.append(CalendarHour(None))
                continue
            rooms = {host_id: room(host_id, start) for host_id in hosts}
            whole = sum(
                1
                for host_id, free in rooms.items()
                if free >= WHOLE_HOST_GPUS and present[host_id] == WHOLE_HOST_GPUS
            )
            cells.append(CalendarHour(start, whole, sum(rooms.values())))
        calendar.append((day_start, cells))
    return calendar


# --- Booking -------------------------------------------------------------------------------------------


def _project_owned(*, user, project) -> Project:
    slug = project.slug if isinstance(project, Project) else str(project)
    membership = (
        ProjectMembership.objects.filter(project__slug=slug, user=user).select_related("project").first()
    )
    if membership is None:
        raise Http404("No such project.")
    if membership.role != ProjectMembership.Role.OWNER:
        raise PermissionDenied("Only an owner of the project may book from its pool.")
    return membership.project


def _validate_window(*, gpus, starts_at, ends_at, now) -> tuple[datetime, datetime]:
    if not isinstance(gpus, int) or isinstance(gpus, bool) or not 1 <= gpus <= WHOLE_HOST_GPUS:
        raise ValidationError(
            f"Book between 1 and {WHOLE_HOST_GPUS} GPUs ({WHOLE_HOST_GPUS}: a whole host).", code="invalid"
        )
    starts_at, ends_at = _aware(starts_at, "the start"), _aware(ends_at, "the end")
    if ends_at <= starts_at:
        raise ValidationError("The window must end after it starts.", code="invalid")
    if ends_at <= now or starts_at < now - START_SLACK:
        raise ValidationError(
            f"The window starts in the past ({starts_at:%Y-%m-%d %H:%M} UTC); "
            f"it is {now:%Y-%m-%d %H:%M} UTC now.",
            code="past",
        )
    starts_at = max(starts_at, now)
    length = ends_at - starts_at
    if length < timedelta(minutes=MIN_MINUTES):
        raise ValidationError(f"Book at least {MIN_MINUTES} minutes.", code="too_short")
    if length > timedelta(hours=settings.RESERVATION_MAX_HOURS):
        raise ValidationError(
            f"A booking may last at most {settings.RESERVATION_MAX_HOURS} hours; this one lasts "
            f"{length.total_seconds() / 3600:g}.",
            code="too_long",
        )
    horizon = now + timedelta(days=settings.RESERVATION_MAX_AHEAD_DAYS)
    if starts_at > horizon:
        raise ValidationError(
            f"Bookings may start at most {settings.RESERVATION_MAX_AHEAD_DAYS} days ahead, by "
            f"{horizon:%Y-%m-%d %H:%M} UTC.",
            code="too_far",
        )
    return starts_at, ends_at


def _check_weekly(*, user, starts_at, ends_at) -> None:
    limit = settings.RESERVATION_WEEKLY_HOURS_PER_USER
    week = _week_start(starts_at)
    booked = Reservation.objects.filter(
        user=user, starts_at__gte=week, starts_at__lt=week + timedelta(days=7)
    ).exclude(state=Reservation.State.CANCELLED)
    held = sum((r.ends_at - r.starts_at).total_seconds() for r in booked)
    wanted = (ends_at - starts_at).total_seconds()
    if held + wanted > limit * 3600:
        raise ValidationError(
            f"One person may book at most {limit} hours a week (Monday to Monday, UTC); you have "
            f"{held / 3600:g} booked in the week of {week:%Y-%m-%d}, "
            f"so at most {max(limit - held / 3600, 0):g} more.",
            code="weekly",
        )


def reservation_book(*, user, gpus: int, starts_at: datetime, ends_at: datetime, project=None) -> Reservation:
    """Book `gpus` GPUs of one host (8: a whole host) for [starts_at, ends_at), paid by `user` or, with
    `project` (a Project or its slug, of which `user` is an owner), by its pool. Returns the Reservation.

    The whole window's GPU-seconds are held from the paying account's credit until the window ends. Raises
    Http404 (a project `user` is not in), PermissionDenied (a disabled account, a project member who is no
    owner) and ValidationError with a message the person can act on and a code: "invalid", "past",
    "too_short", "too_long", "too_far", "weekly", "size", "suspended", "credit" or "capacity".
    """
    now = timezone.now()
    if not user.is_active:
        raise PermissionDenied("This account is disabled.")
    starts_at, ends_at = _validate_window(gpus=gpus, starts_at=starts_at, ends_at=ends_at, now=now)
    suspended = entitlements.suspension_refusal(user)
    if suspended:
        raise ValidationError(suspended.message, code="suspended")
    if not user.email_verified:
        raise ValidationError("Confirm your email address before booking GPUs.", code="unverified")
    size = SIZES["8x" if gpus == WHOLE_HOST_GPUS else "1x"]
    policy = LaunchPolicy.current()
    if project is not None:
        project = _project_owned(user=user, project=project)
        if not project.size_allowed(size.key):
            raise ValidationError(
                f"The project {project.name} does not allow {size.name} launches.", code="size"
            )
        CreditAccount.objects.get_or_create(project=project)
    else:
        refusal = entitlements.size_refusal(user, size, policy)
        if refusal:
            raise ValidationError(refusal.message, code="size")
    CreditAccount.objects.get_or_create(user=user)
    hold = gpus * int((ends_at - starts_at).total_seconds())
    with transaction.atomic():
        accounts = list(
            CreditAccount.objects.select_for_update()
            .filter(Q(user=user) | (Q(project=project) if project is not None else Q(pk__in=[])))
            .order_by("id")
        )
        payer = next(a for a in accounts if (a.project_id == project.pk if project else a.user_id == user.pk))
        _check_weekly(user=user, starts_at=starts_at, ends_at=ends_at)
        if project is not None:
            committed = selectors.project_committed_gpu_seconds(project.pk, now=now)
        else:
            committed = selectors.committed_gpu_seconds(user, now=now)
        available = payer.balance_gpu_seconds - committed
        if available < hold:
            whose = f"the project {project.name}'s pool has" if project else "you have"
            raise ValidationError(
                f"Not enough credit: {gpus} GPU{'s' if gpus != 1 else ''} for "
                f"{(ends_at - starts_at).total_seconds() / 3600:g} hours need {hours(hold)} GPU-hours; "
                f"{whose} {hours(max(available, 0))} after other bookings and what running "
                "instances will use.",
                code="credit",
            )
        host = _book_host(gpus=gpus, starts_at=starts_at, ends_at=ends_at, policy=policy, now=now)
        if host is None:
            free = next_free_start(gpus=gpus, duration=ends_at - starts_at, after=starts_at, now=now)
            hint = f" The earliest such window starts {free:%Y-%m-%d %H:%M} UTC." if free else ""
            raise ValidationError(
                f"No host has {gpus} GPU{'s' if gpus != 1 else ''} free for all of that window: it is "
                f"booked or busy.{hint}",
                code="capacity",
            )
        reservation = Reservation.objects.create(
            user=user,
            project=project,
            host=host,
            gpus=gpus,
            starts_at=starts_at,
            ends_at=ends_at,
            hold_gpu_seconds=hold,
        )
        audit_record(
            actor=user,
            action="reservation.book",
            target=reservation,
            details={
                "gpus": gpus,
                "starts_at": starts_at,
                "ends_at": ends_at,
                "host": host.name,
                "project": project.slug if project else "",
                "hold_gpu_seconds": hold,
            },
        )
    return reservation


def reservations_of(user, *, ended_limit: int = 20) -> list[Reservation]:
    """The user's standing bookings, soonest first, then their latest ended or cancelled ones."""
    mine = Reservation.objects.filter(user=user).select_related("host", "project")
    standing = list(mine.filter(state=Reservation.State.BOOKED).order_by("starts_at"))
    ended = list(mine.exclude(state=Reservation.State.BOOKED).order_by("-ends_at")[:ended_limit])
    return standing + ended


def reservation_of_owner(user, reservation_id) -> Reservation:
    """The user's own booking; Http404 for any other id, alike, so a guessed id tells nothing."""
    found = Reservation.objects.filter(id=reservation_id, user=user).select_related("host", "project").first()
    if found is None:
        raise Http404("No such booking.")
    return found


# --- Cancelling ----------------------------------------------------------------------------------------


def _cancel(reservation_id, *, actor, reason: str, now) -> Reservation:
    with transaction.atomic():
        reservation = Reservation.objects.select_related("user", "project").get(id=reservation_id)
        CreditAccount.objects.select_for_update().filter(
            _payer_filter(user=reservation.user, project=reservation.project)
        ).first()
        reservation = (
            Reservation.objects.select_for_update(of=("self",))
            .select_related("user", "project")
            .get(id=reservation_id)
        )
        if reservation.state != Reservation.State.BOOKED:
            raise ValidationError(f"This booking is already {reservation.state}.", code="ended")
        reservation.state = Reservation.State.CANCELLED
        reservation.cancelled_by = actor
        reservation.cancel_reason = reason
        reservation.ended_at = now
        reservation.save(update_fields=["state", "cancelled_by", "cancel_reason", "ended_at"])
    return reservation


def reservation_cancel(*, user, reservation_id) -> Reservation:
    """The booker cancels their booking before its window opens: the hold goes, nothing is charged.
    Returns it. Raises Http404 for anyone else's, ValidationError once the window opened or it ended."""
    reservation = reservation_of_owner(user, reservation_id)
    now = timezone.now()
    if reservation.starts_at <= now and reservation.state == Reservation.State.BOOKED:
        raise ValidationError(
            "This booking's window has opened; it ends on its own at "
            f"{reservation.ends_at:%Y-%m-%d %H:%M} UTC. Stop its instances to stop using it.",
            code="open",
        )
    with transaction.atomic():
        reservation = _cancel(reservation.id, actor=user, reason="", now=now)
        audit_record(actor=user, action="reservation.cancel", target=reservation, details={"by": "booker"})
    return reservation


def reservation_operator_cancel(*, reservation_id, actor, reason: str) -> Reservation:
    """An operator cancels a booking, open or not, with `reason`, which the booker is told (notification
    reservation_cancelled, by email and on the dashboard) and the audit log records
    ("reservation.operator_cancel"). The hold goes and nothing is charged for unused time; instances
    already running in the window keep their end (the window's). Returns it.

    Raises ValueError for a blank or overlong reason, Reservation.DoesNotExist, and ValidationError when
    it had already ended or been cancelled.
    """
    reason = (reason or "").strip()
    if not reason:
        raise ValueError("Cancelling a booking needs a reason: the person who booked it reads it.")
    if len(reason) > STOP_NOTE_MAX:
        raise ValueError(f"Keep the reason within {STOP_NOTE_MAX} characters.")
    with transaction.atomic():
        reservation = _cancel(reservation_id, actor=actor, reason=reason, now=timezone.now())
        audit_record(
            actor=actor,
            action="reservation.operator_cancel",
            target=reservation,
            reason=reason,
            details={
                "booker": reservation.user.email,
                "gpus": reservation.gpus,
                "starts_at": reservation.starts_at,
                "ends_at": reservation.ends_at,
            },
        )
        notify_reservation_cancelled(reservation=reservation, reason=reason)
    return reservation


# --- Launching in the window ---------------------------------------------------------------------------


def booking_for_launch(*, user, reservation_id, project, now) -> Reservation | None:
    """The booking a launch goes on, before any lock: the one named (Http404 unless it is the user's own
    and paid as the launch is), else the user's open booking paid as the launch is, if any."""
    if reservation_id:
        found = Reservation.objects.filter(id=reservation_id, user=user).select_related("project").first()
        if found is None:
            raise Http404("No such booking.")
        if found.project_id != (project.pk if project is not None else None):
            paid = f"the project {found.project.slug}" if found.project_id else "you"
            raise ValidationError(
                f"That booking is paid by {paid}; launch on it paid the same way"
                + (f" (project {found.project.slug})." if found.project_id else " (no project)."),
                code="booking",
            )
        return found
    open_now = Reservation.objects.filter(
        _payer_filter(user=user, project=project),
        user=user,
        state=Reservation.State.BOOKED,
        starts_at__lte=now,
        ends_at__gt=now,
    )
    return open_now.order_by("starts_at", "id").first()


def launch_booking(reservation: Reservation, *, size, named: bool, now) -> Reservation | None:
    """Lock the booking for a launch of `size` on it, inside the launch's transaction (after the account
    locks). Returns it when the launch goes on it. A booking that is not open, or lacks room for `size`,
    refuses a launch that named it (ValidationError, code "booking"); one found by matching gives None
    (an ordinary launch)."""
    locked = Reservation.objects.select_for_update().get(id=reservation.id)
    problem = ""
    if not locked.is_open(now):
        problem = (
            f"Your booking opens at {locked.starts_at:%Y-%m-%d %H:%M} UTC."
            if locked.state == "booked" and now < locked.starts_at
            else f"That booking is {'over' if locked.state == 'booked' else locked.state}."
        )
    else:
        used = sum(
            SIZES[s].gpus
            for s in locked.instances.filter(state__in=_ON_HOST_STATES).values_list("size", flat=True)
        )
        if used + size.gpus > locked.gpus:
            problem = (
                f"Your booking has {locked.gpus} GPU{'s' if locked.gpus != 1 else ''}, {used} in use; "
                f"a {size.name} launch does not fit."
            )
    if not problem:
        return locked
    if named:
        raise ValidationError(problem, code="booking")
    return None


# --- Extensions ----------------------------------------------------------------------------------------


def extension_refusal(instance: Instance, *, new_end: datetime, policy: LaunchPolicy, now) -> str:
    """Why extending `instance` to `new_end` would take it into a booked window on its host; '' when it
    would not."""
    if instance.host_id is None:
        return ""
    upcoming = (
        Reservation.objects.filter(
            host_id=instance.host_id, state=Reservation.State.BOOKED, starts_at__lt=new_end, ends_at__gt=now
        )
        .exclude(id=instance.reservation_id)
        .order_by("starts_at")
    )
    for booked in upcoming:
        if booked.starts_at <= now:
            continue  # open already: it was kept clear when booked, and this instance was not in it
        room = host_room(
            instance.host,
            booked.starts_at,
            booked.ends_at,
            policy=policy,
            now=now,
            ignore_reservation_id=booked.id,
            instance_ends={instance.id: new_end},
        )
        if room < booked.gpus:
            return (
                f"Its GPUs are booked from {booked.starts_at:%Y-%m-%d %H:%M} UTC, "
                "so it cannot run past then; "
                "extend by fewer hours, or launch again later on another host."
            )
    return ""


# --- The beat: settle ended windows, warn before a window ends -----------------------------------------


@dataclass
class TickReport:
    settled: list
    warned: list


def _settle(reservation_id, now) -> bool:
    with transaction.atomic():
        reservation = Reservation.objects.select_related("user", "project").get(id=reservation_id)
        payer = CreditAccount.objects.select_for_update().get(
            _payer_filter(user=reservation.user, project=reservation.project)
        )
        reservation = Reservation.objects.select_for_update().get(id=reservation_id)
        if reservation.state != Reservation.State.BOOKED:
            return False
        # Its instances stop at the window's end (their deadline); settle once their last charge is in.
        if reservation.instances.filter(state__in=Instance.LIVE_STATES).exists():
            return False
        used = reservation.instances.aggregate(total=Sum("charged_gpu_seconds"))["total"] or 0
        used = min(used, reservation.hold_gpu_seconds)
        unused = reservation.hold_gpu_seconds - used
        charge = unused * settings.RESERVATION_UNUSED_CHARGE_PERCENT // 100
        if charge > 0:
            ledger_post(
                account=payer,
                kind=LedgerEntry.Kind.USAGE,
                gpu_seconds=-charge,
                idempotency_key=f"reservation-unused:{reservation.id}",
                reason=f"Booked time left unused ({settings.RESERVATION_UNUSED_CHARGE_PERCENT}% of "
                f"{hours(unused)} GPU-hours), booking {reservation.short_id}",
            )
        reservation.state = Reservation.State.SETTLED
        reservation.used_gpu_seconds = used
        reservation.unused_charge_gpu_seconds = charge
        reservation.ended_at = now
        reservation.save(update_fields=["state", "used_gpu_seconds", "unused_charge_gpu_seconds", "ended_at"])
    return True


def reservations_settle(now: datetime | None = None) -> list[str]:
    """Settle every booking whose window has ended and whose instances have all stopped: the hold is
    released and the unused charge (RESERVATION_UNUSED_CHARGE_PERCENT of the booked GPU-seconds its
    instances did not use) posted to the payer's ledger, once (its key names the booking). Returns the
    ids settled by this call."""
    now = now or timezone.now()
    due = Reservation.objects.filter(state=Reservation.State.BOOKED, ends_at__lte=now).values_list(
        "id", flat=True
    )
    return [str(reservation_id) for reservation_id in due if _settle(reservation_id, now)]


def reservations_warn_ending(now: datetime | None = None) -> list[str]:
    """Warn each booker whose window ends within SESSION_END_WARNING_MINUTES while instances run in it,
    once per booking. Returns the ids of the bookings warned by this call."""
    minutes = settings.SESSION_END_WARNING_MINUTES
    if not minutes:
        return []
    now = now or timezone.now()
    ending = Reservation.objects.filter(
        state=Reservation.State.BOOKED, ends_at__gt=now, ends_at__lte=now + timedelta(minutes=minutes)
    ).select_related("user")
    warned = []
    for reservation in ending:
        running = list(reservation.instances.filter(state=Instance.State.RUNNING).select_related("image"))
        if running and notify_reservation_ending(reservation=reservation, instances=running, now=now):
            warned.append(str(reservation.id))
    return warned


def reservations_tick(now: datetime | None = None) -> TickReport:
    """The beat's pass: warn before windows end, then settle the ended ones."""
    return TickReport(warned=reservations_warn_ending(now), settled=reservations_settle(now))
