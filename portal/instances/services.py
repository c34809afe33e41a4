"""Operations on instances that people start: launch, stop, an operator's force stop, a host eviction,
and the stop of every instance of some accounts (suspension, deletion).

The worker side (provision, teardown, reconcile) is portal/instances/lifecycle.py. Both move an
instance's state only through portal/instances/transitions.py, and both take the paying CreditAccount's
lock (the owner's, or the pool of the instance's project) before an Instance row lock (the order
metering uses), so they never deadlock with each other.
"""

import logging
import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Q, Sum
from django.http import Http404
from django.utils import timezone

from portal.audit.services import audit_record
from portal.credits import metering
from portal.credits.models import CreditAccount, LedgerEntry, hours
from portal.credits.models import hours as hours_text  # instance_extend's `hours` is a count
from portal.lib.tasks import publish
from portal.notifications.services import notify_instance_stopped
from portal.projects.models import Project, ProjectMembership
from provisioning import scheduler
from provisioning import services as fleet
from provisioning.selectors import image_availability, in_service_hosts

from . import entitlements, reservations, selectors, sessions, tasks, transitions
from .models import Image, Instance, LaunchPolicy
from .sizes import SIZES
from .stop_reasons import STOP_NOTE_MAX, StopReason

logger = logging.getLogger(__name__)

UNAVAILABLE_MESSAGE = (
    "Launching is unavailable right now, nothing was charged. Please try again in a few minutes."
)
# An operator's reason for a force stop, which the owner reads beside "An operator stopped it".
FORCE_STOP_REASON_MAX = STOP_NOTE_MAX


class LaunchUnavailable(ValidationError):
    """The task queue could not be reached, so the launch was not started (and nothing was charged)."""


# The timeline: one line per state or step change, which a person reads.
instance_event_record = transitions.event_record


def enqueue(task, **kwargs) -> bool:
    """Publish `task` with `kwargs`. Returns False (and logs) when the broker is unreachable."""
    return publish(task, kwargs=kwargs)


def _refuse_unplaceable(image: Image) -> None:
    """Refuse an image that no host in service can start, and tell the operators (the log) what to do.

    A launch with no host in service at all is not refused: it waits in the queue, and the operators
    are told the same way.
    """
    if not in_service_hosts().exists():
        logger.warning(
            "A launch is waiting because no GPU host is in service. To fix: add a GPU host (or reactivate "
            "one) in the console at /admin/provisioning/gpuhost/."
        )
        return
    image.availability = image_availability([image.reference])[image.reference]
    if image.availability.state == "preparing":
        raise ValidationError(selectors.image_preparing_message(image), code="image")
    if image.availability.state == "missing":
        logger.warning(
            "A launch of %s was refused: %s is on no GPU host in service. To fix: build or pre-pull it from a "
            "host's page in the console (/admin/provisioning/gpuhost/), or switch it off in the catalogue.",
            image.key,
            image.reference,
        )
        raise ValidationError(
            f"The {image.name} image is not on any GPU host yet, so it cannot start. The operators have been "
            "told; choose another image.",
            code="image",
        )


def _validate_launch(*, user, size: str, image_key: str, policy: LaunchPolicy, project: Project | None = None):
    """Check everything about a launch that needs no lock. Returns (Size, Image); raises ValidationError.

    For a project launch the project's allowed sizes replace the person's own size tiers."""
    if not user.is_active:
        raise PermissionDenied("This account is disabled.")
    suspended = entitlements.suspension_refusal(user)
    if suspended:
        raise ValidationError(suspended.message, code="suspended")
    if not user.email_verified:
        raise ValidationError(
            "Confirm your email address before launching an instance; check your inbox for the link."
        )
    size_obj = SIZES.get(size or "")
    if size_obj is None:
        choices = ", ".join(s.name for s in SIZES.values())
        raise ValidationError(f"Unknown size {size!r}. Choose one of: {choices}.", code="size")
    image = Image.objects.filter(key=image_key or "").first()
    if image is None:
        keys = list(Image.objects.filter(is_enabled=True).order_by("key").values_list("key", flat=True))
        raise ValidationError(
            f"Unknown image {image_key!r}. Choose one of: {', '.join(keys) or 'none (no image is enabled)'}.",
            code="image",
        )
    if not image.is_enabled:
        raise ValidationError(
            f"The {image.name} image is switched off by the operators right now. Choose another image.",
            code="image",
        )
    _refuse_unplaceable(image)
    if size_obj.key not in image.sizes:
        allowed = ", ".join(SIZES[key].name for key in image.sizes if key in SIZES) or "no size"
        raise ValidationError(
            f"The {image.name} image cannot run on {size_obj.name}; it runs on {allowed}. "
            "Choose another size or image.",
            code="size",
        )
    if project is not None:
        if not project.size_allowed(size_obj.key):
            raise ValidationError(
                f"The project {project.name} does not allow {size_obj.name} launches.", code="size"
            )
        return size_obj, image
    refusal = entitlements.size_refusal(user, size_obj, policy)
    if refusal:
        raise ValidationError(refusal.message, code="size")
    return size_obj, image


