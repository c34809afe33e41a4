"""Keyless CI sign-in from the CLI: with no DevCloud token in a CI job, trade the CI provider's OpenID
Connect token for a short-lived token of the project (POST /api/v1/oidc/token).

Where the CI token comes from:
- DEVCLOUD_OIDC_TOKEN, when set: the token itself (GitLab CI's `id_tokens:`, or any provider's).
- GitHub Actions, in a job with `permissions: id-token: write`: ACTIONS_ID_TOKEN_REQUEST_URL and
  ACTIONS_ID_TOKEN_REQUEST_TOKEN, asked for a token whose audience is the one the portal names
  (GET /api/v1/oidc).
"""

import os

import httpx

TIMEOUT = httpx.Timeout(30.0, connect=10.0)


class SigninError(Exception):
    """The sign-in could not be made; str() says why and what to do."""


def available(environ=os.environ) -> bool:
    """Whether this process can get a CI token at all."""
    return bool(
        environ.get("DEVCLOUD_OIDC_TOKEN")
        or (environ.get("ACTIONS_ID_TOKEN_REQUEST_URL") and environ.get("ACTIONS_ID_TOKEN_REQUEST_TOKEN"))
    )


def _ci_token(http: httpx.Client, portal: str, environ) -> str:
    if environ.get("DEVCLOUD_OIDC_TOKEN"):
        return environ["DEVCLOUD_OIDC_TOKEN"].strip()
    audience = http.get(f"{portal}/api/v1/oidc").raise_for_status().json()["audience"]
    # The runner's URL has a query of its own (api-version): add the audience to it, never replace it.
    answer = http.get(
        httpx.URL(environ["ACTIONS_ID_TOKEN_REQUEST_URL"]).copy_merge_params({"audience": audience}),
        headers={"Authorization": f"Bearer {environ['ACTIONS_ID_TOKEN_REQUEST_TOKEN']}"},
    )
    if answer.status_code != 200:
        raise SigninError(
            f"GitHub Actions gave no OpenID Connect token (HTTP {answer.status_code}); give the job "
            "`permissions: id-token: write`."
        )
    return answer.json()["value"]


def sign_in(portal: str, project: str, environ=os.environ, transport=None) -> dict:
    """{"token", "expires_at", "project"} for `project` at `portal`. Raises SigninError with the
    portal's reason (an untrusted repository, the wrong audience, ...) or the network's."""
    with httpx.Client(timeout=TIMEOUT, transport=transport, headers={"User-Agent": "devcloud-cli"}) as http:
        try:
            id_token = _ci_token(http, portal, environ)
            answer = http.post(f"{portal}/api/v1/oidc/token", json={"project": project, "token": id_token})
        except httpx.HTTPError as error:
            raise SigninError(f"Could not sign in to {portal} with the CI's token: {error}") from None
    if answer.status_code != 201:
        try:
            detail = answer.json().get("detail", "")
        except ValueError:
            detail = answer.text[:200]
        raise SigninError(f"{portal} refused the CI's sign-in to project {project!r}: {detail}")
    return answer.json()
