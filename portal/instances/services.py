"""Operations on instances that the web side starts: launch and stop.

The worker side (provision, teardown, reconcile) is in provisioning/lifecycle.py. Both move an
instance's state only by conditional updates, and both take the owner's CreditAccount lock before an
Instance row lock (the order metering uses), so they never deadlock with each other.
"""

import logging
import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.utils import timezone

from portal.credits import metering
from portal.credits.models import CreditAccount
from provisioning.selectors import image_availability, in_service_hosts

from . import entitlements, selectors
from .models import Image, Instance, InstanceEvent, LaunchPolicy
from .sizes import SIZES

logger = logging.getLogger(__name__)

UNAVAILABLE_MESSAGE = (
    "Launching is unavailable right now, nothing was charged. Please try again in a few minutes."
)
STOP_REASON_USER = "user"


class LaunchUnavailable(ValidationError):
    """The task queue could not be reached, so the launch was not started (and nothing was charged)."""


def instance_event_record(
    *, instance: Instance, message: str, state: str | None = None, step: str | None = None
):
    """Add a line to the instance's timeline. Returns the InstanceEvent."""
    return InstanceEvent.objects.create(
        instance_id=instance.pk, state=state or instance.state, step=step or instance.step, message=message
    )


def _broker_errors() -> tuple:
    # What a publish raises when Redis is down: kombu wraps most of it, but a refused connection can
    # surface as redis-py's or the socket's own error depending on where it fails.
    from kombu.exceptions import OperationalError
    from redis.exceptions import RedisError

    return (OperationalError, RedisError, ConnectionError, OSError)


def enqueue(task_name: str, **kwargs) -> bool:
    """Publish a provisioning task by its stable name. Returns False (and logs) when the broker is unreachable.

    Tasks are imported here, not at module level: provisioning.tasks imports this module's callers.
    """
    from provisioning import tasks

    task = tasks.BY_NAME[task_name]
    try:
        task.apply_async(kwargs=kwargs, retry=False)
    except _broker_errors() as error:
        logger.warning("Could not enqueue %s(%s): %s", task_name, kwargs, error)
        return False
    return True


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


def _validate_launch(*, user, size: str, image_key: str, policy: LaunchPolicy):
    """Check everything about a launch that needs no lock. Returns (Size, Image); raises ValidationError."""
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
        raise ValidationError(f"Unknown image {image_key!r}. Choose one of the images listed.", code="image")
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
    refusal = entitlements.size_refusal(user, size_obj, policy)
    if refusal:
        raise ValidationError(refusal.message, code="size")
    return size_obj, image


def instance_launch(*, user, size: str, image_key: str) -> Instance:
    """Queue a launch of `image_key` at `size` for `user` and enqueue its provisioning. Returns the Instance.

    Checks, in order: an active, unsuspended account with a verified email, a known size, a known and
    enabled image that allows the size, the operators' launch policy (the sizes open to the user's tier
    and to them personally, and the live-instance limit; see entitlements), and credit: the balance minus
    what the user's other live instances will burn within LAUNCH_MIN_CREDIT_MINUTES must cover that many
    minutes at this size. The credit check and the insert happen under the owner's CreditAccount row
    lock, so two concurrent launches with credit for one succeed for exactly one.

    Raises PermissionDenied for a disabled account, ValidationError with a message the person can act on
    for everything else, and LaunchUnavailable (a ValidationError) when the task queue cannot be reached:
    the instance is then marked failed, and nothing was charged.
    """
    policy = LaunchPolicy.current()
    size_obj, image = _validate_launch(user=user, size=size, image_key=image_key, policy=policy)
    CreditAccount.objects.get_or_create(user=user)
    published = {}

    def publish(instance_id):
        published["ok"] = enqueue("provisioning.provision_instance", instance_id=str(instance_id))
        if not published["ok"]:
            _fail_unqueued(instance_id)

    with transaction.atomic():
        account = CreditAccount.objects.select_for_update().get(user=user)
        # Read again under the lock: user_suspend takes this lock before it stops the user's instances,
        # so a launch either lands before the suspension (and is stopped by it) or sees it here.
        suspended = entitlements.suspension_refusal(get_user_model().objects.get(pk=user.pk))
        if suspended:
            raise ValidationError(suspended.message, code="suspended")
        now = timezone.now()
        live = Instance.objects.filter(user=user, state__in=selectors.BURNING_STATES).count()
        over_limit = entitlements.live_limit_refusal(live, policy.max_live_instances)
        if over_limit:
            raise ValidationError(over_limit.message, code="limit")
        available = account.balance_gpu_seconds - selectors.committed_gpu_seconds(user, now=now)
        needed = selectors.launch_minimum_gpu_seconds(size_obj)
        if available < needed:
            raise ValidationError(
                selectors.shortfall_message(size_obj, needed, available, selectors.running_gpus_of(user)),
                code="credit",
            )
        instance = Instance.objects.create(
            user=user,
            size=size_obj.key,
            image=image,
            state=Instance.State.QUEUED,
            step=Instance.Step.QUEUED,
            driver=settings.DEVCLOUD_DRIVER,
            jupyter_token=secrets.token_hex(24),
        )
        instance_event_record(instance=instance, message=f"Launch of {image.name} on {size_obj.name} queued.")
        transaction.on_commit(lambda: publish(instance.id))
    if published.get("ok") is False:
        raise LaunchUnavailable(UNAVAILABLE_MESSAGE, code="unavailable")
    return instance


