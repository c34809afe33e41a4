"""Keyless CI sign-in: portal.lib.oidc.verify accepts a CI run's OpenID Connect token only when the trusted
issuer signed it for this portal and the run is the one the policy names, and fetches nothing but that
issuer (docs/architecture.md, "Keyless CI sign-in"). The issuer is a real HTTP server on loopback
(tests/support/oidc_issuer.py)."""

import base64
import hashlib
import hmac
import json
import socket
import time
from datetime import UTC, datetime, timedelta

import jwt
import pytest
from cryptography.hazmat.primitives import serialization

from portal.lib import oidc
from tests.support.oidc_issuer import (
    DEFAULT_AUDIENCE,
    DEFAULT_REPOSITORY,
    DEFAULT_WORKFLOW,
    DISCOVERY_PATH,
    JWKS_PATH,
    OidcIssuer,
    SigningKey,
)


def policy_for(issuer, **rules) -> oidc.TrustPolicy:
    return oidc.TrustPolicy(
        **{"issuer": issuer.url, "audience": DEFAULT_AUDIENCE, "repository": DEFAULT_REPOSITORY, **rules}
    )


def refusal(token: str, policy: oidc.TrustPolicy, **kwargs) -> oidc.OidcRefused:
    """The OidcRefused that verify raises for `token`, after checking its message does not echo it."""
    with pytest.raises(oidc.OidcRefused) as caught:
        oidc.verify(token, policy, **kwargs)
    message = str(caught.value)
    for part in token.split("."):
        assert not part or part not in message, message
    return caught.value


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def test_it_accepts_a_good_token_and_returns_its_claims(oidc_issuer):
    token = oidc_issuer.token(run_id="7000000042")

    verified = oidc.verify(token, policy_for(oidc_issuer))

    assert verified.issuer == oidc_issuer.url
    assert verified.repository == DEFAULT_REPOSITORY
    assert verified.subject == f"repo:{DEFAULT_REPOSITORY}:ref:refs/heads/main"
    assert verified.get("run_id") == "7000000042"
    assert verified.get("workflow_ref") == f"{DEFAULT_WORKFLOW}@refs/heads/main"
    assert verified.expires_at == datetime.fromtimestamp(verified.claims["exp"], UTC)


def test_it_accepts_a_token_signed_by_the_issuers_ec_key(oidc_issuer):
    token = oidc_issuer.token(signing_key=oidc_issuer.ec_key)

    assert oidc.verify(token, policy_for(oidc_issuer)).repository == DEFAULT_REPOSITORY


def test_it_accepts_a_token_that_meets_every_rule_of_a_narrow_policy(oidc_issuer):
    policy = policy_for(oidc_issuer, ref="refs/heads/main", workflow=DEFAULT_WORKFLOW, environment="gpu")

    verified = oidc.verify(oidc_issuer.token(environment="gpu"), policy)

    assert verified.get("environment") == "gpu"


def test_warm_verifications_fetch_the_discovery_document_and_keys_once(oidc_issuer):
    for _ in range(5):
        oidc.verify(oidc_issuer.token(), policy_for(oidc_issuer))

    assert oidc_issuer.requests_seen == [DISCOVERY_PATH, JWKS_PATH]


def test_it_refuses_a_token_for_another_repository(oidc_issuer):
    token = oidc_issuer.token(repository="mallory/gpu-project")

    refused = refusal(token, policy_for(oidc_issuer))

    assert refused.reason == "repository"
    assert str(refused) == (
        f"the token was issued for repository 'mallory/gpu-project', not {DEFAULT_REPOSITORY}"
    )


def test_it_refuses_a_token_without_a_repository(oidc_issuer):
    refused = refusal(oidc_issuer.token(repository=None), policy_for(oidc_issuer))

    assert str(refused) == "the token has no repository claim"


def test_it_refuses_a_token_for_another_audience(oidc_issuer):
    token = oidc_issuer.token(aud="https://other-cloud.example.com")

    refused = refusal(token, policy_for(oidc_issuer))

    assert refused.reason == "audience"
    assert str(refused) == (
        f"the token's audience is 'https://other-cloud.example.com'; this portal expects '{DEFAULT_AUDIENCE}'"
    )


