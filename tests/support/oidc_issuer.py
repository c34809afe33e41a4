"""A local OpenID Connect issuer, on 127.0.0.1 with a random port, that mints tokens as GitHub Actions does.

It serves what a verifier reads of an issuer:
- GET /.well-known/openid-configuration -> {"issuer": <url>, "jwks_uri": <url>/.well-known/jwks, ...}
- GET /.well-known/jwks                 -> the public halves of its published keys (one RSA, one EC P-256).

`issuer.token(**claims)` mints a token signed (with PyJWT) by its current RSA key, with GitHub-Actions-like
claims for `DEFAULT_REPOSITORY`; keyword arguments replace claims (None removes one). `rotate()` replaces
the RSA key by a new one with a new kid, `outsider_token()` signs with a key it never publishes.
`failing` maps a path to the HTTP status it answers instead (an issuer having a bad moment).
`requests_seen` lists the paths asked for, in arrival order. The `oidc_issuer` fixture starts one per test.
"""

import secrets
import time
import uuid
from dataclasses import dataclass
from urllib.parse import parse_qs

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from portal.lib import oidc
from tests.support.standin_server import JsonHandler, StandinServer

DEFAULT_REPOSITORY = "octo-org/gpu-project"
DEFAULT_AUDIENCE = "https://devcloud.example.com"
DEFAULT_WORKFLOW = f"{DEFAULT_REPOSITORY}/.github/workflows/gpu.yml"
DISCOVERY_PATH = "/.well-known/openid-configuration"
JWKS_PATH = "/.well-known/jwks"


@dataclass
class SigningKey:
    kid: str
    algorithm: str
    private_key: object

    @classmethod
    def rsa(cls) -> "SigningKey":
        return cls(f"rsa-{uuid.uuid4().hex[:12]}", "RS256", rsa.generate_private_key(65537, 2048))

    @classmethod
    def ec(cls) -> "SigningKey":
        return cls(f"ec-{uuid.uuid4().hex[:12]}", "ES256", ec.generate_private_key(ec.SECP256R1()))

    def public_jwk(self) -> dict:
        algorithm = jwt.get_algorithm_by_name(self.algorithm)
        jwk = algorithm.to_jwk(self.private_key.public_key(), as_dict=True)
        return {**jwk, "kid": self.kid, "alg": self.algorithm, "use": "sig"}


