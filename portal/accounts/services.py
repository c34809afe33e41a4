"""Operations on accounts: sign-up, email confirmation and change, password reset, SSH keys, deletion,
and the operators' suspension and per-person launch sizes.

Views, forms and tasks call these and hold no business logic. Each raises ValidationError with a
message a person can act on, or LinkError for a confirmation link that no longer works.
"""

import base64
import hashlib
import logging
import secrets
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation

from axes.models import AccessAttempt, AccessFailureLog, AccessLog
from axes.utils import reset as axes_reset
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from django.conf import settings
from django.contrib.auth.hashers import make_password
from django.contrib.auth.password_validation import validate_password
from django.contrib.sessions.models import Session
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.encoding import force_bytes
from django.utils.http import urlencode, urlsafe_base64_encode

from portal.audit.services import actor_name_of, audit_record
from portal.credits.models import CreditAccount
from portal.credits.services import credits_grant_signup
from portal.instances.services import instances_stop_all
from portal.instances.sizes import SIZES
from portal.instances.stop_reasons import StopReason
from portal.lib.tasks import publish
from portal.notifications.services import notify_account_suspended
from portal.sshgateway.services import keys_changed
from provisioning.workspaces import workspaces_remove_all

from .models import SshKey, User, share_text
from .tokens import TokenState, email_change_tokens, email_verification_tokens, password_reset_tokens

log = logging.getLogger(__name__)

# What a publish raises when Redis is down or unreachable. Sign-up must not fail because of it.

RSA_MIN_BITS = 2048


class EmailKind:
    VERIFY = "verify"
    EMAIL_CHANGE = "email_change"
    PASSWORD_RESET = "password_reset"
    # Tells the owner that proving the address removed the ways in that were there before.
    ACCESS_RESET = "access_reset"
    # Tells the owner the password changed, and which credentials that change revoked.
    PASSWORD_CHANGED = "password_changed"
    # Someone signed up with an address that has an account: its owner is told, the form is not.
    ACCOUNT_EXISTS = "account_exists"


class LinkError(Exception):
    """A confirmation link that cannot be used. `reason` is one of the constants below."""

    EXPIRED = "expired"
    INVALID = "invalid"  # garbled, already used, or replaced by a newer link
    ALREADY_CONFIRMED = "already_confirmed"
    TAKEN = "taken"  # the new address was claimed by another account in the meantime

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def _clean_email(email: str) -> str:
    return User.objects.normalize_email((email or "").strip()).lower()


def _email_in_use(email: str, *, exclude_pk=None) -> bool:
    users = User.objects.filter(email__iexact=email)
    if exclude_pk is not None:
        users = users.exclude(pk=exclude_pk)
    return users.exists()


# --- Sign-up and email verification ------------------------------------------------------------


def account_signup(*, email: str, password: str) -> User | None:
    """Create an account with `email` as login and queue its verification email.

    Sign-up must not tell anyone whether an address has an account, so a taken address (in any case)
    is not an error: its owner is emailed that they already have an account (with the way to log in or
    reset the password; an account still unconfirmed gets its confirmation link again), the password is
    hashed all the same (the slow part of a sign-up), and None is returned. The new account cannot log
    in until its address is confirmed (forms.LoginForm): a login would tell the address was free.
    Returns the new (unverified) user otherwise. Raises ValidationError({"password": [...]}) when a
    password validator refuses it, for a taken address and a new one alike.
    """
    email = _clean_email(email)
    validate_password_for(email=email, password=password)
    existing = User.objects.filter(email__iexact=email).first()
    if existing is None:
        try:
            with transaction.atomic():
                user = User.objects.create_user(email, password)
        except IntegrityError:
            # Two sign-ups for one address at once: the database's case-insensitive unique index decides.
            existing = User.objects.filter(email__iexact=email).first()
        else:
            email_send_later(kind=EmailKind.VERIFY, user_id=user.pk)
            return user
    else:
        make_password(password)
    if existing is not None:
        # An unconfirmed account cannot log in to ask for its link again: signing up again sends it.
        kind = EmailKind.ACCOUNT_EXISTS if existing.email_verified else EmailKind.VERIFY
        email_send_later(kind=kind, user_id=existing.pk)
    return None


def validate_password_for(*, email: str, password: str, user: User | None = None) -> None:
    """Run the configured password validators. Raises ValidationError({"password": [...]})."""
    try:
        validate_password(password, user=user or User(email=email))
    except ValidationError as error:
        raise ValidationError({"password": error.messages}) from None


