"""API test helpers: a token for a persona, and a client that sends it the way a script does; a local
OpenID Connect issuer for keyless CI sign-in."""


import pytest
from django.core.cache import caches
from django.test import Client

from portal.api import services
from provisioning.drivers import fake
from tests.support.oidc_issuer import oidc_issuer_fixture  # noqa: F401  (registers oidc_issuer)


@pytest.fixture(autouse=True)
def _fresh_rate_limits(db):
    caches["ratelimit"].clear()


@pytest.fixture(autouse=True)
def launches_on_the_fake_cloud(cloud, settings):
    """Launches use the fake driver (no Docker) and need 15 minutes of credit, as in
    tests/instances/test_launch.py."""
    settings.LAUNCH_MIN_CREDIT_MINUTES = 15


class TokenClient:
    """A script holding a personal access token: every request carries `Authorization: Bearer <token>`."""

    def __init__(self, token_text: str):
        self.token_text = token_text
        self.http = Client()

    def _headers(self, extra):
        return {"Authorization": f"Bearer {self.token_text}", **(extra or {})}

    def get(self, path, data=None, headers=None):
        return self.http.get(path, data, headers=self._headers(headers))

    def post(self, path, data=None, headers=None):
        return self.http.post(
            path, data or {}, content_type="application/json", headers=self._headers(headers)
        )

    def delete(self, path, headers=None):
        return self.http.delete(path, headers=self._headers(headers))


def token_for(user, *, scope="launch", days=30, name="script") -> tuple:
    """(ApiToken, TokenClient) for `user`."""
    token, text = services.token_create(user=user, name=name, scope=scope, days=days)
    return token, TokenClient(text)


@pytest.fixture
def alice_api(alice):
    return token_for(alice)[1]


@pytest.fixture
def bob_api(bob):
    return token_for(bob)[1]


@pytest.fixture
def cpu(db):
    return fake.make_image("cpu", sizes=["1x", "8x"])


def assert_problem(response, status, *, kind=None):
    """The response is an RFC 9457 problem with `status` (and the type urn:devcloud:problem:`kind`).
    Returns its body."""
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert body["status"] == status
    assert body["title"] and body["detail"] and body["type"].startswith("urn:devcloud:problem:")
    if kind:
        assert body["type"] == f"urn:devcloud:problem:{kind}", body
    return body