def _fail_unqueued(instance_id) -> None:
    now = timezone.now()
    moved = Instance.objects.filter(id=instance_id, state=Instance.State.QUEUED).update(
        state=Instance.State.FAILED,
        failure_reason="Launching was unavailable (the task queue did not answer), so this launch never started. "
        "Nothing was charged. Please launch again in a few minutes.",
        stopped_at=now,
        state_changed_at=now,
    )
    if moved:
        InstanceEvent.objects.create(
            instance_id=instance_id, state=Instance.State.FAILED, message="The task queue did not answer."
        )


def instance_stop(*, user, instance_id) -> Instance:
    """The owner stops their instance. Returns it, stopping (or stopped, if it never left the queue).

    Raises Http404 when the instance does not exist or is not the user's, and ValidationError when it
    has already stopped or failed.
    """
    instance = selectors.instance_of_owner(user, instance_id)
    return instance_request_stop(instance_id=instance.id, stop_reason=STOP_REASON_USER)


def instance_request_stop(*, instance_id, stop_reason: str, message: str = "") -> Instance:
    """Stop an instance for any reason ("user", "operator", "idle", "credits exhausted"). Returns it.

    A running instance is charged up to now in the same transaction, so billing ends the moment the
    stop is asked for. A running or provisioning instance moves to STOPPING and a teardown is enqueued
    (if the queue is down, the reconciler enqueues it later; billing has stopped either way). A queued
    one goes straight to STOPPED and gives back any GPUs it was handed. Stopping a STOPPING instance
    again changes nothing.

    Raises Instance.DoesNotExist for an unknown id and ValidationError when it has already ended.
    For operators and the idle culler; the owner's path is instance_stop().
    """
    owner_id = Instance.objects.values_list("user_id", flat=True).get(id=instance_id)
    CreditAccount.objects.get_or_create(user_id=owner_id)
    now = timezone.now()
    with transaction.atomic():
        CreditAccount.objects.select_for_update().get(user_id=owner_id)
        instance = Instance.objects.select_for_update().get(id=instance_id)
        if instance.state == Instance.State.STOPPING:
            return instance
        if instance.state in (Instance.State.STOPPED, Instance.State.FAILED):
            raise ValidationError(
                f"This instance has already {'stopped' if instance.state == 'stopped' else 'failed'}."
            )
        if instance.state == Instance.State.RUNNING:
            metering.charge_until(instance=instance, until=now)
        if instance.state == Instance.State.QUEUED:
            Instance.objects.filter(id=instance_id, state=Instance.State.QUEUED).update(
                state=Instance.State.STOPPED, stop_reason=stop_reason, stopped_at=now, state_changed_at=now
            )
            instance.refresh_from_db()
            instance_event_record(instance=instance, message=message or "Stopped before it started.")

            def give_back():
                from provisioning import scheduler

                scheduler.release(instance_id=instance_id)

            transaction.on_commit(give_back)
            return instance
        Instance.objects.filter(
            id=instance_id, state__in=[Instance.State.RUNNING, Instance.State.PROVISIONING]
        ).update(state=Instance.State.STOPPING, stop_reason=stop_reason, state_changed_at=now)
        instance.refresh_from_db()
        instance_event_record(instance=instance, message=message or "Stopping.")
        transaction.on_commit(lambda: enqueue("provisioning.teardown_instance", instance_id=str(instance_id)))
    return instance