def project_for_launch(*, user, project) -> Project:
    """The project `user` may launch for (a Project or its slug). Raises Http404 when there is no such
    project or the user is not a member of it, alike, so a guessed slug tells nothing."""
    slug = project.slug if isinstance(project, Project) else str(project)
    found = Project.objects.filter(slug=slug, memberships__user=user).first() if user.pk else None
    if found is None:
        raise Http404("No such project.")
    return found


def month_start(now: datetime) -> datetime:
    """The first moment of `now`'s calendar month, UTC: where members' monthly caps restart."""
    return now.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def member_usage_this_month(*, project_id, user, now) -> int:
    """GPU-seconds the project's pool paid this calendar month for instances `user` launched (usage net
    of reversals), from the pool's ledger entries, which name their instance."""
    spent = LedgerEntry.objects.filter(
        account__project_id=project_id,
        kind__in=[LedgerEntry.Kind.USAGE, LedgerEntry.Kind.REVERSAL],
        instance__user=user,
        created_at__gte=month_start(now),
    ).aggregate(total=Sum("gpu_seconds"))["total"]
    return -(spent or 0)


def _check_project_launch(*, user, project: Project, pool: CreditAccount, size_obj, now) -> None:
    """The project's rules for one more launch, read under the pool's lock: its live-instance limit, the
    member's monthly cap, and the pool's credit. Raises ValidationError."""
    gpus, unbilled, live = selectors.project_burning(project.pk, now=now)
    if live >= project.max_live_instances:
        raise ValidationError(
            f"The project {project.name} already has {live} instances running or starting; its limit is "
            f"{project.max_live_instances} at once.",
            code="limit",
        )
    needed = selectors.launch_minimum_gpu_seconds(size_obj)
    cap = project.member_monthly_cap_gpu_seconds
    if cap:
        used = member_usage_this_month(project_id=project.pk, user=user, now=now)
        mine = selectors.project_committed_gpu_seconds(project.pk, now=now, user=user)
        if used + mine + needed > cap:
            raise ValidationError(
                f"This launch would take you past your monthly cap of {hours(cap)} GPU-hours on "
                f"{project.name}: you used {hours(used)} this month and your running instances will use "
                f"{hours(mine)} more. Ask an owner of the project to raise the cap.",
                code="credit",
            )
    held = selectors.held_gpu_seconds(project_id=project.pk)
    available = pool.balance_gpu_seconds - (gpus * selectors.launch_window_seconds() + unbilled + held)
    if available < needed:
        raise ValidationError(
            f"The project {project.name}'s pool cannot cover this launch: "
            + selectors.shortfall_message(size_obj, needed, available, gpus).replace("you have", "it has", 1),
            code="credit",
        )


# The range of a launch's own deadline (stop_after_seconds): a minute to a week.
STOP_AFTER_MIN_SECONDS = 60
STOP_AFTER_MAX_SECONDS = 7 * 24 * 3600


