"""Every API error in one shape: RFC 9457 problem details (application/problem+json).

{"type": "urn:devcloud:problem:validation", "title": "Your request has errors", "status": 400,
 "detail": "...", "errors": {"field": ["..."]}}

`detail` carries the same sentence the pages show, taken from the service's ValidationError. The
services mark some refusals with a code, which picks the status: not enough credit is 402, a suspended
account 403, the live-instance limit 409, a rate limit 429, a task queue that cannot be reached 503.
"""

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import set_rollback

from .services import IdempotencyConflict

CONTENT_TYPE = "application/problem+json"
TYPE_PREFIX = "urn:devcloud:problem:"
NON_FIELD = "non_field_errors"

# Service ValidationError code -> (status, type, title)
SERVICE_CODES = {
    "credit": (402, "insufficient-credit", "Not enough credit"),
    "suspended": (403, "account-suspended", "Your account is suspended"),
    "limit": (409, "instance-limit", "Too many live instances"),
    "rate_person": (429, "rate-limited", "Too many requests"),
    "rate_program": (429, "rate-limited", "Too many requests"),
    "unavailable": (503, "unavailable", "Launching is unavailable"),
    "ended": (409, "instance-ended", "This instance has ended"),
    "ceiling": (409, "extension-limit", "The session cannot be extended that far"),
    "no_limit": (409, "no-session-limit", "This session has no time limit"),
    "open_application": (409, "conflict", "Already applied"),
    "in_programme": (409, "conflict", "Already in the programme"),
    "ports_unavailable": (409, "ports-unavailable", "This instance's ports cannot be exposed"),
    # Bookings (portal/instances/reservations.py) and launches on them.
    "capacity": (409, "no-capacity", "No host is free for that window"),
    "weekly": (409, "weekly-limit", "Over the weekly booking hours"),
    "booking": (409, "booking-unusable", "That booking cannot take this launch"),
    "booked": (409, "booked-window", "Its GPUs are booked then"),
    "open": (409, "booking-open", "The booking's window has opened"),
}
# Service ValidationError codes that name the request field at fault (instance_launch's "size", "image").
FIELD_CODES = {"size": "size", "image": "image", "port": "port", "hours": "hours", "email": "email"}
# DRF exception code -> (type, title)
DRF_CODES = {
    "not_authenticated": ("unauthenticated", "Authentication required"),
    "authentication_failed": ("unauthenticated", "Authentication failed"),
    "permission_denied": ("forbidden", "Not allowed"),
    "insufficient_scope": ("insufficient-scope", "This token may only read"),
    "not_found": ("not-found", "Not found"),
    "method_not_allowed": ("method-not-allowed", "Method not allowed"),
    "not_acceptable": ("not-acceptable", "Not acceptable"),
    "unsupported_media_type": ("unsupported-media-type", "Send JSON"),
    "throttled": ("rate-limited", "Too many requests"),
    "parse_error": ("validation", "Your request has errors"),
    "invalid": ("validation", "Your request has errors"),
}


def problem(status_code: int, kind: str, title: str, detail: str, *, errors=None, headers=None) -> Response:
    """A problem-details Response. `errors` (field -> messages) is added for 400s."""
    body = {"type": TYPE_PREFIX + kind, "title": title, "status": status_code, "detail": detail}
    if errors is not None:
        body["errors"] = errors
    return Response(body, status=status_code, content_type=CONTENT_TYPE, headers=headers)


def _messages(detail) -> dict[str, list[str]]:
    """DRF's nested error detail flattened to field -> list of sentences."""
    if isinstance(detail, dict):
        flat = {}
        for field, value in detail.items():
            flat[str(field)] = [str(message) for message in _as_list(value)]
        return flat
    return {NON_FIELD: [str(message) for message in _as_list(detail)]}


def _as_list(value) -> list:
    if isinstance(value, dict):
        return [f"{key}: {message}" for key, inner in value.items() for message in _as_list(inner)]
    if isinstance(value, list):
        return [message for item in value for message in _as_list(item)]
    return [value]


def _detail_of(errors: dict[str, list[str]]) -> str:
    return " ".join(message for messages in errors.values() for message in messages)


def from_validation_error(error: DjangoValidationError) -> Response:
    """The problem for a service's (or a page form's) ValidationError: its messages, verbatim, with the
    status its code picks (SERVICE_CODES; 400 otherwise, with the messages per field)."""
    if hasattr(error, "error_dict"):
        errors = {
            NON_FIELD if field == "__all__" else field: messages
            for field, messages in error.message_dict.items()
        }
        codes = {e.code for errors_of in error.error_dict.values() for e in errors_of}
    else:
        codes = {e.code for e in error.error_list}
        field = FIELD_CODES.get(next(iter(codes))) if len(codes) == 1 else None
        errors = {field or NON_FIELD: list(error.messages)}
    for code in codes:
        if code in SERVICE_CODES:
            status_code, kind, title = SERVICE_CODES[code]
            return problem(status_code, kind, title, _detail_of(errors))
    return problem(400, "validation", "Your request has errors", _detail_of(errors), errors=errors)


def exception_handler(exc, context):
    """REST_FRAMEWORK["EXCEPTION_HANDLER"]: every error the views raise, as a problem response.

    Returns None (a 500) only for unexpected exceptions.
    """
    if isinstance(exc, DjangoValidationError):
        set_rollback()
        return from_validation_error(exc)
    if isinstance(exc, IdempotencyConflict):
        return problem(422, "idempotency-key-reused", "Idempotency-Key already used", str(exc))
    if isinstance(exc, Http404):
        exc = exceptions.NotFound(str(exc) or "Not found.")
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied(str(exc) or None)
    if not isinstance(exc, exceptions.APIException):
        return None
    set_rollback()
    headers = {}
    if getattr(exc, "auth_header", None):
        headers["WWW-Authenticate"] = exc.auth_header
    if getattr(exc, "wait", None):
        headers["Retry-After"] = str(int(exc.wait))
    codes = exc.get_codes()
    if isinstance(exc, exceptions.ValidationError) or exc.status_code == status.HTTP_400_BAD_REQUEST:
        errors = _messages(exc.detail)
        return problem(
            400, "validation", "Your request has errors", _detail_of(errors), errors=errors, headers=headers
        )
    code = codes if isinstance(codes, str) else ""
    kind, title = DRF_CODES.get(code, ("error", "Error"))
    detail = str(exc.detail)
    if isinstance(exc, exceptions.PermissionDenied) and detail.startswith("CSRF Failed"):
        kind, title = "csrf", "CSRF check failed"
        detail = f"{detail} Send the csrftoken cookie's value in the X-CSRFToken header."
    if code == "not_authenticated":
        detail = (
            f"{detail} Send a personal access token as `Authorization: Bearer <token>` (make one in "
            "Settings → API tokens, or run `devcloud login`)."
        )
    return problem(exc.status_code, kind, title, detail, headers=headers or None)
