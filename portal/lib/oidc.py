"""Keyless CI sign-in: verify a CI provider's OpenID Connect token (GitHub Actions' ID token, for one)
against a trust policy, with PyJWT doing every signature and claim check it knows.

`verify(token, policy)` returns the token's claims when it is signed by one of the policy's issuer's
published keys and says what the policy asks; otherwise it raises `OidcRefused` with a message safe to
show the caller (it never contains the token). Only the policy's issuer is ever fetched, and only after
the token's `iss` is found to be exactly that issuer (docs/architecture.md, "Keyless CI sign-in").

Each issuer's discovery document and signing keys are kept per process (`issuer_keys`) for
DISCOVERY_CACHE_SECONDS and KEYS_CACHE_SECONDS. A token naming a key the cached set lacks makes one fetch
of the key set, at most once per KEYS_REFRESH_COOLDOWN_SECONDS per issuer, so a stream of tokens with
made-up key ids cannot make the portal hammer the issuer. After a fetch fails, the issuer is not asked
again for RETRY_AFTER_FAILURE_SECONDS: meanwhile verifications are refused at once with the same message
(or, when only the discovery document's refresh failed, use the keys already held).
"""

import ipaddress
import json
import math
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.error import HTTPError, URLError
from urllib.parse import urlsplit

import jwt
from django.conf import settings
from jwt.exceptions import PyJWKClientConnectionError, PyJWKClientError, PyJWKError, PyJWKSetError

# Asymmetric algorithms only: `none` and the HMAC family (HS*) would let anyone who knows the issuer's
# public key, or nothing at all, sign a token.
ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
# Claims every accepted token carries; the policy's rules add the ones they read.
REQUIRED_CLAIMS = ("iss", "aud", "sub", "exp", "iat", "repository")
FETCH_TIMEOUT_SECONDS = 5
DISCOVERY_CACHE_SECONDS = 3600
KEYS_CACHE_SECONDS = 900
KEYS_REFRESH_COOLDOWN_SECONDS = 60
RETRY_AFTER_FAILURE_SECONDS = 10
# Discovery documents are a few kilobytes; a larger answer is not one.
DISCOVERY_MAX_BYTES = 256 * 1024
# Claim values are the caller's text: messages quote at most this much of one.
QUOTE_MAX_CHARS = 200
# A time claim past this (the year 5138) is not a time.
LATEST_TIMESTAMP = 1e11


