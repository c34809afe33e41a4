"""Signed, expiring, single-use tokens for the links we email.

Verification tokens are stateless like Django's password-reset tokens: the hash covers the account
state that the link is meant to change, so following the link (or changing the email or the password
in the meantime) makes every earlier link stop matching. They expire after PASSWORD_RESET_TIMEOUT.
"""

import enum

from django.conf import settings
from django.contrib.auth.tokens import PasswordResetTokenGenerator
from django.utils.crypto import constant_time_compare
from django.utils.http import base36_to_int


class TokenState(enum.Enum):
    VALID = "valid"
    EXPIRED = "expired"
    # Garbled, forged, or made for an account state that has since changed (used, email or password changed).
    INVALID = "invalid"


def _seconds(value) -> str:
    # Truncated like Django's own generator does, so a database without microseconds gives the same hash.
    return "" if value is None else value.replace(microsecond=0, tzinfo=None).isoformat()


class EmailTokenGenerator(PasswordResetTokenGenerator):
    """Base for email-confirmation links. Subclasses differ only by key_salt, i.e. by purpose."""

    def _make_hash_value(self, user, timestamp):
        return (
            f"{user.pk}|{user.password}|{user.email}|{user.pending_email}|"
            f"{_seconds(user.email_verified_at)}|{timestamp}"
        )

    def token_state(self, user, token) -> TokenState:
        """Like check_token(), but tells an expired link apart from a wrong one.

        Returns TokenState.VALID, EXPIRED (the hash matches but the link is too old) or INVALID.
        """
        return token_state(self, user, token)


class EmailVerificationTokenGenerator(EmailTokenGenerator):
    """Links that confirm the address the account already has (sent after sign-up)."""

    key_salt = "portal.accounts.tokens.EmailVerificationTokenGenerator"


class EmailChangeTokenGenerator(EmailTokenGenerator):
    """Links that confirm a new address (sent to `pending_email`). A separate salt means a link sent to
    the current address can never confirm the pending one, and the other way round."""

    key_salt = "portal.accounts.tokens.EmailChangeTokenGenerator"


def token_state(generator: PasswordResetTokenGenerator, user, token) -> TokenState:
    """The state of `token` for `user` under `generator` (also works for Django's reset generator)."""
    if not (user and token):
        return TokenState.INVALID
    try:
        ts_b36, _ = token.split("-")
        timestamp = base36_to_int(ts_b36)
    except ValueError:
        return TokenState.INVALID
    for secret in [generator.secret, *generator.secret_fallbacks]:
        if constant_time_compare(generator._make_token_with_timestamp(user, timestamp, secret), token):
            break
    else:
        return TokenState.INVALID
    if generator._num_seconds(generator._now()) - timestamp > settings.PASSWORD_RESET_TIMEOUT:
        return TokenState.EXPIRED
    return TokenState.VALID


class PasswordResetTokens(PasswordResetTokenGenerator):
    """Django's reset links, except that logging in does not kill them.

    Django's hash covers last_login. Someone who squatted an address knows the password, so by
    logging in every few seconds they could kill every reset link its owner asks for. The password
    hash is still covered, so a link works once, and the email too, so it dies with an address change.
    """

    key_salt = "portal.accounts.tokens.PasswordResetTokens"

    def _make_hash_value(self, user, timestamp):
        return f"{user.pk}|{user.password}|{user.email}|{timestamp}"


email_verification_tokens = EmailVerificationTokenGenerator()
email_change_tokens = EmailChangeTokenGenerator()
password_reset_tokens = PasswordResetTokens()