def email_verification_resend(*, user: User) -> list[str]:
    """Queue again every confirmation link the user is still waiting for.

    Returns the addresses written to: the current one while unverified, and the pending new one.
    An empty list means there is nothing left to confirm.
    """
    addresses = []
    if not user.email_verified:
        email_send_later(kind=EmailKind.VERIFY, user_id=user.pk)
        addresses.append(user.email)
    if user.pending_email:
        email_send_later(kind=EmailKind.EMAIL_CHANGE, user_id=user.pk)
        addresses.append(user.pending_email)
    return addresses


def _link_state(generator, user: User, token: str, *, already_confirmed) -> None:
    """Raise LinkError unless `token` is a live link of `generator` for `user` (changes nothing)."""
    state = generator.token_state(user, token)
    if state is TokenState.EXPIRED:
        raise LinkError(LinkError.EXPIRED)
    if state is not TokenState.VALID:
        raise LinkError(LinkError.ALREADY_CONFIRMED if already_confirmed(user) else LinkError.INVALID)


def _verified_and_nothing_pending(user: User) -> bool:
    return user.email_verified and not user.pending_email


def email_verify_check(*, user: User, token: str) -> None:
    """Check a verification link without using it, for the page that asks to confirm.

    Returns None when the link would work. Raises LinkError (expired, already confirmed, invalid).
    """
    _link_state(email_verification_tokens, user, token, already_confirmed=_verified_and_nothing_pending)


def email_verify(*, user: User, token: str, keep_session_key: str | None) -> "Proof":
    """Confirm the user's current address with the token from the emailed link, then give the
    early-registrant grant if this person has not had it.

    Reading the mail proves the address, so every other session of the user ends and every GitHub
    link made before now is removed (see access_reset); `keep_session_key` is the confirming browser's.
    Returns a Proof (the grant's LedgerEntry or None, and what was removed). Raises LinkError when the
    link expired, was already used, or was made before the email or password changed.
    """
    with transaction.atomic():
        # Locked so two clicks at once cannot both pass the single-use check.
        user = User.objects.select_for_update().get(pk=user.pk)
        _link_state(email_verification_tokens, user, token, already_confirmed=_verified_and_nothing_pending)
        user.email_verified_at = timezone.now()
        user.save(update_fields=["email_verified_at"])
        removed = access_reset(user=user, keep_session_key=keep_session_key)
        return Proof(grant=credits_grant_signup(user=user), removed=removed)


# --- Proof of ownership ------------------------------------------------------------------------