def _deadline(stop_after_seconds: int | None, now):
    """The Instance.deadline_at for a launch that asked to be stopped after this many seconds (None: no
    deadline of its own). Raises ValidationError outside STOP_AFTER_MIN/MAX_SECONDS."""
    if stop_after_seconds is None:
        return None
    if not STOP_AFTER_MIN_SECONDS <= stop_after_seconds <= STOP_AFTER_MAX_SECONDS:
        raise ValidationError(
            f"stop_after_seconds must be between {STOP_AFTER_MIN_SECONDS} (a minute) and "
            f"{STOP_AFTER_MAX_SECONDS} (a week); it was {stop_after_seconds}.",
            code="invalid",
        )
    return now + timedelta(seconds=stop_after_seconds)


def instance_launch(
    *,
    user,
    size: str,
    image_key: str,
    project=None,
    stop_after_seconds: int | None = None,
    reservation=None,
) -> Instance:
    """Queue a launch of `image_key` at `size` for `user` and enqueue its provisioning. Returns the Instance.

    `stop_after_seconds` gives the launch a deadline of its own (`devcloud run --timeout`): the limits
    beat stops the instance that long after the launch, queued, starting or running, whatever became of
    the client (limits.enforce_deadlines).

    Checks, in order: an active, unsuspended account with a verified email, a known size, a known and
    enabled image that allows the size, the operators' launch policy (the sizes open to the user's tier
    and to them personally, and the live-instance limit; see entitlements), and credit: the balance minus
    what the user's other live instances will burn within LAUNCH_MIN_CREDIT_MINUTES must cover that many
    minutes at this size. The credit check and the insert happen under the owner's CreditAccount row
    lock, so two concurrent launches with credit for one succeed for exactly one.

    With `project` (a Project or its slug) the launch is paid from the project's pool: the user must be a
    member (else Http404, as for a project that does not exist), the size must be one the project allows
    (which replaces the person's own size tiers), and under the pool's lock (taken with the person's own
    account lock, both in id order) the project's live-instance limit, the member's monthly cap (this
    month's usage plus what their live project instances will burn in the launch window) and the pool's
    credit (balance minus what the project's live instances will burn in that window) must allow it.

    Inside the window of one of the user's bookings paid as this launch is (named by `reservation`, its
    id, or else matched by itself), the launch goes on the booking: on its host's GPUs kept for it, at
    once, with no credit check (its credit is held) and stopped at the window's end (deadline_at). A
    named booking that is not open or has no room for `size` is refused (code "booking"); someone else's
    is a 404.

    Raises PermissionDenied for a disabled account, ValidationError with a message the person can act on
    for everything else, and LaunchUnavailable (a ValidationError) when the task queue cannot be reached:
    the instance is then marked failed, and nothing was charged.
    """
    policy = LaunchPolicy.current()
    _deadline(stop_after_seconds, timezone.now())  # bad input is refused before anything is locked
    if project is not None:
        project = project_for_launch(user=user, project=project)
    size_obj, image = _validate_launch(
        user=user, size=size, image_key=image_key, policy=policy, project=project
    )
    booking = reservations.booking_for_launch(
        user=user, reservation_id=reservation, project=project, now=timezone.now()
    )
    CreditAccount.objects.get_or_create(user=user)
    if project is not None:
        CreditAccount.objects.get_or_create(project=project)
    published = {}

    def publish(instance_id):
        published["ok"] = enqueue(tasks.provision_instance, instance_id=str(instance_id))
        if not published["ok"]:
            _fail_unqueued(instance_id)

    with transaction.atomic():
        locked = CreditAccount.objects.select_for_update().order_by("id")
        if project is None:
            account = locked.get(user=user)
        else:
            accounts = list(locked.filter(Q(user=user) | Q(project=project)))
            account = next(a for a in accounts if a.project_id is None)
            pool = next(a for a in accounts if a.project_id is not None)
            # Again under the locks: a removal from the project takes this person's lock (and their live
            # project instances' pools) before it stops them, so it either stops this launch or is seen here.
            if not ProjectMembership.objects.filter(project=project, user=user).exists():
                raise Http404("No such project.")
        # Read again under the lock: user_suspend takes this lock before it stops the user's instances,
        # so a launch either lands before the suspension (and is stopped by it) or sees it here.
        fresh = get_user_model().objects.get(pk=user.pk)
        if not fresh.is_active:
            # Deleted (or disabled) since the checks above: account_delete stops instances under this lock.
            raise PermissionDenied("This account is disabled.")
        suspended = entitlements.suspension_refusal(fresh)
        if suspended:
            raise ValidationError(suspended.message, code="suspended")
        now = timezone.now()
        live = Instance.objects.filter(user=user, state__in=selectors.BURNING_STATES).count()
        over_limit = entitlements.live_limit_refusal(live, policy.max_live_instances)
        if over_limit:
            raise ValidationError(over_limit.message, code="limit")
        on_booking = booking and reservations.launch_booking(
            booking, size=size_obj, named=bool(reservation), now=now
        )
        if on_booking:
            pass  # paid from the credit held for the booking
        elif project is not None:
            _check_project_launch(user=user, project=project, pool=pool, size_obj=size_obj, now=now)
        else:
            available = account.balance_gpu_seconds - selectors.committed_gpu_seconds(user, now=now)
            needed = selectors.launch_minimum_gpu_seconds(size_obj)
            if available < needed:
                raise ValidationError(
                    selectors.shortfall_message(size_obj, needed, available, selectors.running_gpus_of(user)),
                    code="credit",
                )
        paid_by = f" for the project {project.name}" if project is not None else ""
        deadline_at = _deadline(stop_after_seconds, now)
        if on_booking:
            paid_by += f" on booking {on_booking.short_id} (until {on_booking.ends_at:%Y-%m-%d %H:%M} UTC)"
            deadline_at = min(deadline_at or on_booking.ends_at, on_booking.ends_at)
        instance = transitions.queue(
            message=f"Launch of {image.name} on {size_obj.name}{paid_by} queued.",
            user=user,
            project=project,
            size=size_obj.key,
            image=image,
            driver=settings.DEVCLOUD_DRIVER,
            jupyter_token=secrets.token_hex(24),
            deadline_at=deadline_at,
            reservation=on_booking or None,
        )
        transaction.on_commit(lambda: publish(instance.id))
    if published.get("ok") is False:
        raise LaunchUnavailable(UNAVAILABLE_MESSAGE, code="unavailable")
    return instance


