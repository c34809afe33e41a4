"""Operations of the API's own: personal access tokens and idempotent launches.

Everything else the API does (launch, stop, keys, bonus applications) is the pages' own services.
"""

import hashlib
import hmac
import json
import secrets
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from portal.instances import selectors as instance_selectors
from portal.instances import services as instance_services
from portal.instances.models import Instance

from .models import ApiToken, IdempotentLaunch, TokenLaunch

TOKEN_PREFIX = "dcp"
# How stale last_used_at may get: a busy script does not write the row on every request.
LAST_USED_RESOLUTION = timedelta(minutes=1)
IDEMPOTENCY_KEY_MAX_LENGTH = 200


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def token_create(*, user, name: str, scope: str, days: int, added_from: str = "") -> tuple[ApiToken, str]:
    """Create a token for `user` that expires in `days` days, recording `added_from` (the creating
    session's origin_of_session: a password change revokes tokens made elsewhere). Returns (ApiToken,
    the whole token text).

    The text is returned only here: the database keeps its prefix and the SHA-256 of its secret.
    Raises ValidationError keyed by field: "name" (blank), "scope" (unknown), "days" (out of range), and
    a non-field error for an account whose email address is not confirmed, so that someone who signed
    up with another person's address cannot keep a way in after the owner proves it (see
    portal.accounts.services.access_reset, which also revokes tokens).
    """
    if not user.email_verified:
        raise ValidationError("Confirm your email address before creating API tokens.")
    errors = {}
    name = (name or "").strip()
    if not name:
        errors["name"] = "Give the token a name, e.g. “CI on GitHub”."
    elif len(name) > 100:
        errors["name"] = "Keep the name to 100 characters or fewer."
    if scope not in ApiToken.Scope.values:
        errors["scope"] = "Choose read, or read and launch."
    if not isinstance(days, int) or not 1 <= days <= settings.API_TOKEN_MAX_DAYS:
        errors["days"] = f"A token lives between 1 and {settings.API_TOKEN_MAX_DAYS} days."
    if errors:
        raise ValidationError(errors)
    prefix, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        user=user,
        name=name,
        scope=scope,
        prefix=prefix,
        secret_sha256=_digest(secret),
        expires_at=timezone.now() + timedelta(days=days),
        added_from=added_from,
    )
    return token, f"{TOKEN_PREFIX}_{prefix}_{secret}"


def token_revoke(*, user, token_id) -> ApiToken:
    """Revoke one of `user`'s tokens; it stops working at once. Returns it (revoking twice is harmless).

    Raises ApiToken.DoesNotExist for an unknown id and for another user's token alike.
    """
    token = ApiToken.objects.get(pk=token_id, user=user)
    ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
    token.refresh_from_db()
    return token


def tokens_revoke_all(*, user) -> int:
    """Revoke every live token of `user` (when the owner proves their address). Returns how many."""
    return ApiToken.objects.filter(user=user, revoked_at__isnull=True, expires_at__gt=timezone.now()).update(
        revoked_at=timezone.now()
    )


def token_authenticate(text: str) -> ApiToken | None:
    """The live token `text` names, with its user loaded; None when it is malformed, unknown, revoked,
    expired, or belongs to an account that is no longer active (deleted or deactivated).

    The secret's digest is compared in constant time, so timing tells nothing about how much of a
    guess was right. Marks the token used (at most once a minute).
    """
    parts = (text or "").split("_", 2)
    if len(parts) != 3 or parts[0] != TOKEN_PREFIX or not parts[1] or not parts[2]:
        return None
    token = ApiToken.objects.select_related("user").filter(prefix=parts[1]).first()
    if token is None or not hmac.compare_digest(token.secret_sha256, _digest(parts[2])):
        return None
    now = timezone.now()
    if token.revoked_at is not None or token.expires_at <= now or not token.user.is_active:
        return None
    if token.last_used_at is None or token.last_used_at < now - LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token


# --- Idempotent launches ---------------------------------------------------------------------------


class IdempotencyConflict(Exception):
    """The Idempotency-Key was used before with a different request body."""


