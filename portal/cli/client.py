"""The API over HTTP, and the exit code each kind of failure gets."""

import json
import uuid

import click
import httpx

OK = 0
REFUSED = 1
USAGE = 2
AUTH = 3
CREDIT = 4
SERVER = 5

EXIT_CODES_HELP = """\b
Exit codes:
  0  success
  1  the portal refused the request (bad input, not found, an ended instance, a failed launch)
  2  usage error (a wrong option or argument)
  3  authentication: not logged in, a bad, expired or revoked token, or a read-only token
  4  not enough credit for the launch
  5  the portal failed or could not be reached (5xx, network error)"""


class ApiError(click.ClickException):
    """A failure with its exit code; with --json, the problem document is printed instead of a sentence."""

    def __init__(self, message: str, *, exit_code: int, problem: dict | None = None, as_json: bool = False):
        super().__init__(message)
        self.exit_code = exit_code
        self.problem = problem or {"detail": message}
        self.as_json = as_json

    def show(self, file=None):
        if self.as_json:
            click.echo(json.dumps({"error": self.problem}, indent=2))
        else:
            click.echo(f"devcloud: {self.message}", err=True)


def exit_code_for(status: int, problem_type: str) -> int:
    if status == 401 or problem_type.endswith((":insufficient-scope", ":csrf", ":forbidden")):
        return AUTH
    if status == 402 or problem_type.endswith(":insufficient-credit"):
        return CREDIT
    if status >= 500:
        return SERVER
    return REFUSED


class Api:
    """A portal's /api/v1/, called with a personal access token."""

    def __init__(self, url: str, token: str, *, as_json: bool = False, transport=None):
        self.url = url.rstrip("/")
        self.as_json = as_json
        self.http = httpx.Client(
            base_url=f"{self.url}/api/v1",
            headers={
                "Authorization": f"Bearer {token}",
                "User-Agent": "devcloud-cli",
                "Accept": "application/json",
            },
            timeout=httpx.Timeout(60.0, connect=10.0),
            transport=transport,
        )

    def fail(self, message: str, exit_code: int, problem: dict | None = None):
        raise ApiError(message, exit_code=exit_code, problem=problem, as_json=self.as_json)

    def request(self, method: str, path: str, *, retries: int = 0, **kwargs):
        """The decoded JSON answer (None for 204). Raises ApiError with the exit code for the failure.

        `retries` repeats the request after a network error (only for requests that are safe to repeat:
        reads, and launches carrying an Idempotency-Key).
        """
        for attempt in range(retries + 1):
            try:
                response = self.http.request(method, path, **kwargs)
                break
            except httpx.HTTPError as error:
                if attempt == retries:
                    self.fail(f"Could not reach {self.url}: {error}", SERVER)
        if response.status_code == 204:
            return None
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.is_success:
            if body is None:
                self.fail(
                    f"{self.url} answered {response.status_code} without JSON; is this a DevCloud portal?",
                    SERVER,
                )
            return body
        problem = (
            body
            if isinstance(body, dict)
            else {"status": response.status_code, "detail": response.text[:200]}
        )
        detail = str(problem.get("detail") or problem.get("title") or f"HTTP {response.status_code}")
        errors = problem.get("errors") or {}
        if errors and len(errors) > 1:
            detail = " ".join(f"{field}: {' '.join(messages)}" for field, messages in errors.items())
        self.fail(detail, exit_code_for(response.status_code, str(problem.get("type", ""))), problem)

    def get(self, path: str, **kwargs):
        return self.request("GET", path, retries=2, **kwargs)

    def launch(
        self,
        *,
        size: str,
        image: str,
        project: str | None = None,
        key: str = "",
        stop_after_seconds: int | None = None,
        reservation: str | None = None,
    ) -> dict:
        """Launch once per `key` (the Idempotency-Key): the same key again answers with the instance the
        first launch made. Without a key, one is drawn for this call and its retries: a request that
        reached the portal before the network failed is answered with its instance instead of launching
        a second one. `project` pays from that project's pool; `reservation` (a booking's id) launches on
        that open booking."""
        body = {"size": size, "image": image} | ({"project": project} if project else {})
        if stop_after_seconds is not None:
            body["stop_after_seconds"] = stop_after_seconds
        if reservation:
            body["reservation"] = reservation
        return self.request(
            "POST",
            "/instances",
            json=body,
            headers={"Idempotency-Key": key or str(uuid.uuid4())},
            retries=2,
        )

    def resolve(self, name: str) -> dict:
        """The caller's instance named by a full id or a prefix of it (the 8-character short id)."""
        wanted = name.strip().lower()
        if len(wanted) == 36:
            return self.get(f"/instances/{wanted}")
        matches = [row for row in self.get("/instances") if row["id"].startswith(wanted)] if wanted else []
        if not matches:
            self.fail(f"You have no instance {name!r}. `devcloud ls` lists yours.", REFUSED)
        if len(matches) > 1:
            self.fail(f"{name!r} names more than one of your instances; use more of its id.", REFUSED)
        return matches[0]
