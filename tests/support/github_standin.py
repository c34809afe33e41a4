"""A local stand-in for GitHub's OAuth and REST endpoints, on 127.0.0.1 with a random port.

It speaks just enough of GitHub's protocol for the portal's real backend to run against it:
- GET  /login/oauth/authorize    -> 302 to redirect_uri with a one-time code and the same state
                                     (or error=access_denied when the scenario says the person refused);
- POST /login/oauth/access_token -> JSON access token for a valid, unused code and the right client secret
                                     (GitHub answers errors with 200 and an "error" field; so does this);
- GET  /user, GET /user/emails    -> the scenario's profile and address list, for a valid token only.

Each test sets `standin.scenario` to the GitHub account it wants, and failure switches on it. The `github`
fixture starts the server and points the portal's settings at it; `standin.login_with(client)` drives
the Django test client through the whole redirect dance with real HTTP between the two.
"""

import secrets
from dataclasses import dataclass, field
from urllib.parse import parse_qs, parse_qsl, urlencode, urlsplit, urlunsplit

import pytest
import requests

from tests.support.standin_server import JsonHandler, StandinServer

CLIENT_ID = "standin-client-id"
CLIENT_SECRET = "standin-client-secret"


@dataclass
class GithubScenario:
    """The GitHub account on the other side, and how GitHub misbehaves.

    `user` is the /user body, `emails` the /user/emails body. `deny` makes the authorize step answer
    error=access_denied. `token_error` makes the token endpoint answer {"error": ...} as GitHub does;
    `token_status`, `user_status` and `emails_status` make that endpoint fail with an HTTP status.
    """

    user: dict
    emails: list
    deny: bool = False
    token_error: str | None = None
    token_status: int = 200
    user_status: int = 200
    emails_status: int = 200

    @classmethod
    def person(
        cls,
        *,
        github_id: int,
        login: str,
        email: str,
        name: str | None = None,
        verified: bool = True,
        public_email: str | None = "same",
        extra_emails: list | None = None,
    ) -> "GithubScenario":
        """A GitHub account whose primary address is `email` (verified or not).

        `public_email` is what the profile shows: "same" shows the primary address, None hides it
        (GitHub's "Keep my email addresses private"), any other string shows that address.
        """
        shown = email if public_email == "same" else public_email
        emails = [
            {"email": email, "primary": True, "verified": verified, "visibility": "public" if shown else None}
        ]
        emails += extra_emails or []
        emails.append(
            {
                "email": f"{github_id}+{login}@users.noreply.github.com",
                "primary": False,
                "verified": True,
                "visibility": None,
            }
        )
        return cls(user={"id": github_id, "login": login, "name": name, "email": shown}, emails=emails)


@dataclass
class _Issued:
    codes: dict = field(default_factory=dict)  # code -> redirect_uri
    tokens: set = field(default_factory=set)


class GithubStandin(StandinServer):
    """The server. `url` is its base URL; `requests_seen` lists (method, path) in arrival order."""

    def __init__(self, *, client_id: str = CLIENT_ID, client_secret: str = CLIENT_SECRET):
        self.client_id = client_id
        self.client_secret = client_secret
        self.scenario = GithubScenario.person(
            github_id=1001, login="ada", name="Ada Lovelace", email="ada@example.org"
        )
        self.requests_seen: list[tuple[str, str]] = []
        self._issued = _Issued()
        super().__init__(_handler_for(self), name="github-standin")

    def paths_seen(self) -> list[str]:
        with self._lock:
            return [path for _, path in self.requests_seen]

    # --- Driving the portal -------------------------------------------------------------------------------

    def authorize(self, client, *, next_url: str | None = None):
        """Start GitHub login in the portal and pass the stand-in's authorize step with real HTTP.

        Returns the portal path (with query) GitHub sends the browser back to.
        """
        begin = client.post("/auth/login/github/", {"next": next_url} if next_url else {})
        assert begin.status_code == 302, begin
        location = begin["Location"]
        assert location.startswith(f"{self.url}/login/oauth/authorize?"), location
        answer = requests.get(location, allow_redirects=False, timeout=5)
        assert answer.status_code == 302, answer.text
        callback = urlsplit(answer.headers["Location"])
        assert callback.netloc == "testserver", callback
        return urlunsplit(("", "", callback.path, callback.query, ""))

    def login_with(self, client, *, tamper_state: bool = False, drop_state: bool = False, next_url=None):
        """The whole dance: begin, authorize at the stand-in, come back to /auth/complete/github/.

        `tamper_state` swaps the state GitHub returns for another value, as a forged callback would;
        `drop_state` removes it. Returns the test client's response to the callback.
        """
        callback = self.authorize(client, next_url=next_url)
        if tamper_state or drop_state:
            path, _, query = callback.partition("?")
            params = [(key, value) for key, value in parse_qsl(query) if key != "state"]
            if tamper_state:
                params.append(("state", secrets.token_urlsafe(24)))
            callback = f"{path}?{urlencode(params)}"
        return client.get(callback)

    # --- Server side --------------------------------------------------------------------------------------

    def _issue_code(self, redirect_uri: str) -> str:
        code = secrets.token_hex(10)
        with self._lock:
            self._issued.codes[code] = redirect_uri
        return code

    def _redeem_code(self, code: str, redirect_uri: str | None) -> str | None:
        with self._lock:
            expected = self._issued.codes.pop(code, None)
            if expected is None or (redirect_uri and redirect_uri != expected):
                return None
            token = f"gho_{secrets.token_hex(16)}"
            self._issued.tokens.add(token)
            return token

    def _token_valid(self, header: str) -> bool:
        scheme, _, token = header.partition(" ")
        with self._lock:
            return scheme.lower() in ("token", "bearer") and token in self._issued.tokens