def _fail_unqueued(instance_id) -> None:
    instance = Instance.objects.filter(id=instance_id).first()
    if instance is not None:
        transitions.fail(
            instance,
            reason="Launching was unavailable (the task queue did not answer), so this launch never started. "
            "Nothing was charged. Please launch again in a few minutes.",
            from_states=[Instance.State.QUEUED],
        )


def instance_stop(*, user, instance_id) -> Instance:
    """The owner stops their instance, or an owner of its project stops a project instance. Returns it,
    stopping (or stopped, if it never left the queue).

    Raises Http404 when the instance does not exist or the user may not stop it, and ValidationError when
    it has already stopped or failed.
    """
    instance = selectors.instance_stoppable_by(user, instance_id)
    reason = StopReason.USER if instance.user_id == user.pk else StopReason.PROJECT_OWNER
    return instance_request_stop(instance_id=instance.id, reason=reason)


# What one extension may ask for; SESSION_MAX_EXTENSION_HOURS caps the total per session.
EXTEND_MIN_HOURS = 1


def instance_extend(*, user, instance_id, hours: int) -> Instance:
    """Add `hours` to the longest length of the owner's running session, so the limits beat stops it that
    much later (and warns again before the new end). Returns the instance. A launch's own deadline
    (deadline_at) does not move.

    Allowed while the hours added to this session stay within SESSION_MAX_EXTENSION_HOURS and the paying
    account (the owner's, or the project's pool) covers them: its balance, minus what its live instances
    will burn in the launch window and the hours already added to them that are still to come, must
    cover `hours` at the instance's size. The check and the write happen under that account's lock (taken
    before the instance's, the order metering uses), so two extensions racing for the last credit cannot
    both pass.

    Raises Http404 for an unknown id or someone else's instance, ValidationError (code "ended", "invalid",
    "ceiling", "no_limit", "credit" or "booked": the hours would run into a window booked on its host)
    with a message the owner can act on.
    """
    instance = selectors.instance_of_owner(user, instance_id)
    ceiling = settings.SESSION_MAX_EXTENSION_HOURS
    if not ceiling:
        raise ValidationError("Sessions cannot be extended on this DevCloud.", code="ceiling")
    if not isinstance(hours, int) or isinstance(hours, bool) or hours < EXTEND_MIN_HOURS:
        raise ValidationError(
            f"Extend by a whole number of hours, at least {EXTEND_MIN_HOURS}.", code="invalid"
        )
    policy = LaunchPolicy.current()
    now = timezone.now()
    with transaction.atomic():
        account = metering.payer_locked(instance)
        # of=self: the project is read, not locked (it sits on the nullable side of the join).
        locked = Instance.objects.select_for_update(of=("self",)).select_related("project")
        instance = locked.get(id=instance.id)
        if instance.state != Instance.State.RUNNING:
            raise ValidationError(
                f"Only a running instance can be extended; this one is {instance.state}.", code="ended"
            )
        current_end = sessions.session_end(instance, policy)
        if current_end is None:
            raise ValidationError(
                "This session has no time limit, so there is nothing to extend.", code="no_limit"
            )
        added_hours = instance.extended_seconds / 3600
        if instance.extended_seconds + hours * 3600 > ceiling * 3600:
            raise ValidationError(
                f"A session may be extended by at most {ceiling} hours in all; this one has "
                f"{added_hours:g} already, so at most {max(ceiling - added_hours, 0):g} more.",
                code="ceiling",
            )
        size = SIZES[instance.size]
        needed = size.gpus * hours * 3600
        available = account.balance_gpu_seconds - _committed_with_extensions(account, policy=policy, now=now)
        if available < needed:
            payer = (
                f"the project {instance.project.name}'s pool has {hours_text(max(available, 0))} GPU-hours "
                "after what its running instances will use"
                if instance.project_id
                else f"you have {hours_text(max(available, 0))} GPU-hours after what your running instances "
                "will use"
            )
            raise ValidationError(
                f"Not enough credit: {hours} more hour{'s' if hours != 1 else ''} on {size.name} need "
                f"{hours_text(needed)} GPU-hours; {payer}.",
                code="credit",
            )
        crossing = reservations.extension_refusal(
            instance,
            new_end=min(
                end for end in (current_end + timedelta(hours=hours), instance.deadline_at) if end is not None
            ),
            policy=policy,
            now=now,
        )
        if crossing:
            raise ValidationError(crossing, code="booked")
        instance.extended_seconds += hours * 3600
        instance.save(update_fields=["extended_seconds"])
        end = sessions.session_end(instance, policy)
        transitions.event_record(
            instance=instance,
            message=f"Session extended by {hours} hour{'s' if hours != 1 else ''} by its owner; it now "
            f"stops at {end:%Y-%m-%d %H:%M} UTC.",
        )
    return instance