class OidcIssuer(StandinServer):
    """The server. `url` is its issuer URL (the `iss` of its tokens)."""

    def __init__(self):
        self.rsa_key = SigningKey.rsa()
        self.ec_key = SigningKey.ec()
        self.requests_seen: list[str] = []
        self.failing: dict[str, int] = {}
        # The runner's side: the bearer a job's request must carry, and the claims of the run it names.
        self.actions_request_token = secrets.token_urlsafe(16)
        self.actions_claims: dict = {}
        super().__init__(_handler_for(self), name="oidc-issuer")

    def actions_environment(self, **claims) -> dict:
        """The environment a GitHub Actions job with `permissions: id-token: write` gets, for a run whose
        token carries `claims` (overrides of claims())."""
        self.actions_claims = claims
        return {
            "ACTIONS_ID_TOKEN_REQUEST_URL": f"{self.url}{ACTIONS_TOKEN_PATH}?api-version=2.0",
            "ACTIONS_ID_TOKEN_REQUEST_TOKEN": self.actions_request_token,
        }

    def published_keys(self) -> list[SigningKey]:
        with self._lock:
            return [self.rsa_key, self.ec_key]

    def rotate(self) -> SigningKey:
        """Replace the RSA key by a new one (new kid); the old one is no longer published. Returns the
        old key, so a test can still sign with it."""
        new_key = SigningKey.rsa()
        with self._lock:
            old_key, self.rsa_key = self.rsa_key, new_key
        return old_key

    def count(self, path: str) -> int:
        """How many times `path` was asked for."""
        with self._lock:
            return self.requests_seen.count(path)

    # --- Minting ------------------------------------------------------------------------------------------

    def claims(self, **overrides) -> dict:
        """GitHub Actions' claims for a push to main of DEFAULT_REPOSITORY, issued now, valid 5 minutes;
        `overrides` replace claims, and an override of None removes that claim."""
        now = int(time.time())
        owner = DEFAULT_REPOSITORY.split("/")[0]
        claims = {
            "iss": self.url,
            "aud": DEFAULT_AUDIENCE,
            "sub": f"repo:{DEFAULT_REPOSITORY}:ref:refs/heads/main",
            "repository": DEFAULT_REPOSITORY,
            "repository_owner": owner,
            "repository_id": "123456789",
            "repository_owner_id": "987654",
            "ref": "refs/heads/main",
            "ref_type": "branch",
            "sha": secrets.token_hex(20),
            "workflow": "GPU tests",
            "workflow_ref": f"{DEFAULT_WORKFLOW}@refs/heads/main",
            "job_workflow_ref": f"{DEFAULT_WORKFLOW}@refs/heads/main",
            "event_name": "push",
            "actor": "octocat",
            "run_id": "7000000001",
            "run_number": "42",
            "run_attempt": "1",
            "runner_environment": "github-hosted",
            "jti": str(uuid.uuid4()),
            "iat": now,
            "nbf": now - 5,
            "exp": now + 300,
        }
        claims.update(overrides)
        return {name: value for name, value in claims.items() if value is not None}

    def token(self, *, signing_key: SigningKey | None = None, kid: str | None = None, **overrides) -> str:
        """A token with `claims(**overrides)`, signed by `signing_key` (the current RSA key by default);
        its header names `kid` (the signing key's own by default)."""
        key = signing_key or self.rsa_key
        return jwt.encode(
            self.claims(**overrides),
            key.private_key,
            algorithm=key.algorithm,
            headers={"kid": kid or key.kid},
        )

    def outsider_token(self, **overrides) -> str:
        """A token with this issuer's claims signed by a key it never published (its own, new kid)."""
        return self.token(signing_key=SigningKey.rsa(), **overrides)


# Where the stand-in answers as GitHub Actions' runner does for a job's OpenID Connect token.
ACTIONS_TOKEN_PATH = "/github-actions/id-token"


def _handler_for(issuer: OidcIssuer):
    class Handler(JsonHandler):
        def do_GET(self):
            with issuer._lock:
                issuer.requests_seen.append(self.path)
                failing = issuer.failing.get(self.path)
            if failing:
                return self._json(failing, {"message": "Stand-in failing as told"})
            if self.path == DISCOVERY_PATH:
                return self._json(
                    200,
                    {
                        "issuer": issuer.url,
                        "jwks_uri": f"{issuer.url}{JWKS_PATH}",
                        "subject_types_supported": ["public", "pairwise"],
                        "response_types_supported": ["id_token"],
                        "claims_supported": sorted(issuer.claims()),
                        "id_token_signing_alg_values_supported": ["RS256", "ES256"],
                        "scopes_supported": ["openid"],
                    },
                )
            if self.path == JWKS_PATH:
                return self._json(200, {"keys": [key.public_jwk() for key in issuer.published_keys()]})
            path, _, query = self.path.partition("?")
            if path == ACTIONS_TOKEN_PATH:
                return self._actions_token(query)
            return self._json(404, {"message": "Not Found"})

        def _actions_token(self, query: str):
            """What GitHub Actions' runner answers at ACTIONS_ID_TOKEN_REQUEST_URL: a token for the
            audience asked, to a request carrying ACTIONS_ID_TOKEN_REQUEST_TOKEN."""
            if self.headers.get("Authorization") != f"Bearer {issuer.actions_request_token}":
                return self._json(401, {"message": "Bad credentials"})
            audience = parse_qs(query).get("audience", [DEFAULT_AUDIENCE])[0]
            return self._json(200, {"value": issuer.token(aud=audience, **issuer.actions_claims)})

    return Handler


@pytest.fixture(name="oidc_issuer")
def oidc_issuer_fixture(settings):
    """A running local OpenID Connect issuer, with this process's cache of issuers' keys empty before and
    after the test."""
    settings.OIDC_ALLOW_INSECURE_LOOPBACK_ISSUERS = True
    oidc.forget_issuers()
    issuer = OidcIssuer().start()
    yield issuer
    issuer.stop()
    oidc.forget_issuers()
