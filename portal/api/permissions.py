"""What a caller may do: any signed-in caller reads; changing anything needs a "read and launch" token
(or the session, which may do what the pages do)."""

from rest_framework import permissions

from .models import ApiToken

SCOPE_MESSAGE = (
    "This token may only read. Create a token with the “read and launch” scope under Settings → API tokens "
    "to launch, stop, or change keys and applications."
)


class TokenScope(permissions.BasePermission):
    message = SCOPE_MESSAGE
    code = "insufficient_scope"

    def has_permission(self, request, view):
        if not (request.user and request.user.is_authenticated):
            return False
        if request.method in permissions.SAFE_METHODS:
            return True
        token = request.auth
        return not isinstance(token, ApiToken) or token.can_launch
