"""A small client of slurmrestd (Slurm's REST API) with JWT authentication.

Plain values in, plain values out: no Django here, so the driver above decides where the URL, user and
token come from. Every failure is a SlurmError whose `permanent` says whether retrying can help, and
whose message says what happened and what the operator should do.

slurmrestd's answers need some reading (seen on Slurm 22.05, v0.0.38):
  - no token at all gives 401, but a token slurmctld does not accept (bad signature, expired, another
    user's) gives 500. On submit and cancel the error is "Zero Bytes were transmitted or received"
    (slurmctld hangs up); on reads only "Unspecified error" (-1), exactly as when slurmctld is down. An
    expired or malformed JWT is recognised locally; otherwise one cancel of a job id that cannot exist
    tells a refused token (5005) from a dead controller (1xxx);
  - an unknown job id gives 500 with error 2017 ("Invalid job id specified"), for GET and DELETE;
  - a submission can succeed and still list errors (e.g. 2042 for a held job): the job id decides;
  - `"requeue": false` in a job is taken as a request to requeue; `"no_requeue": true` works.
"""

import base64
import functools
import json
import time
from dataclasses import dataclass, field

import httpx

# The one place the API version is named: Slurm 22.05 serves v0.0.36 to v0.0.38; AMD's Spur v0.0.42.
API_VERSION = "v0.0.38"
DEFAULT_TIMEOUT = 10.0

INVALID_JOB_ID = 2017
INVALID_PARTITION = 2000
NODE_CONFIG_UNAVAILABLE = 2014
# slurmctld hangs up on a token it does not accept: "Zero Bytes were transmitted or received".
ZERO_BYTES = 5005
# slurmrestd could not connect to slurmctld (SLURM_COMMUNICATIONS_* and friends).
CONTROLLER_UNREACHABLE = frozenset(range(1000, 2000))
# Above the default MaxJobId (67043328), so cancelling it never touches a job.
NEVER_A_JOB_ID = 67108863
# States after which a job will not run again (job_state values; see squeue(1) "JOB STATE CODES").
ENDED_STATES = frozenset({
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
    "PREEMPTED", "TIMEOUT",
})


class SlurmError(Exception):
    """A failure talking to Slurm. `permanent` says whether retrying the same request can help."""

    def __init__(self, message: str, *, permanent: bool, status: int | None = None):
        super().__init__(message)
        self.message = message
        self.permanent = permanent
        self.status = status


class SlurmUnreachable(SlurmError):
    """slurmrestd did not answer (connection refused, timeout): transient."""


class SlurmAuthError(SlurmError):
    """slurmrestd refused the request's authentication (no token, or one it does not accept)."""


class SlurmBadToken(SlurmAuthError):
    """The token is malformed, expired, or not signed with the cluster's key (slurmrestd answers 500)."""


class SlurmRejected(SlurmError):
    """Slurm understood the request and refused it (unknown partition, impossible resources, bad key)."""


@dataclass
class Job:
    """A job as Slurm sees it. Times are Unix seconds (None when not started or ended); exit_code is
    the script's exit status (None while it runs), signal the signal that ended it (or None)."""

    job_id: int
    name: str
    state: str
    reason: str
    nodes: str
    gres_detail: list[str] = field(default_factory=list)
    exit_code: int | None = None
    signal: int | None = None
    submit_time: int | None = None
    start_time: int | None = None
    end_time: int | None = None
    partition: str = ""
    requeue: bool | None = None
    restarts: int = 0

    @property
    def ended(self) -> bool:
        return self.state in ENDED_STATES


@dataclass
class Node:
    name: str
    address: str
    state: str
    gres: str
    gres_used: str
    partitions: list[str]
    state_flags: list[str] = field(default_factory=list)


def _number(value):
    """v0.0.38 gives plain numbers; v0.0.40+ give {"set": bool, "infinite": bool, "number": n}."""
    if isinstance(value, dict):
        return value.get("number") if value.get("set", True) and not value.get("infinite") else None
    return value