def test_it_refuses_an_expired_token_and_says_when_it_expired(oidc_issuer):
    token = oidc_issuer.token(exp=int(time.time()) + 300)
    later = datetime.now(UTC) + timedelta(minutes=10)

    refused = refusal(token, policy_for(oidc_issuer), now=later)

    assert refused.reason == "expired"
    expired_at = datetime.fromtimestamp(jwt.decode(token, options={"verify_signature": False})["exp"], UTC)
    assert str(refused).startswith(f"the token expired at {expired_at:%Y-%m-%d %H:%M:%S} UTC (it is now ")


def test_it_allows_a_minute_of_clock_skew_and_no_more(oidc_issuer):
    now = int(time.time())
    token = oidc_issuer.token(iat=now - 400, nbf=now - 400, exp=now - 30)

    assert oidc.verify(token, policy_for(oidc_issuer)).repository == DEFAULT_REPOSITORY
    assert refusal(token, policy_for(oidc_issuer), leeway=10).reason == "expired"


def test_it_refuses_time_claims_that_are_not_times(oidc_issuer):
    for value in (float("nan"), float("inf"), "tomorrow", True):
        refused = refusal(oidc_issuer.token(exp=value), policy_for(oidc_issuer))
        assert str(refused) == "the token's exp claim is not a time"


def test_it_refuses_a_token_that_is_not_valid_yet(oidc_issuer):
    now = int(time.time())

    assert refusal(oidc_issuer.token(nbf=now + 600), policy_for(oidc_issuer)).reason == "not_yet_valid"
    assert refusal(oidc_issuer.token(iat=now + 600), policy_for(oidc_issuer)).reason == "not_yet_valid"


def test_it_refuses_a_token_signed_by_a_key_the_issuer_does_not_publish(oidc_issuer):
    refused = refusal(oidc_issuer.outsider_token(), policy_for(oidc_issuer))

    assert refused.reason == "signature"
    assert str(refused).startswith("the token's signature does not match the issuer's published keys")


def test_it_refuses_the_signature_of_one_key_under_the_kid_of_a_published_one(oidc_issuer):
    forged_rsa = oidc_issuer.token(signing_key=SigningKey.rsa(), kid=oidc_issuer.rsa_key.kid)
    rsa_under_ec_kid = oidc_issuer.token(kid=oidc_issuer.ec_key.kid)

    for token in (forged_rsa, rsa_under_ec_kid):
        refused = refusal(token, policy_for(oidc_issuer))
        assert str(refused) == "the token's signature does not match the issuer's published keys"


def test_it_refuses_an_unsigned_token(oidc_issuer):
    claims = oidc_issuer.claims()
    header = {"alg": "none", "typ": "JWT", "kid": oidc_issuer.rsa_key.kid}
    token = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}."

    refused = refusal(token, policy_for(oidc_issuer))

    assert refused.reason == "signature"
    assert str(refused).startswith(
        "the token is signed with algorithm 'none'; this portal accepts only RS256"
    )


def test_it_refuses_a_token_signed_with_hs256_keyed_by_the_issuers_public_key(oidc_issuer):
    # The classic confusion: a verifier that lets the header pick the algorithm checks an HMAC keyed by
    # the RSA public key, which anyone can fetch.
    public_pem = oidc_issuer.rsa_key.private_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    header = {"alg": "HS256", "typ": "JWT", "kid": oidc_issuer.rsa_key.kid}
    signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(oidc_issuer.claims()).encode())}"
    signature = hmac.new(public_pem, signing_input.encode(), hashlib.sha256).digest()
    token = f"{signing_input}.{_b64(signature)}"

    refused = refusal(token, policy_for(oidc_issuer))

    assert refused.reason == "signature"
    assert str(refused).startswith("the token is signed with algorithm 'HS256'")


def test_it_refuses_another_issuer_before_fetching_anything():
    trusted, other = OidcIssuer().start(), OidcIssuer().start()
    try:
        refused = refusal(other.token(), policy_for(trusted))

        assert refused.reason == "issuer"
        assert str(refused) == (
            f"the token's issuer '{other.url}' is not trusted by this project (it trusts {trusted.url})"
        )
        assert other.requests_seen == []
        assert trusted.requests_seen == []
    finally:
        trusted.stop()
        other.stop()
        oidc.forget_issuers()