def _handler_for(standin: GithubStandin):
    class Handler(JsonHandler):
        json_content_type = "application/json; charset=utf-8"

        def _record(self) -> tuple[str, dict]:
            parts = urlsplit(self.path)
            with standin._lock:
                standin.requests_seen.append((self.command, parts.path))
            return parts.path, {key: values[0] for key, values in parse_qs(parts.query).items()}

        def do_GET(self):
            path, query = self._record()
            scenario = standin.scenario
            if path == "/login/oauth/authorize":
                return self._authorize(query, scenario)
            if path in ("/user", "/user/emails"):
                if not standin._token_valid(self.headers.get("Authorization", "")):
                    return self._json(401, {"message": "Bad credentials"})
                status, body = (
                    (scenario.user_status, scenario.user)
                    if path == "/user"
                    else (scenario.emails_status, scenario.emails)
                )
                if status != 200:
                    return self._json(status, {"message": "Server Error"})
                return self._json(200, body)
            return self._json(404, {"message": "Not Found"})

        def _authorize(self, query: dict, scenario: GithubScenario) -> None:
            redirect_uri = query.get("redirect_uri")
            if query.get("client_id") != standin.client_id or not redirect_uri:
                return self._json(404, {"message": "Unknown OAuth app or missing redirect_uri"})
            params = {}
            if scenario.deny:
                params.update(
                    error="access_denied",
                    error_description="The user has denied your application access.",
                    error_uri="https://docs.github.com/apps/troubleshooting-authorization-request-errors",
                )
            else:
                params["code"] = standin._issue_code(redirect_uri)
            if "state" in query:
                params["state"] = query["state"]
            separator = "&" if "?" in redirect_uri else "?"
            self.send_response(302)
            self.send_header("Location", f"{redirect_uri}{separator}{urlencode(params)}")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_POST(self):
            path, _ = self._record()
            if path != "/login/oauth/access_token":
                return self._json(404, {"message": "Not Found"})
            length = int(self.headers.get("Content-Length") or 0)
            form = {key: values[0] for key, values in parse_qs(self.rfile.read(length).decode()).items()}
            scenario = standin.scenario
            if scenario.token_status != 200:
                return self._json(scenario.token_status, {"message": "Server Error"})
            if scenario.token_error:
                return self._json(
                    200, {"error": scenario.token_error, "error_description": "Stand-in refused."}
                )
            if (
                form.get("client_id") != standin.client_id
                or form.get("client_secret") != standin.client_secret
            ):
                return self._json(200, {"error": "incorrect_client_credentials"})
            token = standin._redeem_code(form.get("code", ""), form.get("redirect_uri"))
            if token is None:
                return self._json(
                    200, {"error": "bad_verification_code", "error_description": "The code is wrong."}
                )
            return self._json(200, {"access_token": token, "token_type": "bearer", "scope": "user:email"})

    return Handler


@pytest.fixture(name="github")
def github_fixture(settings):
    """A running stand-in, with the portal's GitHub settings pointed at it for this test."""
    standin = GithubStandin().start()
    settings.GITHUB_OAUTH_URL = standin.url
    settings.GITHUB_API_URL = standin.url
    settings.SOCIAL_AUTH_GITHUB_KEY = standin.client_id
    settings.SOCIAL_AUTH_GITHUB_SECRET = standin.client_secret
    yield standin
    standin.stop()
