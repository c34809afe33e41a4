"""One spelling of a login name, shared by every way of logging in and by the lockout that counts failures.

The user lookup ignores case (UserManager.get_by_natural_key), so the lockout must too: otherwise each
capitalisation of an address would get its own AXES_FAILURE_LIMIT guesses.
"""

from django.conf import settings


def normalise_login_name(value) -> str:
    """The address as the lockout counts it and the database stores it: trimmed and lower-case.

    Returns "" for None (a request without the field).
    """
    return (value or "").strip().lower()


def axes_username(request, credentials) -> str:
    """AXES_USERNAME_CALLABLE: the normalised login name of an attempt from any path.

    The portal and admin forms pass `username`; a later API or token login that authenticates with
    `email=` is covered too. Without credentials (axes asking about the request alone), the posted
    form field is read.
    """
    credentials = credentials or {}
    raw = credentials.get(settings.AXES_USERNAME_FORM_FIELD) or credentials.get("email")
    if raw is None and request is not None:
        raw = request.POST.get(settings.AXES_USERNAME_FORM_FIELD)
    return normalise_login_name(raw)