class OidcRefused(Exception):
    """A token this portal does not accept; str() is a message for the caller (never the token).

    `reason` is a short stable word for logs and metrics: "malformed", "issuer", "unreachable",
    "signature", "audience", "expired", "not_yet_valid", "claims", "repository", "ref", "workflow",
    "environment"."""

    def __init__(self, message: str, *, reason: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class TrustPolicy:
    """Which CI runs may sign in: tokens from `issuer` (compared exactly, e.g.
    "https://token.actions.githubusercontent.com") for `audience`, from `repository` ("owner/name").

    Optional narrower rules, each compared exactly: `ref` ("refs/heads/main"); `workflow`, either the
    workflow file's path ("owner/name/.github/workflows/gpu.yml", compared with `workflow_ref` up to its
    "@") or a whole `workflow_ref` with its "@ref"; `environment` (a GitHub deployment environment).
    """

    issuer: str
    audience: str
    repository: str
    ref: str | None = None
    workflow: str | None = None
    environment: str | None = None


@dataclass(frozen=True)
class VerifiedClaims:
    """The claims of an accepted token. `claims` holds all of them as the issuer sent them."""

    issuer: str
    subject: str
    repository: str
    expires_at: datetime
    claims: dict[str, Any] = field(repr=False)

    def get(self, name: str, default=None):
        return self.claims.get(name, default)


def verify(
    token: str, policy: TrustPolicy, *, now: datetime | None = None, leeway: int = 60
) -> VerifiedClaims:
    """The claims of `token` when the policy's issuer signed it, for the policy's audience, within its
    validity (give or take `leeway` seconds of clock skew, at `now` or the current time), and it meets the
    policy's claim rules.

    Raises OidcRefused naming the first rule the token breaks, or that the issuer could not be reached."""
    header, unverified = _unverified_parts(token)
    token_issuer = unverified.get("iss")
    if token_issuer != policy.issuer:
        # Before anything is fetched: only the policy's issuer is ever asked for keys.
        raise OidcRefused(
            f"the token's issuer {_quote(token_issuer)} is not trusted by this project "
            f"(it trusts {policy.issuer})",
            reason="issuer",
        )
    algorithm = header.get("alg")
    if algorithm not in ALGORITHMS:
        raise OidcRefused(
            f"the token is signed with algorithm {_quote(algorithm)}; this portal accepts only "
            f"{', '.join(ALGORITHMS)}",
            reason="signature",
        )
    kid = header.get("kid")
    if not isinstance(kid, str) or not kid:
        raise OidcRefused("the token names no signing key (its header has no kid)", reason="signature")

    signing_key = issuer_keys(policy.issuer).signing_key(kid)
    try:
        claims = jwt.decode(
            token,
            signing_key,
            algorithms=list(ALGORITHMS),
            audience=policy.audience,
            issuer=policy.issuer,
            # Time is checked below, against `now`, with messages that say when.
            options={
                "require": list(REQUIRED_CLAIMS),
                "verify_exp": False,
                "verify_nbf": False,
                "verify_iat": False,
            },
        )
    except (jwt.InvalidSignatureError, jwt.InvalidAlgorithmError) as error:
        raise OidcRefused(
            "the token's signature does not match the issuer's published keys", reason="signature"
        ) from error
    except jwt.InvalidAudienceError as error:
        raise OidcRefused(
            f"the token's audience is {_quote(unverified.get('aud'))}; this portal expects "
            f"{_quote(policy.audience)}",
            reason="audience",
        ) from error
    except jwt.MissingRequiredClaimError as error:
        raise OidcRefused(f"the token has no {error.claim} claim", reason="claims") from error
    except jwt.InvalidTokenError as error:
        raise OidcRefused(f"the token is not valid: {error}", reason="malformed") from error

    _check_times(claims, now=now or datetime.now(UTC), leeway=leeway)
    _check_policy(claims, policy)
    return VerifiedClaims(
        issuer=claims["iss"],
        subject=claims["sub"],
        repository=claims["repository"],
        expires_at=datetime.fromtimestamp(claims["exp"], UTC),
        claims=claims,
    )


def _unverified_parts(token: str) -> tuple[dict, dict]:
    """(header, claims) of `token` as written, unchecked: only to learn which issuer and key it names."""
    try:
        # One parse for both: PyJWT's segment checks are a good part of a verification's time.
        parts = jwt.decode_complete(token, options={"verify_signature": False})
    except jwt.InvalidTokenError as error:
        raise OidcRefused("the token is not a signed JWT", reason="malformed") from error
    if not isinstance(parts["payload"], dict):
        raise OidcRefused("the token's claims are not a JSON object", reason="malformed")
    return parts["header"], parts["payload"]


def _check_times(claims: dict, *, now: datetime, leeway: int) -> None:
    moment = now.timestamp()
    for name in ("exp", "iat", "nbf"):
        if name in claims and not _is_timestamp(claims[name]):
            raise OidcRefused(f"the token's {name} claim is not a time", reason="malformed")
    if claims["exp"] <= moment - leeway:
        raise OidcRefused(
            f"the token expired at {_when(claims['exp'])} (it is now {_when(moment)})", reason="expired"
        )
    if claims["iat"] > moment + leeway:
        raise OidcRefused(
            f"the token claims to be issued at {_when(claims['iat'])}, in the future (it is now "
            f"{_when(moment)})",
            reason="not_yet_valid",
        )
    if "nbf" in claims and claims["nbf"] > moment + leeway:
        raise OidcRefused(
            f"the token is not valid before {_when(claims['nbf'])} (it is now {_when(moment)})",
            reason="not_yet_valid",
        )


def _is_timestamp(value) -> bool:
    # JSON numbers only (PyJWT's parser also reads NaN and Infinity, which compare false with anything).
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 <= value < LATEST_TIMESTAMP
    )


