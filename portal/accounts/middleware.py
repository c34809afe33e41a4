"""Turns a failed GitHub login into a page that says what happened and what to do next."""

import logging
from dataclasses import dataclass

import axes.middleware
import requests
from django.shortcuts import render
from django.utils.cache import add_never_cache_headers
from social_core.exceptions import (
    AuthAssociationError,
    AuthCanceled,
    AuthConfigurationError,
    AuthCredentialError,
    AuthInputError,
    AuthPolicyError,
    AuthProviderError,
    AuthResponseError,
    AuthSessionError,
    SocialAuthBaseException,
)

from .github import GithubAccountUnconfirmed, GithubEmailInUse, GithubNoVerifiedEmail

logger = logging.getLogger(__name__)

# The person can fix it by starting again or choosing another way in.
BAD_REQUEST = 400
# GitHub is down, slow, or answered something we cannot use: nothing the person did wrong.
BAD_GATEWAY = 502


@dataclass(frozen=True)
class GithubFailure:
    """What the error page shows. `retry` offers "Try GitHub again"; `email` names the address at stake."""

    status: int
    title: str
    message: str
    retry: bool = True
    connect_from_settings: bool = False
    email: str = ""


def describe_failure(exception: Exception) -> GithubFailure:
    """Return the page content for a social-auth or GitHub transport failure."""
    if isinstance(exception, GithubNoVerifiedEmail):
        return GithubFailure(
            BAD_REQUEST,
            "Your GitHub account has no verified primary email",
            "DevCloud signs you up with the verified primary email address of your GitHub account, and "
            "GitHub did not give us one. Verify your primary address in GitHub's settings "
            "(Settings → Emails), then try again, or sign up with your email address instead.",
        )
    if isinstance(exception, GithubAccountUnconfirmed):
        return GithubFailure(
            BAD_REQUEST,
            "Confirm your email address before connecting GitHub",
            "Confirm your email address before connecting GitHub: open the link we sent to "
            f"{exception.email} (you can ask for a new one from Settings), then connect GitHub. Until an "
            "address is confirmed we add no other way to log in to its account, so that no one can keep a "
            "way into an address they do not own.",
            retry=False,
            email=exception.email,
        )
    if isinstance(exception, GithubEmailInUse):
        if not exception.active:
            message = (
                f"The account for {exception.email} is disabled, so your GitHub login cannot be connected "
                "to it. Contact the DevCloud operators if you think this is a mistake."
            )
        elif not exception.verified_here:
            message = (
                f"An account with {exception.email} already exists, but its email address has not been "
                "confirmed yet, so we will not connect a GitHub login to it automatically. Log in with your "
                "email and password, confirm the address from the link we sent (you can ask for a new one), "
                "then connect GitHub from Settings. If you did not create that account, reset its password "
                "from the login page."
            )
        else:
            message = (
                f"An account with {exception.email} already exists. Log in with your email and password, "
                "then connect GitHub from Settings."
            )
        return GithubFailure(
            BAD_REQUEST,
            "An account with this email already exists",
            message,
            retry=False,
            connect_from_settings=exception.active,
            email=exception.email,
        )
    if isinstance(exception, AuthCanceled):
        return GithubFailure(
            BAD_REQUEST,
            "GitHub sign-in was cancelled",
            "You did not authorise DevCloud on GitHub, so nothing was created. You can try again, or "
            "use your email address instead.",
        )
    if isinstance(exception, (AuthSessionError, AuthInputError)):
        return GithubFailure(
            BAD_REQUEST,
            "This GitHub sign-in could not be matched to your browser",
            "The answer from GitHub did not belong to the sign-in started in this browser: it may have "
            "expired, been used already, or been opened in another browser. Nothing was created. Start again "
            "from this browser.",
        )
    if isinstance(exception, AuthCredentialError):
        return GithubFailure(
            BAD_REQUEST,
            "GitHub did not accept the sign-in",
            "GitHub turned down the one-time code for this sign-in, usually because it expired or was "
            "already used. Nothing was created. Please start again.",
        )
    if isinstance(exception, AuthAssociationError) and exception.code == "identity_in_use":
        return GithubFailure(
            BAD_REQUEST,
            "This GitHub account belongs to another DevCloud account",
            "The GitHub account you chose is already connected to a different DevCloud account. Log out and "
            "log in with GitHub to use that account, or disconnect GitHub there first.",
            retry=False,
        )
    if isinstance(
        exception, (AuthProviderError, AuthResponseError, AuthConfigurationError, requests.RequestException)
    ):
        return GithubFailure(
            BAD_GATEWAY,
            "GitHub is not answering right now",
            "We could not finish signing you in because GitHub did not answer properly. Nothing was created. "
            "Try again in a few minutes, or log in with your email and password.",
        )
    if isinstance(exception, AuthPolicyError):
        return GithubFailure(
            BAD_REQUEST,
            "GitHub sign-in is not allowed for this account",
            "This GitHub account may not sign in to DevCloud. Log in with your email and password instead.",
            retry=False,
        )
    return GithubFailure(
        BAD_REQUEST,
        "GitHub sign-in did not work",
        "Something went wrong while signing you in with GitHub, and nothing was created. Try again, or "
        "log in with your email and password.",
    )


class SocialAuthErrorMiddleware:
    """Renders accounts/github_error.html for a failed GitHub login instead of a server error.

    Handles social_core's errors anywhere, and `requests` errors only on social-auth views (psa marks
    them with `request.social_strategy`), so an unrelated outgoing HTTP failure is not dressed up as a
    GitHub problem.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        on_social_view = hasattr(request, "social_strategy")
        if not isinstance(exception, SocialAuthBaseException) and not (
            on_social_view and isinstance(exception, requests.RequestException)
        ):
            return None
        failure = describe_failure(exception)
        # Configuration and GitHub outages need an operator; a cancelled login does not.
        logger.log(
            logging.ERROR if failure.status >= 500 else logging.INFO,
            "GitHub login failed: %s (code=%s stage=%s)",
            type(exception).__name__,
            getattr(exception, "code", "-"),
            getattr(exception, "stage", "-"),
        )
        response = render(request, "accounts/github_error.html", {"failure": failure}, status=failure.status)
        add_never_cache_headers(response)
        return response


class AxesMiddleware(axes.middleware.AxesMiddleware):
    """django-axes' middleware (a locked-out client gets the lockout page), run synchronously only.

    Under ASGI Django runs a chain of synchronous middleware and view in one worker thread. Axes' own
    class also offers an async path, and one async-capable link in an otherwise synchronous chain makes
    Django hop from that thread to the event loop and back for every request: several milliseconds a
    page on a busy web process, for no gain, since every view here is synchronous.
    """

    async_capable = False
