"""Who is calling: a personal access token, or the portal session (with CSRF enforced).

There is no password login in the API: a token is made on the Settings page by someone already
logged in (through the login form, and so through django-axes and the one login-name normaliser in
portal/accounts/login_names.py). Tokens are random, so guessing one is not a login to lock out.
"""

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from . import services

BAD_TOKEN = "This token is invalid, expired or revoked. Create a new one under Settings → API tokens."


class TokenAuthentication(authentication.BaseAuthentication):
    """`Authorization: Bearer dcp_<prefix>_<secret>`. Sets request.auth to the ApiToken.

    A request that carries a bearer token is judged by it alone: a bad token is a 401, never a fall
    back to the session.
    """

    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        keyword, _, text = header.partition(" ")
        if keyword.lower() != self.keyword.lower():
            return None
        token = services.token_authenticate(text.strip())
        if token is None:
            raise exceptions.AuthenticationFailed(BAD_TOKEN)
        return token.user, token

    def authenticate_header(self, request):
        return f'{self.keyword} realm="api"'


class SessionAuthentication(authentication.SessionAuthentication):
    """The portal's own session, for the browser; DRF enforces the CSRF token on unsafe methods."""

    def authenticate(self, request):
        result = super().authenticate(request)
        if result is not None and not result[0].is_active:
            return None
        return result


class TokenScheme(OpenApiAuthenticationExtension):
    target_class = "portal.api.authentication.TokenAuthentication"
    name = "personalAccessToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A personal access token from Settings → API tokens: dcp_<prefix>_<secret>.",
        }


class SessionScheme(OpenApiAuthenticationExtension):
    target_class = "portal.api.authentication.SessionAuthentication"
    name = "portalSession"

    def get_security_definition(self, auto_schema):
        return {"type": "apiKey", "in": "cookie", "name": "sessionid"}