def _check_policy(claims: dict, policy: TrustPolicy) -> None:
    if claims["repository"] != policy.repository:
        raise OidcRefused(
            f"the token was issued for repository {_quote(claims['repository'])}, not {policy.repository}",
            reason="repository",
        )
    if policy.ref is not None and claims.get("ref") != policy.ref:
        raise OidcRefused(
            f"the token was issued for ref {_quote(claims.get('ref'))}, not {policy.ref}", reason="ref"
        )
    if policy.workflow is not None:
        workflow_ref = claims.get("workflow_ref")
        # A path is compared whole (up to the "@"), never as a prefix: "gpu.yml" must not admit
        # "gpu.yml-copy.yml".
        compared = workflow_ref
        if isinstance(workflow_ref, str) and "@" not in policy.workflow:
            compared = workflow_ref.split("@", 1)[0]
        if compared != policy.workflow:
            raise OidcRefused(
                f"the token was issued for workflow {_quote(workflow_ref)}, not {policy.workflow}",
                reason="workflow",
            )
    if policy.environment is not None and claims.get("environment") != policy.environment:
        raise OidcRefused(
            f"the token was issued for environment {_quote(claims.get('environment'))}, "
            f"not {policy.environment}",
            reason="environment",
        )


def _quote(value) -> str:
    """A claim's value for a message: repr-quoted, cut to QUOTE_MAX_CHARS; "none" when absent."""
    if value is None:
        return "none"
    text = repr(value)
    return text if len(text) <= QUOTE_MAX_CHARS else text[:QUOTE_MAX_CHARS] + "…"