@dataclass(frozen=True)
class AccessRemoved:
    """What access_reset took away: the GitHub logins unlinked, how many other sessions ended, the
    address of a pending email change it cancelled ("" when none), and how many API tokens it revoked."""

    github_logins: list = field(default_factory=list)
    sessions_ended: int = 0
    pending_email_cancelled: str = ""
    api_tokens_revoked: int = 0
    # Names of the SSH keys removed.
    ssh_keys: list = field(default_factory=list)
    # Names of the API tokens revoked, where known (a password change knows them).
    api_token_names: list = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(
            self.github_logins
            or self.sessions_ended
            or self.pending_email_cancelled
            or self.api_tokens_revoked
            or self.ssh_keys
        )

    def summary(self) -> str:
        """One sentence for the page, e.g. "we disconnected GitHub (mallory) and logged out 2 other
        browsers"; "" when nothing was removed."""
        parts = []
        if self.github_logins:
            parts.append(f"disconnected GitHub ({', '.join(self.github_logins)})")
        if self.sessions_ended:
            count = self.sessions_ended
            parts.append(f"logged out {count} other browser{'' if count == 1 else 's'}")
        if self.pending_email_cancelled:
            parts.append(f"cancelled the change of address to {self.pending_email_cancelled}")
        if self.api_tokens_revoked:
            count = self.api_tokens_revoked
            names = f" ({', '.join(self.api_token_names)})" if self.api_token_names else ""
            parts.append(f"revoked {count} API token{'' if count == 1 else 's'}{names}")
        if self.ssh_keys:
            count = len(self.ssh_keys)
            parts.append(f"removed {count} SSH key{'' if count == 1 else 's'} ({', '.join(self.ssh_keys)})")
        if not parts:
            return ""
        return "we " + (", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0])


@dataclass(frozen=True)
class Proof:
    """The result of proving the address: the early-registrant grant (a LedgerEntry or None) and the
    access that was removed."""

    grant: object = None
    removed: AccessRemoved = field(default_factory=AccessRemoved)


def access_reset(
    *, user: User, keep_session_key: str | None, cancel_pending_email: bool = False
) -> AccessRemoved:
    """Remove every way into the account that was added before its owner proved the address.

    Someone can sign up with another person's address and add their own way in before the owner ever
    sees the account; whoever proves the address (by a link we emailed to it) must end up the only one
    inside. So: every GitHub link of the user is removed, every session of the user except
    `keep_session_key` ends, every API token is revoked, every SSH key is removed (the SSH gateway refuses
    them at once, and the person's instances stop trusting them), and with `cancel_pending_email` a
    pending change of address is cancelled.
    When anything was removed the owner is also emailed. Call it inside the transaction that records the
    proof, with the user row locked. Returns AccessRemoved.
    """
    github_logins = [
        str((social.extra_data or {}).get("login") or social.uid)
        for social in user.social_auth.order_by("created", "pk")
    ]
    user.social_auth.all().delete()
    # Every key on the account was added before this proof, by whoever was inside: maybe not the owner.
    ssh_keys = list(user.ssh_keys.order_by("created_at", "pk").values_list("name", flat=True))
    if ssh_keys:
        user.ssh_keys.all().delete()
        keys_changed(user_id=user.pk)
    sessions_ended = _sessions_end(user_pk=user.pk, keep_session_key=keep_session_key)
    # Imported here: portal.api builds on the instance services, which this module's importers load first.
    from portal.api.services import tokens_revoke_all

    api_tokens_revoked = tokens_revoke_all(user=user)
    cancelled = ""
    if cancel_pending_email and user.pending_email:
        cancelled, user.pending_email = user.pending_email, ""
        user.save(update_fields=["pending_email"])
    removed = AccessRemoved(
        github_logins=github_logins,
        sessions_ended=sessions_ended,
        pending_email_cancelled=cancelled,
        api_tokens_revoked=api_tokens_revoked,
        ssh_keys=ssh_keys,
    )
    if removed:
        email_send_later(kind=EmailKind.ACCESS_RESET, user_id=user.pk)
    return removed


# --- Email change ------------------------------------------------------------------------------


def email_change_request(*, user: User, new_email: str, password: str = "") -> User:
    """Remember `new_email` as pending and send a confirmation link to it. The address only changes
    when that link is followed. Links sent earlier for this account stop working.

    The current password is required when the account has one. Returns the user. Raises
    ValidationError keyed by field ("password", "new_email").
    """
    if user.has_usable_password() and not user.check_password(password or ""):
        raise ValidationError({"password": "That is not your current password."})
    new_email = _clean_email(new_email)
    if new_email == user.email:
        raise ValidationError({"new_email": "That is already your email address."})
    if _email_in_use(new_email, exclude_pk=user.pk):
        raise ValidationError({"new_email": "Another account uses this email address."})
    user.pending_email = new_email
    user.save(update_fields=["pending_email"])
    email_send_later(kind=EmailKind.EMAIL_CHANGE, user_id=user.pk)
    return user


def email_change_cancel(*, user: User) -> None:
    """Forget the pending address; its confirmation link stops working."""
    user.pending_email = ""
    user.save(update_fields=["pending_email"])


def email_change_check(*, user: User, token: str) -> None:
    """Check an email-change link without using it. Returns None when it would work.

    Raises LinkError (expired, invalid or no change pending, or the new address is taken by now).
    """
    _link_state(email_change_tokens, user, token, already_confirmed=lambda user: False)
    if not user.pending_email:
        raise LinkError(LinkError.INVALID)
    if _email_in_use(user.pending_email, exclude_pk=user.pk):
        raise LinkError(LinkError.TAKEN)


def email_change_confirm(*, user: User, token: str, keep_session_key: str | None) -> Proof:
    """Move the account to its pending address, which the token proves the user can read.

    The address counts as verified, so the early-registrant grant is given if this person has not
    had it. Password-reset and older confirmation links die with the old address. As with every proof
    of the address, GitHub links and the other sessions of the user are removed (see access_reset).
    Returns a Proof. Raises LinkError (expired, invalid, or the address is taken by now).
    """
    try:
        with transaction.atomic():
            user = User.objects.select_for_update().get(pk=user.pk)
            email_change_check(user=user, token=token)
            user.email, user.pending_email = user.pending_email, ""
            user.email_verified_at = timezone.now()
            user.save(update_fields=["email", "pending_email", "email_verified_at"])
            removed = access_reset(user=user, keep_session_key=keep_session_key)
            return Proof(grant=credits_grant_signup(user=user), removed=removed)
    except IntegrityError:
        raise LinkError(LinkError.TAKEN) from None


# --- Password reset ----------------------------------------------------------------------------


def password_reset_request(*, email: str) -> None:
    """Queue a reset link for the active account with a password at `email`, if there is one.

    Returns nothing either way, so the caller cannot tell whether the address has an account.
    """
    for user in User.objects.filter(email__iexact=_clean_email(email), is_active=True):
        if user.has_usable_password():
            email_send_later(kind=EmailKind.PASSWORD_RESET, user_id=user.pk)


def password_reset_completed(*, user: User, keep_session_key: str | None = None) -> Proof:
    """After a reset through the emailed link (the new password is saved): the link proves the address.

    So the address counts as verified (with the early-registrant grant if this person has not had it),
    and everything a squatter could have added is removed: GitHub links, every session of the user but
    `keep_session_key`, and a pending change of address (see access_reset). A login lockout on the
    account is lifted too: the lockout page sends people here. Returns a Proof.
    """
    axes_reset(username=user.email)
    with transaction.atomic():
        user = User.objects.select_for_update().get(pk=user.pk)
        user.password_changed_at = timezone.now()
        user.save(update_fields=["password_changed_at"])
        grant = None
        if not user.email_verified:
            user.email_verified_at = timezone.now()
            user.save(update_fields=["email_verified_at"])
            grant = credits_grant_signup(user=user)
        removed = access_reset(user=user, keep_session_key=keep_session_key, cancel_pending_email=True)
    return Proof(grant=grant, removed=removed)


# --- Password change ---------------------------------------------------------------------------

# The session's own random id, kept in its data: it survives the key cycling of log-in and password change.
_ORIGIN_SESSION_KEY = "_credential_origin"


def origin_of_session(session) -> str:
    """What to record as `added_from` on a credential added from `session` (a Django session): a digest
    of a random id the session keeps. Gives the session one when it has none yet."""
    if _ORIGIN_SESSION_KEY not in session:
        session[_ORIGIN_SESSION_KEY] = secrets.token_hex(16)
    return hashlib.sha256(f"session:{session[_ORIGIN_SESSION_KEY]}".encode()).hexdigest()


def origin_of_token(prefix: str) -> str:
    """What to record as `added_from` on a credential added through the API token with `prefix`."""
    return hashlib.sha256(f"token:{prefix}".encode()).hexdigest()


def password_changed(*, user: User, session, keep_session_key: str | None) -> AccessRemoved:
    """After the owner changed the password while logged in (the new one is saved): take the account back
    from whoever else may be inside.

    Every session of the user but `keep_session_key` ends, and the API tokens and SSH keys added since
    the previous password change (or reset) from anywhere but `session` (the changing browser's) are
    revoked: the SSH gateway refuses the keys at once and running instances stop trusting them, as when
    a key is deleted. A token's own additions count as "elsewhere". The owner is emailed what was
    revoked. Returns AccessRemoved (what was revoked and how many sessions ended).
    """
    # Imported here: portal.api builds on the instance services, which this module's importers load first.
    from portal.api.models import ApiToken

    origin = origin_of_session(session)
    now = timezone.now()
    with transaction.atomic():
        user = User.objects.select_for_update().get(pk=user.pk)
        keys = user.ssh_keys.exclude(added_from=origin)
        tokens = ApiToken.objects.filter(user=user, revoked_at__isnull=True, expires_at__gt=now).exclude(
            added_from=origin
        )
        if user.password_changed_at is not None:
            keys = keys.filter(created_at__gt=user.password_changed_at)
            tokens = tokens.filter(created_at__gt=user.password_changed_at)
        ssh_keys = list(keys.order_by("created_at", "pk").values_list("name", flat=True))
        if ssh_keys:
            keys.delete()
            keys_changed(user_id=user.pk)
        token_names = list(tokens.order_by("created_at", "pk").values_list("name", flat=True))
        tokens.update(revoked_at=now)
        sessions_ended = _sessions_end(user_pk=user.pk, keep_session_key=keep_session_key)
        user.password_changed_at = now
        user.save(update_fields=["password_changed_at"])
        removed = AccessRemoved(
            sessions_ended=sessions_ended,
            api_tokens_revoked=len(token_names),
            api_token_names=token_names,
            ssh_keys=ssh_keys,
        )
        email_send_later(
            kind=EmailKind.PASSWORD_CHANGED,
            user_id=user.pk,
            details={"api_tokens": token_names, "ssh_keys": ssh_keys, "sessions_ended": sessions_ended},
        )
    return removed


# --- Sending email -----------------------------------------------------------------------------


def email_send_later(*, kind: str, user_id: int, details: dict | None = None) -> None:
    """Send an account email from a Celery worker once the current transaction commits.

    The worker builds the link itself, so no token travels through the broker; `details` (names and
    counts, JSON) go to the email's template. When the broker is unreachable the email is sent from this
    process instead, and an SMTP failure then is logged rather than raised: the user can ask for the
    link again.
    """
    transaction.on_commit(lambda: _email_publish(kind=kind, user_id=user_id, details=details))


def _email_publish(*, kind: str, user_id: int, details: dict | None = None) -> None:
    from .tasks import send_email

    args = [kind, user_id] + ([details] if details else [])
    publish(send_email, args=args, inline=lambda: email_send(kind=kind, user_id=user_id, details=details))


def _uid(user) -> str:
    return urlsafe_base64_encode(force_bytes(user.pk))


def _duration(seconds: int) -> str:
    """How long a link lasts, in the largest whole unit: 259200 -> '3 days'."""
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            count = seconds // size
            return f"{count} {unit}{'' if count == 1 else 's'}"
    return f"{seconds} seconds"


def _verify_message(user):
    if user.email_verified:
        return None
    token = email_verification_tokens.make_token(user)
    return user.email, "verify", reverse("accounts:verify", args=[_uid(user), token])


def _email_change_message(user):
    if not user.pending_email:
        return None
    token = email_change_tokens.make_token(user)
    return user.pending_email, "email_change", reverse("accounts:email_confirm", args=[_uid(user), token])


def _password_reset_message(user):
    if not user.has_usable_password():
        return None
    token = password_reset_tokens.make_token(user)
    return user.email, "password_reset", reverse("accounts:password_reset_confirm", args=[_uid(user), token])


def _access_reset_message(user):
    return user.email, "access_reset", reverse("accounts:settings")


def _password_changed_message(user):
    return user.email, "password_changed", reverse("accounts:password_reset")


def _account_exists_message(user):
    path = reverse("accounts:password_reset") + "?" + urlencode({"email": user.email})
    return user.email, "account_exists", path


_MESSAGES = {
    EmailKind.ACCOUNT_EXISTS: _account_exists_message,
    EmailKind.PASSWORD_CHANGED: _password_changed_message,
    EmailKind.VERIFY: _verify_message,
    EmailKind.EMAIL_CHANGE: _email_change_message,
    EmailKind.PASSWORD_RESET: _password_reset_message,
    EmailKind.ACCESS_RESET: _access_reset_message,
}


def email_send(*, kind: str, user_id: int, details: dict | None = None) -> bool:
    """Build the link for `kind` now and send the email over the configured backend.

    Returns False when there is nothing to send any more (the account is gone or inactive, the
    address was confirmed meanwhile, the pending change was cancelled). Raises ValueError for an
    unknown kind, and whatever the mail backend raises (smtplib.SMTPException, OSError) so the task
    can retry.
    """
    if kind not in _MESSAGES:
        raise ValueError(f"Unknown account email kind: {kind!r}")
    user = User.objects.filter(pk=user_id, is_active=True).first()
    if user is None:
        return False
    built = _MESSAGES[kind](user)
    if built is None:
        return False
    to, template, path = built
    context = {
        "user": user,
        "email": to,
        "link": settings.SITE_URL + path,
        "site_name": settings.SITE_NAME,
        "site_url": settings.SITE_URL,
        "valid_for": _duration(settings.PASSWORD_RESET_TIMEOUT),
        **(details or {}),
    }
    subject = " ".join(render_to_string(f"emails/{template}_subject.txt", context).split())
    body = render_to_string(f"emails/{template}.txt", context)
    send_mail(subject, body, None, [to])
    return True


# --- SSH keys ----------------------------------------------------------------------------------


def sshkey_parse(text: str) -> tuple[str, str, str]:
    """Check one OpenSSH public key line.

    Returns (key_type, canonical line with its comment, fingerprint as `ssh-keygen -lf` prints it).
    Raises ValidationError naming the problem: a private key, not a key, DSA, an RSA key shorter
    than 2048 bits, or an unsupported type.
    """
    text = (text or "").strip()
    if not text:
        raise ValidationError("Paste your public key, e.g. the contents of ~/.ssh/id_ed25519.pub.")
    if "PRIVATE KEY" in text:
        raise ValidationError(
            "This is a private key. Never share it: paste the public key instead (the .pub file)."
        )
    lines = text.splitlines()
    if len(lines) > 1:
        raise ValidationError("Paste one key, on a single line.")
    parts = text.split(None, 2)
    if parts[0].startswith("sk-"):
        raise ValidationError(
            "Security-key (FIDO) SSH keys are not supported yet. Use an Ed25519 key (ssh-keygen -t ed25519)."
        )
    if parts[0] == "ssh-dss":
        # Checked by name: OpenSSH disabled DSA, and cryptography is dropping support for parsing it.
        raise ValidationError("DSA keys are no longer accepted. Use an Ed25519 key (ssh-keygen -t ed25519).")
    try:
        key = serialization.load_ssh_public_key(" ".join(parts[:2]).encode())
    except Exception:
        # cryptography raises ValueError, UnsupportedAlgorithm or others depending on how it is broken.
        raise ValidationError(
            "This is not a valid SSH public key. It should look like “ssh-ed25519 AAAAC3Nza… you@laptop”."
        ) from None
    if isinstance(key, rsa.RSAPublicKey) and key.key_size < RSA_MIN_BITS:
        raise ValidationError(
            f"This RSA key has only {key.key_size} bits; at least {RSA_MIN_BITS} are required. "
            "Use an Ed25519 key (ssh-keygen -t ed25519)."
        )
    if not isinstance(key, (rsa.RSAPublicKey, ec.EllipticCurvePublicKey, ed25519.Ed25519PublicKey)):
        raise ValidationError(
            "This key type is not supported. Use Ed25519, ECDSA or RSA (2048 bits or more)."
        )
    key_type, blob_b64 = (
        key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode().split()
    )
    digest = hashlib.sha256(base64.b64decode(blob_b64)).digest()
    fingerprint = "SHA256:" + base64.b64encode(digest).decode().rstrip("=")
    comment = parts[2].strip() if len(parts) > 2 else ""
    line = f"{key_type} {blob_b64}" + (f" {comment}" if comment else "")
    return key_type, line, fingerprint


def sshkey_add(*, user: User, name: str, public_key: str, added_from: str = "", expires_at=None) -> SshKey:
    """Add a public key to the user's account, recording `added_from` (origin_of_session or
    origin_of_token: a password change revokes keys added elsewhere). With `expires_at`, the key is
    trusted until then and removed soon after (sshkeys_prune_expired). Returns the SshKey.

    Raises ValidationError keyed by field: "public_key" (see sshkey_parse, or a duplicate),
    "name" (empty).
    """
    name = (name or "").strip()
    errors = {}
    if not name:
        errors["name"] = "Give the key a name, e.g. “laptop”."
    try:
        key_type, line, fingerprint = sshkey_parse(public_key)
    except ValidationError as error:
        errors["public_key"] = error.messages
    if errors:
        raise ValidationError(errors)
    existing = user.ssh_keys.filter(fingerprint=fingerprint).first()
    if existing is not None:
        raise ValidationError({"public_key": f"You already added this key, as “{existing.name}”."})
    try:
        with transaction.atomic():
            key = SshKey.objects.create(
                user=user,
                name=name,
                key_type=key_type,
                public_key=line,
                fingerprint=fingerprint,
                added_from=added_from,
                expires_at=expires_at,
            )
            keys_changed(user_id=user.pk)
            return key
    except IntegrityError:
        raise ValidationError({"public_key": "You already added this key."}) from None


def sshkey_delete(*, key: SshKey) -> None:
    """Remove a key. The caller has checked that it belongs to the acting user.

    The SSH gateway refuses the key from the next connection on; the person's running instances stop
    trusting it as soon as a worker has pushed the new set (portal.sshgateway.services.keys_changed).
    """
    with transaction.atomic():
        user_id = key.user_id
        key.delete()
        keys_changed(user_id=user_id)


def sshkeys_prune_expired(now=None) -> int:
    """Remove every key past its expiry, as its owner removing it would (the instances' authorized_keys
    follow). The gateway and the instances stop trusting such a key at its expiry already; this clears
    it from the account. Returns how many were removed."""
    expired = SshKey.objects.filter(expires_at__lte=now or timezone.now())
    removed = 0
    for key in expired:
        sshkey_delete(key=key)
        removed += 1
    return removed


# --- Deletion ----------------------------------------------------------------------------------


def account_delete(*, user: User) -> User:
    """Delete the account as far as the append-only ledger allows: scrub and deactivate it.

        The row stays (ledger entries point at it) but holds no personal data: the email becomes
        deleted-<id>@deleted.invalid, names are cleared, the password is unusable, SSH keys and GitHub
        links are removed and every session of the user ends. The address is free for a new sign-up;
        the early-registrant grant remembers who had it, so a new account gets none. Log-in records
    kept by django-axes under the address are deleted too.

    Every live instance of the account stops at once, in the same transaction (instances_stop_all:
    running ones are charged up to this moment, and billing ends there), with stop_reason
    account_deleted, which tells each teardown to remove the owner's workspace on that host too; then
    workspaces_remove_all removes their workspace volumes on every host, retried on beat where a host
    does not answer (audited as "account.workspaces_removed" once none is left). The deletion is audited
    as "account.delete", under the scrubbed name, with the instances it stopped.
    Returns the user.
    """
    with transaction.atomic():
        user = User.objects.select_for_update().get(pk=user.pk)
        # Under the user's row lock and then the credit account's (suspension's order); instance_launch
        # re-reads is_active under the credit account's lock, so no launch outlives the deletion.
        stopped = instances_stop_all(
            user_ids=[user.pk],
            reason=StopReason.ACCOUNT_DELETED,
            message="Stopped because the account was deleted; its workspace is removed.",
        )
        workspaces_remove_all(user_id=user.pk)
        # django-axes keeps log-in records under the address; they are personal data too.
        for model in (AccessAttempt, AccessFailureLog, AccessLog):
            model.objects.filter(username=user.email).delete()
        user.email = f"deleted-{user.pk}@deleted.invalid"
        user.pending_email = ""
        user.first_name = user.last_name = ""
        user.email_verified_at = None
        user.set_unusable_password()
        user.is_active = False
        user.deleted_at = timezone.now()
        user.save()
        user.ssh_keys.all().delete()
        user.social_auth.all().delete()
        _sessions_end(user_pk=user.pk)
        audit_record(
            actor=user,
            action="account.delete",
            target=user,
            reason="Deleted by its owner.",
            details={"instances_stopped": [str(instance_id) for instance_id in stopped.ids]},
        )
    return user


def _sessions_end(*, user_pk, keep_session_key: str | None = None) -> int:
    """Delete every stored session logged in as `user_pk`, except `keep_session_key`. Returns how many
    ended.

    Django keeps no index from users to sessions, so this reads them all; deletions are rare.
    """
    ended = 0
    sessions = Session.objects.filter(expire_date__gt=timezone.now())
    if keep_session_key:
        sessions = sessions.exclude(session_key=keep_session_key)
    for session in sessions.iterator():
        if session.get_decoded().get("_auth_user_id") == str(user_pk):
            session.delete()
            ended += 1
    return ended


# --- Suspension and launch sizes (operators) ---------------------------------------------------------

def _check_operator(actor, *, doing: str) -> None:
    if actor is None or not actor.is_staff:
        raise PermissionDenied(f"Only operators {doing}.")


def user_suspend(*, user: User, actor, reason: str) -> User:
    """Suspend `user` for `reason`, which they are shown. Returns the user, refreshed.

    A suspended person can still log in and read their data, but cannot launch or apply for bonus hours.
    Their queued, provisioning and running instances are stopped (billing ends now; queued ones stop at
    once; workspaces are kept), their credits stay, the action is audited ("user.suspend") and they are
    emailed, all in one transaction. Suspending an account that is already suspended changes nothing:
    no second audit entry, no second email.

    Raises PermissionDenied unless `actor` is staff (and not `user`), ValidationError for a blank reason.
    """
    _check_operator(actor, doing="suspend accounts")
    if actor.pk == user.pk:
        raise PermissionDenied("You cannot suspend your own account.")
    reason = (reason or "").strip()
    if not reason:
        raise ValidationError("Give the reason for the suspension; the user reads it.")
    CreditAccount.objects.get_or_create(user_id=user.pk)
    now = timezone.now()
    with transaction.atomic():
        marked = User.objects.filter(pk=user.pk, suspended_at__isnull=True).update(
            suspended_at=now, suspended_reason=reason, suspended_by_name=actor_name_of(actor)[:300]
        )
        if not marked:
            return User.objects.get(pk=user.pk)
        # instances_stop_all takes the user's credit account lock (with the pools of their live project
        # instances, in id order) before it scans; instance_launch re-reads the suspension under that
        # lock, so no launch can slip in after the scan and outlive the suspension.
        stopped = instances_stop_all(
            user_ids=[user.pk],
            reason=StopReason.SUSPENDED,
            message="Stopped because an operator suspended the account.",
        )
        audit_record(
            actor=actor,
            action="user.suspend",
            target=user,
            reason=reason,
            details={"user": user.email, "instances_stopped": [str(i) for i in stopped.ids]},
        )
        notify_account_suspended(user=user, reason=reason, suspended_at=now)
    user.refresh_from_db()
    return user


def user_unsuspend(*, user: User, actor, reason: str) -> User:
    """Lift the suspension of `user`: they may launch and apply again. Returns the user, refreshed.

    Instances stopped by the suspension stay stopped (the workspace is kept, so a new launch gets the
    files back). Audited as "user.unsuspend" with the suspension it lifts. Unsuspending an account that
    is not suspended changes nothing and records nothing.

    Raises PermissionDenied unless `actor` is staff, ValidationError for a blank reason.
    """
    _check_operator(actor, doing="lift suspensions")
    reason = (reason or "").strip()
    if not reason:
        raise ValidationError("Give the reason for lifting the suspension; the audit log keeps it.")
    with transaction.atomic():
        current = User.objects.select_for_update().get(pk=user.pk)
        if not current.is_suspended:
            return current
        lifted = {
            "user": current.email,
            "suspended_at": current.suspended_at,
            "suspended_reason": current.suspended_reason,
            "suspended_by": current.suspended_by_name,
        }
        User.objects.filter(pk=user.pk).update(suspended_at=None, suspended_reason="", suspended_by_name="")
        audit_record(actor=actor, action="user.unsuspend", target=current, reason=reason, details=lifted)
    user.refresh_from_db()
    return user


def user_launch_sizes_set(*, user: User, actor, sizes, reason: str) -> User:
    """Open `sizes` (e.g. ["8x"]) to `user` beyond what their tier allows, replacing the sizes opened
    before (an empty list closes them again). Returns the user, refreshed.

    Audited as "setting.change" with the old and new sizes; nothing is recorded when nothing changes.
    Raises PermissionDenied unless `actor` is staff, ValidationError for an unknown size or a blank reason.
    """
    _check_operator(actor, doing="change what a person may launch")
    unknown = [key for key in sizes if key not in SIZES]
    if unknown:
        raise ValidationError(f"Unknown size {unknown[0]!r}. Choose from: {', '.join(SIZES)}.")
    reason = (reason or "").strip()
    if not reason:
        raise ValidationError("Say why you are changing this person's sizes; the audit log keeps it.")
    new = [key for key in SIZES if key in sizes]
    with transaction.atomic():
        current = User.objects.select_for_update().get(pk=user.pk)
        old = list(current.extra_sizes or [])
        if old == new:
            return current
        User.objects.filter(pk=user.pk).update(extra_sizes=new)
        audit_record(
            actor=actor,
            action="setting.change",
            target=current,
            reason=reason,
            details={
                "setting": "extra launch sizes",
                "user": current.email,
                "changes": {"extra_sizes": {"old": old, "new": new}},
            },
        )
    user.refresh_from_db()
    return user


# The largest share an operator may give: the column holds up to 9999.99.
QUEUE_SHARE_MAX = Decimal("9999.99")


def user_queue_share_set(*, user: User, actor, share, reason: str) -> User:
    """Set `user`'s share in the queue's fair share (User.queue_share; their recent GPU use is divided by
    it, portal/instances/queue.py). Returns the user, refreshed.

    Audited as "setting.change" with the old and new share; nothing is recorded when nothing changes.
    Raises PermissionDenied unless `actor` is staff, ValidationError for a share that is not a number from
    0.01 to 9999.99 (two decimals at most) or a blank reason.
    """
    _check_operator(actor, doing="change a person's share of the queue")
    try:
        new = Decimal(str(share).strip())
    except (InvalidOperation, ValueError):
        raise ValidationError(f"A share is a number such as 1, 2 or 0.5, not {share!r}.") from None
    if (
        not new.is_finite()
        or not Decimal("0.01") <= new <= QUEUE_SHARE_MAX
        or new != new.quantize(Decimal("0.01"))
    ):
        raise ValidationError(
            f"A share is from 0.01 to {QUEUE_SHARE_MAX} with at most two decimals (1 is everyone's default); "
            f"{share!r} is not."
        )
    reason = (reason or "").strip()
    if not reason:
        raise ValidationError("Say why you are changing this person's share; the audit log keeps it.")
    with transaction.atomic():
        current = User.objects.select_for_update().get(pk=user.pk)
        old = current.queue_share
        if old == new:
            return current
        User.objects.filter(pk=user.pk).update(queue_share=new)
        audit_record(
            actor=actor,
            action="setting.change",
            target=current,
            reason=reason,
            details={
                "setting": "queue share",
                "user": current.email,
                "changes": {"queue_share": {"old": share_text(old), "new": share_text(new)}},
            },
        )
    user.refresh_from_db()
    return user