def _committed_with_extensions(account: CreditAccount, *, policy: LaunchPolicy, now) -> int:
    """GPU-seconds the live instances `account` pays for will use: the launch window's rule
    (selectors.committed_gpu_seconds), plus the hours added to their sessions that are still to come."""
    if account.project_id is not None:
        committed = selectors.project_committed_gpu_seconds(account.project_id, now=now)
    else:
        committed = selectors.committed_gpu_seconds(account.user, now=now)
    extended = Instance.objects.filter(
        metering.paid_by(account), state=Instance.State.RUNNING, extended_seconds__gt=0
    ).select_related("project")
    for other in extended:
        end = sessions.session_end(other, policy)
        if end is not None:
            to_come = min(other.extended_seconds, max(int((end - now).total_seconds()), 0))
            committed += SIZES[other.size].gpus * to_come
    return committed


def instance_request_stop(*, instance_id, reason: str, note: str = "", message: str = "") -> Instance:
    """Stop an instance for `reason` (a StopReason), with `note` (an operator's words) for its owner.
    Returns it.

    A running instance is charged up to now in the same transaction, so billing ends the moment the
    stop is asked for. A running or provisioning instance moves to STOPPING and a teardown is enqueued
    (if the queue is down, the reconciler enqueues it later; billing has stopped either way). A queued
    one goes straight to STOPPED and gives back any GPUs it was handed. Stopping a STOPPING instance
    again changes nothing (it keeps its first reason).

    Raises Instance.DoesNotExist for an unknown id, ValidationError when it has already ended, and
    ValueError for an unknown reason. For operators, limits and the idle culler; the owner's path is
    instance_stop().
    """
    payer = Instance.objects.only("user_id", "project_id").get(id=instance_id)
    now = timezone.now()
    with transaction.atomic():
        metering.payer_locked(payer)
        instance = Instance.objects.select_for_update().get(id=instance_id)
        if instance.state == Instance.State.STOPPING:
            return instance
        if instance.state in (Instance.State.STOPPED, Instance.State.FAILED):
            raise ValidationError(
                f"This instance has already {'stopped' if instance.state == 'stopped' else 'failed'}."
            )
        if instance.state == Instance.State.RUNNING:
            metering.charge_until(instance=instance, until=now)
        moved = transitions.stop(instance, reason=reason, note=note, message=message, now=now)
        if moved == Instance.State.STOPPED:
            transaction.on_commit(lambda: scheduler.release(instance_id=instance_id))
        elif moved == Instance.State.STOPPING:
            transaction.on_commit(lambda: enqueue(tasks.teardown_instance, instance_id=str(instance_id)))
    return instance