def _when(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


# --- Issuers' keys ----------------------------------------------------------------------------------------


def check_fetchable(url: str, *, what: str) -> None:
    """Raises OidcRefused unless `url` is https, or http to a loopback address while
    OIDC_ALLOW_INSECURE_LOOPBACK_ISSUERS is on (tests)."""
    parts = urlsplit(url)
    if parts.scheme == "https" and parts.hostname:
        return
    if (
        parts.scheme == "http"
        and _is_loopback(parts.hostname)
        and settings.OIDC_ALLOW_INSECURE_LOOPBACK_ISSUERS
    ):
        return
    raise OidcRefused(f"the {what} {_quote(url)} is not an https URL", reason="issuer")


def _is_loopback(hostname: str | None) -> bool:
    if hostname == "localhost":
        return True
    try:
        return ipaddress.ip_address(hostname or "").is_loopback
    except ValueError:
        return False


class IssuerKeys:
    """One issuer's discovery document and signing keys, fetched on first use and cached.

    Safe to share between threads: fetches happen under a lock, so a burst of cold verifications makes
    one discovery fetch."""

    def __init__(self, issuer: str):
        self.issuer = issuer
        self._lock = threading.Lock()
        self._client: jwt.PyJWKClient | None = None
        self._discovered_at = 0.0
        self._failure: OidcRefused | None = None
        self._failed_at = 0.0

    def signing_key(self, kid: str) -> jwt.PyJWK:
        """The published key named `kid`, fetching the key set again (within the cooldown) when the
        cached one lacks it.

        Raises OidcRefused when the issuer cannot be reached or does not publish that key."""
        client = self._keys_client()
        try:
            return client.get_signing_key(kid)
        except PyJWKClientConnectionError as error:
            raise self._remember(_unreachable(self.issuer, error.__cause__ or error)) from error
        except (PyJWKClientError, PyJWKSetError, PyJWKError) as error:
            if "Unable to find a signing key" in str(error):
                raise OidcRefused(
                    f"the token's signature does not match the issuer's published keys (none has kid "
                    f"{_quote(kid)})",
                    reason="signature",
                ) from error
            raise OidcRefused(f"the issuer's key set is not usable: {error}", reason="unreachable") from error

    def _keys_client(self) -> jwt.PyJWKClient:
        with self._lock:
            now = time.monotonic()
            if self._failure is not None and now - self._failed_at < RETRY_AFTER_FAILURE_SECONDS:
                raise OidcRefused(str(self._failure), reason=self._failure.reason)
            if self._client is None or now - self._discovered_at > DISCOVERY_CACHE_SECONDS:
                try:
                    jwks_uri = self._discover()
                except OidcRefused as refusal:
                    if self._client is None:
                        self._failure, self._failed_at = refusal, now
                        raise
                    # Keep the keys already held, and ask again once the retry wait is over.
                    self._discovered_at = now - DISCOVERY_CACHE_SECONDS + RETRY_AFTER_FAILURE_SECONDS
                    return self._client
                if self._client is None or self._client.uri != jwks_uri:
                    self._client = jwt.PyJWKClient(
                        jwks_uri,
                        lifespan=KEYS_CACHE_SECONDS,
                        timeout=FETCH_TIMEOUT_SECONDS,
                        cooldown_duration=KEYS_REFRESH_COOLDOWN_SECONDS,
                    )
                self._discovered_at = now
            return self._client

    def _remember(self, refusal: OidcRefused) -> OidcRefused:
        """`refusal`, kept to answer verifications for RETRY_AFTER_FAILURE_SECONDS without fetching."""
        with self._lock:
            self._failure, self._failed_at = refusal, time.monotonic()
        return refusal

    def _discover(self) -> str:
        """The issuer's jwks_uri, from its discovery document. Raises OidcRefused."""
        check_fetchable(self.issuer, what="issuer")
        url = f"{self.issuer.rstrip('/')}/.well-known/openid-configuration"
        try:
            request = urllib.request.Request(url, headers={"Accept": "application/json"})
            with _OPENER.open(request, timeout=FETCH_TIMEOUT_SECONDS) as response:
                document = json.loads(response.read(DISCOVERY_MAX_BYTES))
        except HTTPError as error:
            error.close()
            raise _unreachable(self.issuer, f"its discovery document answered HTTP {error.code}") from error
        except (URLError, TimeoutError, OSError) as error:
            raise _unreachable(self.issuer, error) from error
        except ValueError as error:
            raise _unreachable(self.issuer, "its discovery document is not JSON") from error
        if not isinstance(document, dict) or not isinstance(document.get("jwks_uri"), str):
            raise _unreachable(self.issuer, "its discovery document has no jwks_uri")
        if document.get("issuer") != self.issuer:
            raise OidcRefused(
                f"the issuer's discovery document names issuer {_quote(document.get('issuer'))}, "
                f"not {self.issuer}",
                reason="issuer",
            )
        check_fetchable(document["jwks_uri"], what="issuer's jwks_uri")
        return document["jwks_uri"]


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    # The discovery document lives at one fixed URL of the issuer; a redirect would fetch somewhere else.
    def redirect_request(self, *args, **kwargs):
        return None


_OPENER = urllib.request.build_opener(_NoRedirects())


def _unreachable(issuer: str, cause) -> OidcRefused:
    reason = getattr(cause, "reason", cause)
    return OidcRefused(f"the issuer {issuer} could not be reached: {reason}", reason="unreachable")


_issuers: dict[str, IssuerKeys] = {}
_issuers_lock = threading.Lock()


def issuer_keys(issuer: str) -> IssuerKeys:
    """This process's IssuerKeys for `issuer` (made on first use)."""
    with _issuers_lock:
        keys = _issuers.get(issuer)
        if keys is None:
            keys = _issuers[issuer] = IssuerKeys(issuer)
        return keys


def forget_issuers() -> None:
    """Drop every cached discovery document and key set (tests, benchmarks)."""
    with _issuers_lock:
        _issuers.clear()