def _state(value) -> str:
    """v0.0.38 gives "RUNNING"; v0.0.40+ a list such as ["RUNNING"] or ["PENDING", "REQUEUED"]."""
    if isinstance(value, list):
        return value[0] if value else ""
    return value or ""


def _time(value) -> int | None:
    seconds = _number(value)
    return seconds or None


def _jwt_expiry(token: str) -> int | None:
    """The `exp` claim of a JWT (not verified: only slurmctld can), or None when it has none."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        return int(claims["exp"])
    except (IndexError, ValueError, KeyError, TypeError):
        return None


@functools.cache
def _tls_context():
    """The one TLS context of every client (an https slurmrestd is verified against the usual CAs).
    Building one loads the whole CA bundle, which costs more CPU than most requests, and the driver
    makes a client per call: one a second for each starting instance."""
    return httpx.create_ssl_context()


class SlurmRest:
    """slurmrestd at `base_url` ("http://slurm-head:6820"), as Slurm user `user_name` with JWT `token`
    (`scontrol token username=<user> lifespan=<seconds>`). Each call takes at most `timeout` seconds."""

    def __init__(
        self,
        base_url: str,
        *,
        user_name: str,
        token: str,
        api_version: str = API_VERSION,
        timeout: float = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self.user_name = user_name
        self.token = token
        self.api_version = api_version
        self._client = httpx.Client(
            base_url=self.base_url,
            timeout=timeout,
            # Without a token, no token header: slurmrestd then answers 401 (an empty one gives 500).
            headers={"X-SLURM-USER-NAME": user_name, **({"X-SLURM-USER-TOKEN": token} if token else {})},
            transport=transport,
            verify=_tls_context(),
        )

    def close(self) -> None:
        self._client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- the API --

    def ping(self) -> dict:
        """Returns {"hostname", "ping" ("UP"...), "mode"} of the first controller. Raises SlurmError."""
        body = self._request("GET", "ping", what="ping slurmctld")
        pings = body.get("pings") or [{}]
        return pings[0]

    def nodes(self) -> list[Node]:
        """Every node of the cluster. Raises SlurmError."""
        body = self._request("GET", "nodes", what="list the nodes")
        return [
            Node(
                name=node["name"],
                address=node.get("address") or node.get("hostname") or node["name"],
                state=_state(node.get("state")).upper(),
                gres=node.get("gres") or "",
                gres_used=node.get("gres_used") or "",
                partitions=list(node.get("partitions") or []),
                state_flags=list(node.get("state_flags") or []),
            )
            for node in body.get("nodes", [])
        ]

    def partitions(self) -> list[dict]:
        """Every partition, as slurmrestd describes it ("name", "nodes", ...). Raises SlurmError."""
        return self._request("GET", "partitions", what="list the partitions").get("partitions", [])

    def submit(self, *, script: str, job: dict) -> int:
        """Submits a batch job (`job`: the REST job properties, e.g. job.job_request()). Returns its id.

        Raises SlurmRejected (permanent) for an unknown partition or a request Slurm will never run,
        SlurmBadToken / SlurmAuthError / SlurmUnreachable otherwise. A submission whose answer was lost
        (timeout) may still have made the job: look for it with find_job(name) before submitting again.
        """
        body = self._request(
            "POST", "job/submit", json={"script": script, "job": job}, what=f"submit job {job.get('name')!r}"
        )
        job_id = body.get("job_id")
        if not job_id:
            raise self._error_from(200, body, f"submit job {job.get('name')!r}")
        return int(job_id)

    def job(self, job_id: int) -> Job | None:
        """The job, or None when Slurm does not know it (never existed, or ended more than MinJobAge ago
        on a cluster without accounting). Raises SlurmError."""
        try:
            body = self._request("GET", f"job/{int(job_id)}", what=f"read job {job_id}")
        except SlurmRejected as error:
            if error.status == INVALID_JOB_ID:
                return None
            raise
        jobs = body.get("jobs") or []
        return _job(jobs[0]) if jobs else None

    def jobs(self) -> list[Job]:
        """Every job slurmctld still knows (running, pending, and ended within MinJobAge). Raises
        SlurmError."""
        return [_job(job) for job in self._request("GET", "jobs", what="list the jobs").get("jobs", [])]

    def find_job(self, name: str) -> Job | None:
        """The job named exactly `name` that is still live (pending, running...), or else the most recent
        one that ended; None when there is none. Raises SlurmError."""
        named = [job for job in self.jobs() if job.name == name]
        live = [job for job in named if not job.ended]
        candidates = live or named
        return max(candidates, key=lambda job: job.job_id) if candidates else None

    def cancel(self, job_id: int) -> None:
        """Cancels the job (SIGKILL to its steps after KillWait, as scancel does). Returns at once; the job
        ends shortly after. An unknown or already ended job counts as cancelled. Raises SlurmError."""
        try:
            self._request("DELETE", f"job/{int(job_id)}", what=f"cancel job {job_id}")
        except SlurmRejected as error:
            if error.status == INVALID_JOB_ID or "already completing or completed" in error.message:
                return
            raise

    # -- internals --

    def _request(
        self, method: str, path: str, *, what: str, json: dict | None = None, probe: bool = True
    ) -> dict:
        url = f"/slurm/{self.api_version}/{path}"
        try:
            response = self._client.request(method, url, json=json)
        except httpx.TimeoutException as error:
            raise SlurmUnreachable(
                f"Could not {what}: slurmrestd at {self.base_url} did not answer in time ({error!r}). "
                "It may be overloaded or slurmctld slow; the request is retried.",
                permanent=False,
            ) from error
        except httpx.TransportError as error:
            raise SlurmUnreachable(
                f"Could not {what}: slurmrestd at {self.base_url} is unreachable ({error}). Check that "
                "slurmrestd runs and that this URL reaches it; the request is retried.",
                permanent=False,
            ) from error
        if response.status_code == 401:
            raise SlurmAuthError(
                f"Could not {what}: slurmrestd at {self.base_url} refused the request without a token it "
                f"accepts (401: {response.text.strip()[:200]}). Configure the Slurm user name and a JWT "
                "from `scontrol token`.",
                permanent=True,
                status=401,
            )
        if response.status_code == 404:
            raise SlurmError(
                f"Could not {what}: slurmrestd at {self.base_url} has no {url} (404). It may not serve API "
                f"{self.api_version}: compare `slurmrestd -s list` with the configured version.",
                permanent=True,
                status=404,
            )
        try:
            body = response.json()
        except ValueError:
            raise SlurmError(
                f"Could not {what}: slurmrestd at {self.base_url} answered {response.status_code} with a "
                f"body that is not JSON: {response.text.strip()[:200]!r}. Is this URL slurmrestd?",
                permanent=response.status_code < 500,
                status=response.status_code,
            ) from None
        if response.status_code >= 400:
            raise self._error_from(response.status_code, body, what, probe=probe)
        return body

    def _error_from(self, http_status: int, body: dict, what: str, *, probe: bool = True) -> SlurmError:
        errors = [error for error in body.get("errors") or [] if isinstance(error, dict)]
        codes = [error.get("error_number", error.get("error_code", error.get("errno"))) for error in errors]
        codes = [code for code in codes if isinstance(code, int)]
        text = "; ".join(
            " - ".join(str(part) for part in (error.get("error"), error.get("description")) if part)
            for error in errors
        ) or f"HTTP {http_status}"
        if http_status == 400:
            return SlurmRejected(
                f"Could not {what}: slurmrestd rejected the request ({text}). The job description has a "
                f"key or value API {self.api_version} does not take.",
                permanent=True,
                status=400,
            )
        if any(code in CONTROLLER_UNREACHABLE for code in codes):
            return self._controller_down(what, text)
        slurm_codes = [code for code in codes if code > 0 and code != ZERO_BYTES]
        if slurm_codes:
            code = slurm_codes[0]
            advice = {
                INVALID_PARTITION: "Set the partition to one that `sinfo` lists.",
                NODE_CONFIG_UNAVAILABLE: "No node of the partition can ever hold this request (e.g. more "
                "GPUs than a node has).",
                INVALID_JOB_ID: "Slurm does not know this job.",
            }.get(code, "Slurm refused the request; see its message.")
            return SlurmRejected(f"Could not {what}: {text}. {advice}", permanent=True, status=code)
        expiry = _jwt_expiry(self.token)
        if expiry is None:
            return self._bad_token(what, http_status, text, "it is not a JWT")
        if expiry <= time.time():
            when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(expiry))
            return self._bad_token(what, http_status, text, f"it expired at {when}")
        if ZERO_BYTES in codes:
            # slurmctld hangs up on a request whose token it does not accept.
            return self._bad_token(what, http_status, text, _NOT_ACCEPTED.format(user=self.user_name))
        if probe and -1 in codes:
            # Reads answer the same for a refused token and a dead slurmctld; a cancel of a job id that
            # cannot exist tells them apart (2017: the token is fine, 5005: refused, 1xxx: controller down).
            try:
                self._request("DELETE", f"job/{NEVER_A_JOB_ID}", what="check the token", probe=False)
            except SlurmBadToken:
                return self._bad_token(what, http_status, text, _NOT_ACCEPTED.format(user=self.user_name))
            except SlurmUnreachable:
                return self._controller_down(what, text)
            except SlurmError:
                pass
        return SlurmError(
            f"Could not {what}: slurmrestd answered {http_status} ({text}). The request is retried; if "
            "this persists, see slurmctld's and slurmrestd's logs.",
            permanent=False,
            status=http_status,
        )

    def _bad_token(self, what: str, http_status: int, text: str, reason: str) -> SlurmBadToken:
        return SlurmBadToken(
            f"Could not {what}: Slurm refused the token ({reason}; slurmrestd said {http_status}: {text}). "
            f"Make a new one with `scontrol token username={self.user_name} lifespan=<seconds>` and "
            "configure it.",
            permanent=True,
            status=http_status,
        )

    def _controller_down(self, what: str, text: str) -> "SlurmUnreachable":
        return SlurmUnreachable(
            f"Could not {what}: slurmrestd at {self.base_url} answers but cannot reach slurmctld ({text}). "
            "Check that slurmctld runs; the request is retried.",
            permanent=False,
        )


_NOT_ACCEPTED = "slurmctld did not accept it for user {user!r}: signed with another key, or for another user"


def _job(job: dict) -> Job:
    exit_code = _number(job.get("exit_code"))
    status = signal = None
    state = _state(job.get("job_state")).upper()
    if isinstance(exit_code, dict):  # v0.0.40+: {"status": [...], "return_code": {...}, "signal": {...}}
        status = _number(exit_code.get("return_code"))
        signal = _number((exit_code.get("signal") or {}).get("id"))
    elif isinstance(exit_code, int) and state in ENDED_STATES:
        # The raw wait status: high byte the exit status, low bits the signal.
        status, signal = exit_code >> 8, (exit_code & 0x7F) or None
    return Job(
        job_id=int(job["job_id"]),
        name=job.get("name") or "",
        state=state,
        reason=job.get("state_reason") or "",
        nodes=job.get("nodes") or "",
        gres_detail=list(job.get("gres_detail") or []),
        exit_code=status,
        signal=signal,
        submit_time=_time(job.get("submit_time")),
        start_time=_time(job.get("start_time")),
        # While a job runs, end_time is when its time limit will end it.
        end_time=_time(job.get("end_time")) if state in ENDED_STATES else None,
        partition=job.get("partition") or "",
        requeue=job.get("requeue"),
        restarts=_number(job.get("restart_cnt")) or 0,
    )
