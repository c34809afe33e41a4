"""Sign-up and login with GitHub (social-auth-app-django).

The backend reads GitHub's addresses from settings on every call (GITHUB_OAUTH_URL, GITHUB_API_URL), so a
GitHub Enterprise install or the tests' local stand-in can take GitHub's place.

The pipeline steps below run in SOCIAL_AUTH_PIPELINE order (see portal/settings/base.py) and enforce the
rules for GitHub identities:
- the account's address is the verified primary email from GitHub's /user/emails, never the public
  profile address, and a GitHub login without one creates nothing;
- a GitHub login is linked to an existing account with the same address only when that address is
  verified on both sides; otherwise the person is told to log in and connect GitHub from Settings;
- a logged-in account connects GitHub only once its own address is confirmed, so no one can add a way
  into an address they do not own (proving the address later removes GitHub links, see
  services.access_reset);
- a new account made from GitHub counts as verified and gets the early-registrant grant once per person.
The failures raised here are turned into a page a person can act on by middleware.SocialAuthErrorMiddleware.
"""

from urllib.parse import urljoin

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import IntegrityError, transaction
from django.utils import timezone
from social_core.backends.github import GithubOAuth2 as _GithubOAuth2
from social_core.exceptions import AuthAssociationError, AuthException, AuthPolicyError, AuthResponseError

from portal.accounts.models import User
from portal.credits.services import credits_grant_signup

# AbstractUser.first_name / last_name are 150 characters long.
NAME_MAX_LENGTH = 150


class GithubNoVerifiedEmail(AuthException):
    """GitHub did not give a verified primary email address, so there is no address to sign up with."""

    default_code = "profile_email_missing"


class GithubAccountUnconfirmed(AuthPolicyError):
    """The logged-in account's own address is not confirmed, so it may not gain GitHub as a way in.

    Whoever signed up with an address they do not own would otherwise keep a GitHub login into the
    account after its real owner takes it over.
    """

    default_code = "authentication_disallowed"

    def __init__(self, backend=None, *details, email: str = ""):
        super().__init__(backend, *details, stage="pipeline")
        self.email = email


class GithubEmailInUse(AuthAssociationError):
    """An account with the GitHub address exists here, and linking to it is not safe.

    `email` is the address, `verified_here` whether our side confirmed it, `active` whether the
    account may log in at all. The error page uses them to say what to do next.
    """

    default_code = "email_in_use"

    def __init__(
        self, backend=None, *details, email: str = "", verified_here: bool = False, active: bool = True
    ):
        super().__init__(backend, *details, stage="pipeline")
        self.email = email
        self.verified_here = verified_here
        self.active = active


class GithubOAuth2(_GithubOAuth2):
    """GitHub's OAuth app flow, with addresses from settings and the email taken only from /user/emails."""

    def authorization_url(self) -> str:
        return f"{_oauth_base()}/login/oauth/authorize"

    def access_token_url(self) -> str:
        return f"{_oauth_base()}/login/oauth/access_token"

    def api_url(self) -> str:
        # urljoin drops the last path segment of a base without a trailing slash (GitHub Enterprise
        # serves the API under /api/v3).
        return settings.GITHUB_API_URL.rstrip("/") + "/"

    def user_data(self, access_token: str, *args, **kwargs) -> dict:
        """Return the /user profile plus `verified_primary_email` ("" when there is none).

        Unlike social_core's version, a failing /user/emails is an error, not an empty list: silently
        falling back would make "GitHub is down" look like "you have no verified email".
        Raises AuthProviderError when GitHub answers with an error or not at all, AuthResponseError when
        it answers with something that is not GitHub's JSON.
        """
        profile = self._user_data(access_token)
        emails = self._user_data(access_token, "/emails")
        if not isinstance(profile, dict) or not isinstance(emails, list):
            raise AuthResponseError(self, code="malformed_response", stage="user_info")
        profile["verified_primary_email"] = verified_primary_email(emails)
        return profile

    def _user_data(self, access_token, path=None):
        url = urljoin(self.api_url(), f"user{path or ''}")
        return self.get_json(
            url,
            headers={"Authorization": f"token {access_token}", "Accept": "application/vnd.github+json"},
        )

    def get_user_details(self, response) -> dict:
        """The details the pipeline works with. `email` is the verified primary address or ""."""
        first_name, last_name = split_name(response.get("name"))
        return {
            "username": response.get("login") or "",
            "email": response.get("verified_primary_email") or "",
            "fullname": (response.get("name") or "").strip(),
            "first_name": first_name,
            "last_name": last_name,
        }

    def extra_data(self, user, uid, response, details, pipeline_kwargs) -> dict:
        """What is kept on the social-auth row: GitHub id and login, not the access token.

        The portal never calls GitHub after login, so keeping a live credential would only be a liability.
        """
        data = super().extra_data(user, uid, response, details, pipeline_kwargs)
        for key in ("access_token", "token_type", "refresh_token", "expires_in"):
            data.pop(key, None)
        return data

    def run_pipeline(self, pipeline, pipeline_index=0, *args, **kwargs):
        # All or nothing: if a step after create_user fails (a race on the association, the grant), the
        # new account must not stay behind without its GitHub link.
        with transaction.atomic():
            return super().run_pipeline(pipeline, pipeline_index, *args, **kwargs)