def instances_stop_all(*, user_ids, reason: str, note: str = "", message: str) -> transitions.BulkStop:
    """Stop every live instance of these accounts at once, for `reason`: running ones are charged up to
    this moment first, then all of them move in one bulk stop (queued -> stopped and their GPUs given
    back; provisioning and running -> stopping, with a teardown enqueued for each once this commits).
    Returns the BulkStop.

    Takes the owners' CreditAccount locks and the pools of the projects they have live instances in, in
    id order, so a launch that races it either lands first (and is stopped here) or sees what the caller
    changed under the same lock (a suspension, a deletion): a project launch holds its launcher's own
    account lock too. May run inside the caller's transaction. Instances already stopping keep their
    first reason.
    """
    user_ids = sorted(set(user_ids))
    owned = Instance.objects.filter(user_id__in=user_ids)
    return stop_all_of(owned, user_ids=user_ids, reason=reason, note=note, message=message)


def stop_all_of(owned, *, user_ids, reason: str, note: str = "", message: str) -> transitions.BulkStop:
    """instances_stop_all for the live instances of `owned` (a queryset of instances `user_ids`
    launched), under the locks of the launchers' own accounts and of the project pools paying for any of
    them, taken in id order. Returns the BulkStop."""
    for user_id in user_ids:
        CreditAccount.objects.get_or_create(user_id=user_id)
    now = timezone.now()
    with transaction.atomic():
        live_projects = owned.filter(state__in=Instance.LIVE_STATES, project__isnull=False)
        project_ids = set(live_projects.values_list("project_id", flat=True))
        list(
            CreditAccount.objects.select_for_update()
            .filter(Q(user_id__in=user_ids) | Q(project_id__in=project_ids))
            .order_by("id")
        )
        # A project launch that committed between the read above and the locks: its pool is locked last,
        # out of id order. Rare, and no launch of these people can start now (they hold their own lock).
        late = set(live_projects.values_list("project_id", flat=True)) - project_ids
        list(CreditAccount.objects.select_for_update().filter(project_id__in=late).order_by("id"))
        running = owned.select_for_update().filter(state=Instance.State.RUNNING).select_related("user")
        for instance in running.order_by("id"):
            metering.charge_until(instance=instance, until=now)
        stopped = transitions.bulk_stop(owned, reason=reason, note=note, message=message, now=now)

        def after_commit():
            for instance_id in stopped.stopped_queued_ids:
                scheduler.release(instance_id=instance_id)
            for instance_id in stopped.stopping_ids:
                enqueue(tasks.teardown_instance, instance_id=str(instance_id))

        transaction.on_commit(after_commit)
    return stopped


# --- Operator stops ----------------------------------------------------------------------------------
#
# The stop itself is instance_request_stop (billing ends at once, teardown is enqueued); an operator's
# stop adds the notice to the owner, in the same transaction.