def test_a_token_pointing_at_other_keys_is_checked_against_the_trusted_issuers_keys_only():
    trusted, other = OidcIssuer().start(), OidcIssuer().start()
    try:
        # Signed by the other issuer's key, claiming the trusted issuer, and naming where its key is.
        token = jwt.encode(
            trusted.claims(),
            other.rsa_key.private_key,
            algorithm="RS256",
            headers={"kid": other.rsa_key.kid, "jku": f"{other.url}{JWKS_PATH}", "x5u": f"{other.url}/cert"},
        )

        assert refusal(token, policy_for(trusted)).reason == "signature"
        assert other.requests_seen == []
    finally:
        trusted.stop()
        other.stop()
        oidc.forget_issuers()


def test_it_refuses_a_token_from_another_branch(oidc_issuer):
    token = oidc_issuer.token(ref="refs/heads/feature")

    refused = refusal(token, policy_for(oidc_issuer, ref="refs/heads/main"))

    assert refused.reason == "ref"
    assert str(refused) == "the token was issued for ref 'refs/heads/feature', not refs/heads/main"


def test_it_refuses_a_token_from_another_workflow(oidc_issuer):
    other = f"{DEFAULT_REPOSITORY}/.github/workflows/release.yml@refs/heads/main"
    policy = policy_for(oidc_issuer, workflow=DEFAULT_WORKFLOW)

    refused = refusal(oidc_issuer.token(workflow_ref=other), policy)

    assert refused.reason == "workflow"
    assert str(refused) == f"the token was issued for workflow '{other}', not {DEFAULT_WORKFLOW}"


def test_a_workflow_path_is_never_matched_as_a_prefix(oidc_issuer):
    longer = f"{DEFAULT_WORKFLOW}-copy.yml@refs/heads/main"

    refused = refusal(
        oidc_issuer.token(workflow_ref=longer), policy_for(oidc_issuer, workflow=DEFAULT_WORKFLOW)
    )

    assert refused.reason == "workflow"


def test_a_workflow_with_its_ref_must_match_the_whole_workflow_ref(oidc_issuer):
    policy = policy_for(oidc_issuer, workflow=f"{DEFAULT_WORKFLOW}@refs/heads/main")

    assert oidc.verify(oidc_issuer.token(), policy).repository == DEFAULT_REPOSITORY
    tagged = oidc_issuer.token(workflow_ref=f"{DEFAULT_WORKFLOW}@refs/tags/v1")
    assert refusal(tagged, policy).reason == "workflow"


def test_it_refuses_a_token_from_another_environment(oidc_issuer):
    policy = policy_for(oidc_issuer, environment="gpu")

    assert str(refusal(oidc_issuer.token(), policy)) == "the token was issued for environment none, not gpu"
    assert refusal(oidc_issuer.token(environment="staging"), policy).reason == "environment"


def test_after_a_key_rotation_a_token_with_the_new_kid_is_accepted_after_one_refetch(
    oidc_issuer, monkeypatch
):
    monkeypatch.setattr(oidc, "KEYS_REFRESH_COOLDOWN_SECONDS", 0.2)
    oidc.verify(oidc_issuer.token(), policy_for(oidc_issuer))
    old_key = oidc_issuer.rotate()
    time.sleep(0.3)

    verified = oidc.verify(oidc_issuer.token(), policy_for(oidc_issuer))

    assert verified.repository == DEFAULT_REPOSITORY
    assert oidc_issuer.count(JWKS_PATH) == 2
    assert oidc_issuer.count(DISCOVERY_PATH) == 1
    time.sleep(0.3)
    assert refusal(oidc_issuer.token(signing_key=old_key), policy_for(oidc_issuer)).reason == "signature"


def test_unknown_kids_make_no_refetch_within_a_minute_of_the_last_fetch(oidc_issuer):
    oidc.verify(oidc_issuer.token(), policy_for(oidc_issuer))
    oidc_issuer.rotate()

    for _ in range(20):
        assert refusal(oidc_issuer.outsider_token(), policy_for(oidc_issuer)).reason == "signature"
    # Even the real new key waits for the cooldown: the key set was fetched less than a minute ago.
    assert refusal(oidc_issuer.token(), policy_for(oidc_issuer)).reason == "signature"

    assert oidc_issuer.count(JWKS_PATH) == 1


def test_it_says_when_the_issuer_cannot_be_reached(oidc_issuer):
    token = oidc_issuer.token()
    oidc_issuer.stop()

    refused = refusal(token, policy_for(oidc_issuer))

    assert refused.reason == "unreachable"
    assert str(refused).startswith(f"the issuer {oidc_issuer.url} could not be reached: ")
    assert "refused" in str(refused).lower()