def _oauth_base() -> str:
    return settings.GITHUB_OAUTH_URL.rstrip("/")


def verified_primary_email(emails: list) -> str:
    """Return the lower-cased primary address from a /user/emails list if GitHub verified it, else ""."""
    for entry in emails:
        if (
            not isinstance(entry, dict)
            or entry.get("primary") is not True
            or entry.get("verified") is not True
        ):
            continue
        email = entry.get("email")
        if not isinstance(email, str):
            return ""
        email = email.strip().lower()
        try:
            validate_email(email)
        except ValidationError:
            return ""
        return email
    return ""


def split_name(name) -> tuple[str, str]:
    """Split a GitHub display name into (first, last) at the first space; ("", "") when there is none."""
    if not isinstance(name, str):
        return "", ""
    first, _, last = name.strip().partition(" ")
    return first[:NAME_MAX_LENGTH], last.strip()[:NAME_MAX_LENGTH]


# --- Pipeline steps ---------------------------------------------------------------------------------------


def require_verified_email(backend, details, *args, social=None, user=None, **kwargs):
    """Stop a new GitHub link unless the address is verified on both sides: GitHub gave a verified
    primary address, and the logged-in account connecting GitHub (if any) has confirmed its own.

    A GitHub login that is already linked (social is set) goes through: its identity was checked when
    it was linked. Raises GithubNoVerifiedEmail, or GithubAccountUnconfirmed.
    """
    if social is not None:
        return None
    if user is not None and not user.email_verified:
        raise GithubAccountUnconfirmed(backend, email=user.email)
    if not details.get("email"):
        raise GithubNoVerifiedEmail(backend, stage="pipeline")
    return None


def associate_verified_email(backend, details, *args, user=None, **kwargs):
    """Link to an existing account with the same address, only if both sides verified it.

    GitHub's side is verified by require_verified_email. Returns {"user": ...} when linking, None when
    there is no such account (or someone is logged in: they link to themselves). Raises GithubEmailInUse
    when an account has the address but linking would let a GitHub login take over an account whose
    owner never proved the address, or one that is disabled.
    """
    if user is not None:
        return None
    email = details.get("email")
    if not email:
        return None
    existing = User.objects.filter(email__iexact=email).first()
    if existing is None:
        return None
    if existing.is_active and existing.email_verified:
        return {"user": existing, "is_new": False}
    raise GithubEmailInUse(
        backend, email=email, verified_here=existing.email_verified, active=existing.is_active
    )


def create_user(strategy, details, backend, *args, user=None, **kwargs):
    """Create the account for a new GitHub login: verified address, no usable password, GitHub's name.

    Returns {"is_new": True, "user": ...}, or {"is_new": False} when a user is already set. Raises
    GithubEmailInUse if another request created an account with the same address in the meantime.
    """
    if user is not None:
        return {"is_new": False}
    try:
        with transaction.atomic():
            new_user = User.objects.create_user(
                details["email"],
                password=None,  # unusable: this person logs in with GitHub, or sets one by password reset
                email_verified_at=timezone.now(),
                first_name=details.get("first_name") or "",
                last_name=details.get("last_name") or "",
            )
    except IntegrityError:
        raise GithubEmailInUse(backend, email=details["email"], verified_here=True) from None
    return {"is_new": True, "user": new_user}


def after_login(backend, *args, user=None, **kwargs):
    """Give the early-registrant grant; credits_grant_signup makes sure each person gets it only once."""
    if user is not None:
        credits_grant_signup(user=user)
    return None