def _operator_stop(*, instance_id, reason: str, note: str, message: str):
    """Stop one instance for an operator and tell its owner why (`note`). Returns the Instance, or None
    when it had already ended or was already stopping for another reason (then nobody is told anything)."""
    with transaction.atomic():
        try:
            instance = instance_request_stop(instance_id=instance_id, reason=reason, note=note, message=message)
        except ValidationError:
            return None
        if instance.stop_reason != reason:
            return None  # it was stopping already, for its own reason
        notify_instance_stopped(instance=instance, reason=reason, operator_reason=note)
    return instance


def instance_force_stop(*, instance_id, actor, reason: str):
    """An operator stops one instance. Returns it (stopping, or stopped if it was still queued).

    The owner sees `reason` on their instance page (stop_reason operator, stop_note `reason`) and in the
    instance_stopped email; the audit log records it as "instance.force_stop". Billing ends at once.

    Raises ValueError for a blank reason or one longer than FORCE_STOP_REASON_MAX characters, and
    django's ValidationError when the instance has already ended or is already stopping.
    """
    reason = (reason or "").strip()
    if not reason:
        raise ValueError("A force stop needs a reason: the owner reads it.")
    if len(reason) > FORCE_STOP_REASON_MAX:
        raise ValueError(f"Keep the reason within {FORCE_STOP_REASON_MAX} characters.")
    with transaction.atomic():
        before = Instance.objects.select_related("user", "host").get(id=instance_id)
        if before.state == Instance.State.STOPPING:
            raise ValidationError("This instance is already stopping.")
        instance = _operator_stop(
            instance_id=instance_id,
            reason=StopReason.OPERATOR,
            note=reason,
            message=f"Stopped by an operator: {reason}",
        )
        if instance is None:
            raise ValidationError(f"This instance has already {before.state}.")
        audit_record(
            actor=actor,
            action="instance.force_stop",
            target=instance,
            reason=reason,
            details={
                "owner": before.user.email,
                "previous_state": before.state,
                "host": before.host.name if before.host_id else "",
            },
        )
    return instance


@dataclass
class EvictionSummary:
    """What host_evict did: instances it stopped (their owners were told) and ones already stopping."""

    host: object
    stopped: list = field(default_factory=list)
    already_stopping: list = field(default_factory=list)

    def __str__(self):
        text = f"Evicted {self.host.name}: it is draining, {len(self.stopped)} instance(s) stopped and their owners told"
        if self.already_stopping:
            text += f"; {len(self.already_stopping)} were already stopping"
        return text + "."


def host_evict(*, host_id: int, actor, reason: str) -> EvictionSummary:
    """Cordon the host (provisioning's host_cordon: draining, nothing new is placed, audited as
    "host.evict") and stop every instance on it, telling each owner.

    Each queued, provisioning or running instance on the host is stopped with stop_reason host_evicted
    and the operator's `reason` as its note (charged up to now, workspace kept), and its owner gets an
    instance_stopped notice carrying `reason`. Instances already stopping are left to finish. Running it
    again stops whatever is left and tells nobody twice. Returns an EvictionSummary.

    Raises ValueError for a blank reason (the owners read it) and provisioning's HostError for a retired
    host.
    """
    reason = (reason or "").strip()
    if not reason:
        raise ValueError("Evicting a host needs a reason: the owners of its instances read it.")
    host, live_ids = fleet.host_cordon(host_id=host_id, actor=actor, reason=reason)
    summary = EvictionSummary(host=host)
    live = Instance.objects.filter(id__in=live_ids).select_related("user", "image").order_by("created_at")
    for instance in live:
        if instance.state == Instance.State.STOPPING:
            summary.already_stopping.append(instance)
            continue
        # One transaction per instance: a stop that fails (it ended meanwhile) leaves the others alone.
        stopped = _operator_stop(
            instance_id=instance.id,
            reason=StopReason.HOST_EVICTED,
            note=reason,
            message=f"Stopped by an operator, who is evicting host {host.name}: {reason}",
        )
        if stopped is not None:
            summary.stopped.append(stopped)
    return summary