def test_after_a_failed_fetch_the_issuer_is_not_asked_again_until_the_retry_wait_is_over(
    oidc_issuer, monkeypatch
):
    monkeypatch.setattr(oidc, "RETRY_AFTER_FAILURE_SECONDS", 0.3)
    oidc_issuer.failing = {DISCOVERY_PATH: 503}
    message = f"the issuer {oidc_issuer.url} could not be reached: its discovery document answered HTTP 503"

    assert str(refusal(oidc_issuer.token(), policy_for(oidc_issuer))) == message
    assert str(refusal(oidc_issuer.token(), policy_for(oidc_issuer))) == message
    assert oidc_issuer.count(DISCOVERY_PATH) == 1

    oidc_issuer.failing = {}
    time.sleep(0.4)
    assert oidc.verify(oidc_issuer.token(), policy_for(oidc_issuer)).repository == DEFAULT_REPOSITORY


def test_a_failed_key_set_fetch_is_not_retried_until_the_retry_wait_is_over(oidc_issuer, monkeypatch):
    monkeypatch.setattr(oidc, "RETRY_AFTER_FAILURE_SECONDS", 0.3)
    oidc_issuer.failing = {JWKS_PATH: 502}

    for _ in range(3):
        refused = refusal(oidc_issuer.token(), policy_for(oidc_issuer))
        assert str(refused) == f"the issuer {oidc_issuer.url} could not be reached: Bad Gateway"
    assert oidc_issuer.count(JWKS_PATH) == 1

    oidc_issuer.failing = {}
    time.sleep(0.4)
    assert oidc.verify(oidc_issuer.token(), policy_for(oidc_issuer)).repository == DEFAULT_REPOSITORY


def test_keys_already_held_keep_working_while_the_discovery_document_cannot_be_refreshed(
    oidc_issuer, monkeypatch
):
    oidc.verify(oidc_issuer.token(), policy_for(oidc_issuer))
    monkeypatch.setattr(oidc, "DISCOVERY_CACHE_SECONDS", 0)
    oidc_issuer.failing = {DISCOVERY_PATH: 500}

    for _ in range(3):
        assert oidc.verify(oidc_issuer.token(), policy_for(oidc_issuer)).repository == DEFAULT_REPOSITORY

    assert oidc_issuer.count(DISCOVERY_PATH) == 2
    assert oidc_issuer.count(JWKS_PATH) == 1


def test_it_gives_up_on_an_issuer_that_does_not_answer(oidc_issuer, monkeypatch):
    monkeypatch.setattr(oidc, "FETCH_TIMEOUT_SECONDS", 0.5)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # the kernel accepts connections; nobody ever answers
    try:
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        token = oidc_issuer.token(iss=url)
        started = time.monotonic()

        refused = refusal(
            token, oidc.TrustPolicy(issuer=url, audience=DEFAULT_AUDIENCE, repository=DEFAULT_REPOSITORY)
        )

        assert time.monotonic() - started < 3
        assert refused.reason == "unreachable"
        assert "timed out" in str(refused)
    finally:
        silent.close()


def test_it_refuses_a_plain_http_issuer_unless_loopback_issuers_are_allowed(oidc_issuer, settings):
    settings.OIDC_ALLOW_INSECURE_LOOPBACK_ISSUERS = False

    refused = refusal(oidc_issuer.token(), policy_for(oidc_issuer))

    assert str(refused) == f"the issuer '{oidc_issuer.url}' is not an https URL"
    assert oidc_issuer.requests_seen == []


def test_the_issuer_the_discovery_document_names_must_be_the_trusted_one(oidc_issuer):
    # The same server under another name: its discovery document names 127.0.0.1, not localhost.
    alias = oidc_issuer.url.replace("127.0.0.1", "localhost")

    refused = refusal(
        oidc_issuer.token(iss=alias),
        oidc.TrustPolicy(issuer=alias, audience=DEFAULT_AUDIENCE, repository=DEFAULT_REPOSITORY),
    )

    assert refused.reason == "issuer"
    assert str(refused) == f"the issuer's discovery document names issuer '{oidc_issuer.url}', not {alias}"
    assert oidc_issuer.requests_seen == [DISCOVERY_PATH]


def test_it_refuses_what_is_not_a_jwt(oidc_issuer):
    assert str(refusal("not-a-token", policy_for(oidc_issuer))) == "the token is not a signed JWT"
    assert oidc_issuer.requests_seen == []