def _request_digest(
    size: str, image_key: str, project: str | None, stop_after_seconds: int | None, reservation=None
) -> str:
    request = {"size": size, "image": image_key}
    # Each only when set, so keys stored before launches could carry them still match.
    if project:
        request["project"] = project
    if stop_after_seconds is not None:
        request["stop_after_seconds"] = stop_after_seconds
    if reservation:
        request["reservation"] = str(reservation)
    return _digest(json.dumps(request, sort_keys=True))


def instance_launch_once(
    *,
    user,
    size: str,
    image_key: str,
    idempotency_key: str = "",
    project: str | None = None,
    stop_after_seconds: int | None = None,
    token: ApiToken | None = None,
    reservation=None,
) -> tuple[Instance, bool]:
    """Launch through portal.instances.services.instance_launch, at most once per Idempotency-Key.

    Returns (instance, replayed): replayed is True when `idempotency_key` was used before with the same
    size, image, project, time limit and booking, and the instance that request launched is returned
    instead of launching again.
    Without a key every call launches.

    The key's row is inserted first, in the launch's transaction: a concurrent retry blocks on the
    unique constraint until the first request commits, then finds its instance. A refused launch
    (ValidationError) leaves no row, so the same key may be retried once the cause is fixed; so does a
    launch that failed before it was provisioned (the task queue did not take it; nothing was charged).

    `project`, a project's slug, pays from its pool (instance_launch's `project`). `token`, the API token
    the request came with, is recorded as the launch's (a project's usage by token), and a robot token's
    own live-instance limit applies. `reservation` names one of the user's bookings to launch on.

    Raises IdempotencyConflict for a key used with a different body, LaunchUnavailable when the launch
    failed at once, and whatever instance_launch raises (ValidationError, PermissionDenied, Http404).
    """
    launch = {
        "user": user,
        "size": size,
        "image_key": image_key,
        "project": project,
        "stop_after_seconds": stop_after_seconds,
        "reservation": reservation,
    }
    if not idempotency_key:
        if token is None:
            return instance_services.instance_launch(**launch), False
        with transaction.atomic():
            instance = _launch_with(token, launch)
        return _published(instance), False
    digest = _request_digest(size, image_key, project, stop_after_seconds, reservation)
    try:
        with transaction.atomic():
            claim = IdempotentLaunch.objects.create(user=user, key=idempotency_key, request_sha256=digest)
            instance = _launch_with(token, launch)
            claim.instance = instance
            claim.save(update_fields=["instance"])
    except IntegrityError:
        previous = IdempotentLaunch.objects.select_related("instance").get(user=user, key=idempotency_key)
        if not hmac.compare_digest(previous.request_sha256, digest):
            raise IdempotencyConflict(
                "This Idempotency-Key was already used for a launch with a different size, image, project, time "
                "limit or booking. Use a new key for a new launch."
            ) from None
        return previous.instance, True
    try:
        return _published(instance), False
    except instance_services.LaunchUnavailable:
        IdempotentLaunch.objects.filter(pk=claim.pk).delete()
        raise


def _launch_with(token: ApiToken | None, launch: dict) -> Instance:
    """instance_launch, inside the caller's transaction, with what an API token adds: a robot token's own
    live-instance limit, checked under the token's row lock (taken before instance_launch's account
    locks, on every path), and the record of which token launched the instance."""
    if token is not None and token.max_live_instances:
        ApiToken.objects.select_for_update().filter(pk=token.pk).first()
        live = TokenLaunch.objects.filter(token=token, instance__state__in=instance_selectors.BURNING_STATES).count()
        if live >= token.max_live_instances:
            raise ValidationError(
                f"This token may have {token.max_live_instances} instance(s) running or starting at once, and "
                f"has {live}. Stop one, or ask an owner of the project to raise the token's limit.",
                code="limit",
            )
    instance = instance_services.instance_launch(**launch)
    if token is not None:
        TokenLaunch.objects.create(token=token, instance=instance)
    return instance


def _published(instance: Instance) -> Instance:
    """The instance once its launch's transaction committed. instance_launch publishes the provisioning
    task at the commit, so a queue outage shows only now, as an instance that failed before provisioning
    began: raises LaunchUnavailable for that."""
    instance.refresh_from_db()
    if instance.state == Instance.State.FAILED and instance.provisioning_at is None:
        raise instance_services.LaunchUnavailable(
            instance.failure_reason or instance_services.UNAVAILABLE_MESSAGE, code="unavailable"
        )
    return instance
