"""The `devcloud` commands. Each one calls the API and prints a short summary, or JSON with --json."""

import contextlib
import functools
import json
import math
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import webbrowser
from datetime import UTC, datetime, timedelta
from pathlib import Path

import click

from . import ci_signin, config, hostkeys
from . import run as run_parts
from .client import AUTH, EXIT_CODES_HELP, REFUSED, USAGE, Api, ApiError

POLL_SECONDS = 2.0
FINAL_STATES = ("running", "stopped", "failed")


def _wants_json(ctx) -> bool:
    return bool(ctx.find_root().params.get("as_json") or (ctx.obj or {}).get("json"))


def json_option(command):
    """--json after the command too (`devcloud ls --json`), not only before it."""

    def remember(ctx, param, value):
        if value:
            ctx.ensure_object(dict)["json"] = True
            ctx.find_root().ensure_object(dict)["json"] = True
        return value

    return click.option(
        "--json",
        "as_json",
        is_flag=True,
        expose_value=False,
        callback=remember,
        help="Print JSON for scripts.",
    )(command)


def api(ctx, *, project: str | None = None) -> Api:
    """The API with the stored or environment's credentials. In a CI job without a token, a command for
    a `project` signs in with the CI provider's OpenID Connect token instead (portal/cli/ci_signin.py)."""
    credentials = config.load()
    url = (os.environ.get("DEVCLOUD_URL") or "").rstrip("/")
    if credentials is None and project and url and ci_signin.available():
        try:
            signed_in = ci_signin.sign_in(url, project)
        except ci_signin.SigninError as error:
            raise ApiError(str(error), exit_code=AUTH, as_json=_wants_json(ctx)) from None
        click.echo(
            f"Signed in to {url} for project {signed_in['project']} with the CI's token "
            f"(until {signed_in['expires_at'][:16].replace('T', ' ')} UTC).",
            err=True,
        )
        return Api(url, signed_in["token"], as_json=_wants_json(ctx))
    if credentials is None:
        raise ApiError(
            "Not logged in. Run `devcloud login` (or set DEVCLOUD_URL and DEVCLOUD_TOKEN; in CI, "
            "--project with the project trusting the repository signs in without a token).",
            exit_code=AUTH,
            as_json=_wants_json(ctx),
        )
    return Api(credentials.url, credentials.token, as_json=_wants_json(ctx))


def emit(ctx, data, text: str) -> None:
    click.echo(json.dumps(data, indent=2) if _wants_json(ctx) else text)


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    lines = [header, *rows]
    return "\n".join(
        "  ".join(str(cell).ljust(width) for cell, width in zip(line, widths)).rstrip() for line in lines
    )


@click.group(epilog=EXIT_CODES_HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--json", "as_json", is_flag=True, help="Print JSON for scripts (also accepted after the command)."
)
@click.pass_context
def cli(ctx, as_json):
    """DevCloud from the command line: credits, instances, SSH and logs.

    Log in once with a personal access token from Settings → API tokens:

        devcloud login --url https://devcloud.example.com

    Instances are named by their short id (the first 8 characters) or full id.
    """
    ctx.ensure_object(dict)["json"] = as_json


# --- Account ---------------------------------------------------------------------------------------


@cli.command()
@click.option("--url", help="The portal's address, e.g. https://devcloud.example.com.")
@click.option("--token", help="A personal access token (asked for, hidden, when left out).")
@json_option
@click.pass_context
def login(ctx, url, token):
    """Check a token against the portal and keep it in the config file (mode 0600)."""
    url = (
        (url or click.prompt("Portal URL", default=os.environ.get("DEVCLOUD_URL") or None))
        .strip()
        .rstrip("/")
    )
    token = (token or click.prompt("Token", hide_input=True)).strip()
    if not url.startswith(("http://", "https://")):
        raise click.UsageError(f"The URL must start with https:// or http://, not {url!r}.")
    me = Api(url, token, as_json=_wants_json(ctx)).get("/me")
    path = config.save(config.Credentials(url=url, token=token))
    scope = (me.get("token") or {}).get("scope", "")
    emit(
        ctx,
        {"url": url, "email": me["email"], "scope": scope, "config": str(path)},
        f"Logged in to {url} as {me['email']} ({scope} token). Saved in {path}.",
    )


@cli.command()
@json_option
@click.pass_context
def whoami(ctx):
    """Who the token belongs to, and what it may do."""
    me = api(ctx).get("/me")
    token = me.get("token") or {}
    lines = [f"{me['email']}" + ("" if me["email_verified"] else " (email not confirmed)")]
    if token:
        lines.append(f"token {token['name']!r}: {token['scope']}, expires {token['expires_at']}")
    if me["suspended"]:
        lines.append(me["suspension"])
    emit(ctx, me, "\n".join(lines))


@cli.command()
@json_option
@click.pass_context
def balance(ctx):
    """Your credit in GPU-hours, the sizes you may launch, and your limits."""
    me = api(ctx).get("/me")
    limits, entitlements = me["limits"], me["entitlements"]
    text = (
        f"{me['balance_gpu_hours']} GPU-hours\n"
        f"sizes you may launch: {', '.join(entitlements['sizes']) or 'none'} ({entitlements['tier']} tier)\n"
        f"live instances: {limits['live_instances']} of {limits['max_live_instances']}; "
        "a launch needs credit for "
        f"{limits['launch_min_credit_minutes']} minutes"
    )
    emit(
        ctx,
        {key: me[key] for key in ("balance_gpu_seconds", "balance_gpu_hours", "entitlements", "limits")},
        text,
    )


@cli.command()
@json_option
@click.pass_context
def images(ctx):
    """The images you can launch, and the sizes each runs on."""
    rows = api(ctx).get("/images")
    table = _table(
        [[row["key"], row["name"], ",".join(row["sizes"]), row["availability"]] for row in rows],
        ["IMAGE", "NAME", "SIZES", "AVAILABILITY"],
    )
    emit(ctx, rows, table)


# --- Instances -------------------------------------------------------------------------------------


def _summary(instance: dict) -> str:
    return f"{instance['short_id']}  {instance['state']:<12} {instance['size']:<3} {instance['image']}"


def _wait(ctx, client: Api, instance: dict, timeout: float) -> dict:
    """Poll until the instance runs, stops or fails, printing each launch step once (on stderr)."""
    seen, deadline = set(), time.monotonic() + timeout
    while True:
        for step in instance["steps"]:
            if step["status"] in ("done", "current") and step["step"] not in seen:
                seen.add(step["step"])
                click.echo(f"  {'✓' if step['status'] == 'done' else '…'} {step['label']}", err=True)
        if instance["state"] in FINAL_STATES:
            return instance
        if time.monotonic() > deadline:
            client.fail(
                f"Instance {instance['short_id']} is still {instance['state']} after {timeout:.0f} s.",
                REFUSED,
            )
        time.sleep(POLL_SECONDS)
        instance = client.get(f"/instances/{instance['id']}")


@cli.command()
@click.option("--size", required=True, help="A size key, e.g. 1x or 8x.")
@click.option("--image", required=True, help="An image key (see `devcloud images`), e.g. pytorch.")
@click.option("--wait", is_flag=True, help="Follow the launch steps until JupyterLab answers.")
@click.option("--timeout", default=900, show_default=True, help="Seconds --wait waits.")
@click.option("--project", help="Pay from this project's pool (its name in `devcloud projects`).")
@click.option("--reservation", help="Launch on this open booking (its id from `devcloud reservations`).")
@json_option
@click.pass_context
def launch(ctx, size, image, wait, timeout, project, reservation):
    """Launch an instance (retried requests launch once)."""
    client = api(ctx, project=project)
    booking = _resolve_booking(client, reservation)["id"] if reservation else None
    instance = client.launch(size=size, image=image, project=project, reservation=booking)
    paid_by = f" for {instance['project']}" if instance.get("project") else ""
    if not wait:
        emit(
            ctx,
            instance,
            f"Launched {instance['short_id']} ({instance['size']} {instance['image']}){paid_by}: "
            f"{instance['state']}.",
        )
        return
    click.echo(f"Launching {instance['short_id']} ({instance['size']} {instance['image']})…", err=True)
    instance = _wait(ctx, client, instance, timeout)
    if instance["state"] != "running":
        reason = instance["failure_reason"] or instance["stop_reason"] or instance["state"]
        client.fail(f"Instance {instance['short_id']} {instance['state']}: {reason}", REFUSED, instance)
    emit(
        ctx,
        instance,
        f"Instance {instance['short_id']} is running.\n"
        f"  JupyterLab: {instance['lab_url']}\n  SSH:        devcloud ssh {instance['short_id']}",
    )


@cli.command()
@json_option
@click.pass_context
def projects(ctx):
    """The projects you are in: your role and each shared pool's GPU-hours."""
    rows = api(ctx).get("/projects")
    table = _table(
        [[row["slug"], row["name"], row["role"], row["balance_gpu_hours"]] for row in rows],
        ["PROJECT", "NAME", "ROLE", "POOL GPU-HOURS"],
    )
    emit(ctx, rows, table if rows else "You are in no project. An owner of one can invite you.")


@cli.group()
def project():
    """A project's people: invite, list, change roles, remove, leave."""


def _member_id(client: Api, slug: str, email: str) -> int:
    """The user id of the project's member with `email` (owners see the members)."""
    members = client.get(f"/projects/{slug}").get("members")
    if members is None:
        client.fail(f"Only an owner of {slug} sees its members.", REFUSED)
    for member in members:
        if member["email"].lower() == email.strip().lower():
            return member["user_id"]
    client.fail(f"{email} is not a member of {slug}. `devcloud project members {slug}` lists them.", REFUSED)


@project.command("members")
@click.argument("slug")
@json_option
@click.pass_context
def project_members(ctx, slug):
    """SLUG's members and open invitations (owners only)."""
    client = api(ctx)
    detail = client.get(f"/projects/{slug}")
    if detail.get("members") is None:
        client.fail(f"Only an owner of {slug} sees its members.", REFUSED)
    invitations = client.get(f"/projects/{slug}/invitations")
    rows = [[m["email"], m["role"], m["joined_at"][:10]] for m in detail["members"]]
    rows += [[i["email"], f"{i['role']} (invited)", f"until {i['expires_at'][:10]}"] for i in invitations]
    emit(
        ctx,
        {"members": detail["members"], "invitations": invitations},
        _table(rows, ["EMAIL", "ROLE", "SINCE"]),
    )


@project.command("invite")
@click.argument("slug")
@click.argument("email")
@click.option("--owner", is_flag=True, help="Invite as an owner (default: a member).")
@json_option
@click.pass_context
def project_invite(ctx, slug, email, owner):
    """Invite EMAIL to SLUG; they accept from the email, signed in with that address."""
    role = "owner" if owner else "member"
    invitation = api(ctx).request(
        "POST", f"/projects/{slug}/invitations", json={"email": email, "role": role}
    )
    emit(
        ctx,
        invitation,
        f"Invited {invitation['email']} to {slug} as {role}. The invitation, sent by email, is open until "
        f"{invitation['expires_at'][:10]}.",
    )


@project.command("uninvite")
@click.argument("slug")
@click.argument("email")
@click.pass_context
def project_uninvite(ctx, slug, email):
    """Withdraw the open invitation of EMAIL to SLUG; its link stops working."""
    client = api(ctx)
    for invitation in client.get(f"/projects/{slug}/invitations"):
        if invitation["email"] == email.strip().lower():
            client.request("DELETE", f"/projects/{slug}/invitations/{invitation['id']}")
            click.echo(f"Withdrew the invitation of {invitation['email']} to {slug}.")
            return
    client.fail(f"{email} has no open invitation to {slug}.", REFUSED)


@project.command("role")
@click.argument("slug")
@click.argument("email")
@click.argument("role", type=click.Choice(["member", "owner"]))
@click.pass_context
def project_role(ctx, slug, email, role):
    """Make the member EMAIL of SLUG an owner or a member. A project always keeps an owner."""
    client = api(ctx)
    client.request(
        "PATCH", f"/projects/{slug}/members/{_member_id(client, slug, email)}", json={"role": role}
    )
    click.echo(f"{email} is now {'an owner' if role == 'owner' else 'a member'} of {slug}.")


@project.command("remove")
@click.argument("slug")
@click.argument("email")
@click.pass_context
def project_remove(ctx, slug, email):
    """Remove EMAIL from SLUG: the project instances they launched stop now; their own are left alone."""
    client = api(ctx)
    client.request("DELETE", f"/projects/{slug}/members/{_member_id(client, slug, email)}")
    click.echo(f"Removed {email} from {slug}; the project's instances they launched are stopping.")


# The longest expiry the portal takes for an SSH key (a week): a run's key expires with the run.
SSH_KEY_MAX_MINUTES = 7 * 24 * 60
# Beyond --timeout, the portal's own deadline for a run: late enough that the CLI stops the instance and
# says why first, soon enough that a run whose CLI was killed does not burn credit for long.
RUN_SERVER_GRACE_SECONDS = 60
# OpenSSH's exit code for a connection it could not make or lost (a remote command's own codes pass through).
SSH_FAILED = 255
# Exit code of a run stopped at its --timeout, as coreutils' `timeout` uses.
TIMED_OUT = 124


class _Interrupted(Exception):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise_interrupted(signum, frame):
    raise _Interrupted(signum)


@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--size", required=True, help="A size key, e.g. 1x or 8x.")
@click.option("--image", required=True, help="An image key (see `devcloud images`), e.g. pytorch.")
@click.option("--project", help="Pay from this project's pool (its slug, see `devcloud projects`).")
@click.option(
    "--key",
    default="",
    help="Launch once per key: a retry with the same key runs on the instance the first one launched. "
    "Default: from the CI provider's run id and attempt (GitHub Actions, GitLab CI), else a new one.",
)
@click.option(
    "--timeout",
    default="60m",
    show_default=True,
    help="The whole run's time limit (90s, 30m, 2h): then the instance is stopped, by the portal too if "
    "this command was killed.",
)
@click.option(
    "--sync",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help=f"Copy this directory (without .git) to {run_parts.SYNC_TARGET} first and run the command there.",
)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_context
def run(ctx, size, image, project, key, timeout, sync, command):
    """Run COMMAND on a new instance and exit with its exit code: launch, wait, run over SSH, stop.

    One argument after -- is a shell command line ('pytest -q && echo ok'); several are a program and
    its arguments. It runs in /workspace (or the --sync directory). The instance is stopped when the
    command ends, at --timeout (exit code 124), and on SIGTERM or Ctrl-C.
    """
    if command[:1] == ("--",):
        command = command[1:]
    if not command:
        raise click.UsageError("Name the command to run after --, e.g. devcloud run ... -- python3 train.py")
    try:
        limit = run_parts.parse_duration(timeout)
        archive = run_parts.sync_archive(sync) if sync else None
    except ValueError as error:
        raise click.UsageError(str(error)) from None
    started = time.monotonic()
    client = api(ctx, project=project)
    request = {"size": size, "image": image, "project": project, "command": list(command), "timeout": limit}
    request["sync"] = bool(sync)
    key = key or run_parts.ci_run_key(os.environ, request)
    with _run_key(client, seconds=limit + RUN_SERVER_GRACE_SECONDS) as identity:
        instance = client.launch(
            size=size,
            image=image,
            project=project,
            key=key,
            stop_after_seconds=limit + RUN_SERVER_GRACE_SECONDS,
        )
        if instance["state"] in ("stopped", "failed"):
            client.fail(
                f"The run with this key already launched {instance['short_id']}, which has {instance['state']}; "
                "nothing was launched. Give --key a new value to run again.",
                REFUSED,
            )
        say = functools.partial(click.echo, err=True)
        say(
            f"devcloud run: {instance['short_id']} ({instance['size']} {instance['image']}), time limit {timeout}."
        )
        previous = {
            signum: signal.signal(signum, _raise_interrupted) for signum in (signal.SIGTERM, signal.SIGHUP)
        }
        try:
            code = _run_on(
                ctx, client, instance, command, archive, identity=identity, deadline=started + limit
            )
        except _Interrupted as interrupted:
            say(f"devcloud run: {signal.Signals(interrupted.signum).name}: stopping {instance['short_id']}.")
            code = 128 + interrupted.signum
        except KeyboardInterrupt:
            say(f"devcloud run: interrupted: stopping {instance['short_id']}.")
            code = 128 + signal.SIGINT
        except subprocess.TimeoutExpired:
            say(f"devcloud run: the run passed its time limit of {timeout}: stopping {instance['short_id']}.")
            code = TIMED_OUT
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            _stop_quietly(client, instance)
    ctx.exit(code)


@contextlib.contextmanager
def _run_key(client: Api, *, seconds: int):
    """A key pair made for this run alone: added to the account (so the instance and the gateway take
    it) before the launch, removed from it afterwards. Yields the private key's path. The job needs no
    SSH key of its own, and nothing it could leak outlives the run: the portal stops trusting the key
    once `seconds` (the run's own limit) have passed, even if this process is killed before it can
    remove it."""
    program = shutil.which("ssh-keygen")
    if program is None:
        client.fail("OpenSSH's `ssh-keygen` is not installed (or not on PATH).", USAGE)
    directory = Path(tempfile.mkdtemp(prefix="devcloud-run-"))
    try:
        private = directory / "id_ed25519"
        name = f"devcloud run {time.strftime('%Y-%m-%d %H:%M:%S')} {secrets.token_hex(3)}"
        subprocess.run(
            [program, "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(private)],
            check=True,
            capture_output=True,
        )
        added = client.request(
            "POST",
            "/ssh-keys",
            json={
                "name": name,
                "public_key": private.with_suffix(".pub").read_text(),
                "expires_in_minutes": min(math.ceil(seconds / 60) + 1, SSH_KEY_MAX_MINUTES),
            },
        )
        try:
            yield private
        finally:
            try:
                client.request("DELETE", f"/ssh-keys/{added['id']}")
            except ApiError as error:
                click.echo(
                    f"devcloud run: could not remove the run's SSH key {name!r}: {error.message}", err=True
                )
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _run_on(
    ctx, client: Api, instance: dict, command, archive: bytes | None, *, identity: Path, deadline: float
) -> int:
    """Wait for the instance, send the --sync archive, run the command; returns its exit code. Raises
    subprocess.TimeoutExpired past `deadline` (time.monotonic())."""
    instance = _wait(ctx, client, instance, max(1.0, deadline - time.monotonic()))
    if instance["state"] != "running":
        reason = instance["failure_reason"] or instance["stop_reason"] or instance["state"]
        client.fail(f"Instance {instance['short_id']} {instance['state']}: {reason}", REFUSED, instance)
    options = ["-o", "BatchMode=yes", "-o", "ServerAliveInterval=15"]
    if archive is not None:
        sent = _ssh(
            _ssh_argv(client, instance, options, run_parts.SYNC_COMMAND, identity=identity),
            deadline=deadline,
            send=archive,
        )
        if sent != 0:
            client.fail(f"Could not copy --sync to {instance['short_id']} (ssh exited {sent}).", REFUSED)
    argv = _ssh_argv(
        client,
        instance,
        options,
        run_parts.remote_command(command, synced=archive is not None),
        identity=identity,
    )
    return _ssh(argv, deadline=deadline)


# What OpenSSH prints when a connection broke off in the greeting, before any key was offered or any
# command ran, so trying again cannot run anything twice. A host key that does not match is not one
# of these, and is never tried again.
SSH_GREETING_FAILURES = ("kex_exchange_identification:", "banner exchange:")
SSH_ATTEMPTS = 3


def _ssh(argv: list[str], *, deadline: float, send: bytes | None = None) -> int:
    """Run OpenSSH (its output streamed; `send` on its stdin, its stdout then discarded) and return its
    exit code, trying again, up to SSH_ATTEMPTS times, a connection that broke off in the greeting.
    Raises subprocess.TimeoutExpired past `deadline` (time.monotonic(); math.inf for none)."""
    for attempt in range(1, SSH_ATTEMPTS + 1):
        code, in_greeting = _ssh_attempt(argv, deadline=deadline, send=send)
        if code != SSH_FAILED or not in_greeting or attempt == SSH_ATTEMPTS:
            return code
        click.echo(
            f"devcloud: the SSH connection broke off before it began; trying again "
            f"({attempt + 1} of {SSH_ATTEMPTS}).",
            err=True,
        )
        time.sleep(1)
    return code


def _ssh_attempt(argv: list[str], *, deadline: float, send: bytes | None) -> tuple[int, bool]:
    """One OpenSSH run: (its exit code, whether it broke off in the greeting). Its stderr is passed on
    line by line as it comes, and read for SSH_GREETING_FAILURES."""
    in_greeting = threading.Event()
    with subprocess.Popen(
        argv,
        stdin=subprocess.PIPE if send is not None else None,
        stdout=subprocess.DEVNULL if send is not None else None,
        stderr=subprocess.PIPE,
    ) as process:

        def relay():
            for line in iter(process.stderr.readline, b""):
                text = line.decode(errors="replace")
                if text.startswith(SSH_GREETING_FAILURES):
                    in_greeting.set()
                sys.stderr.write(text)
                sys.stderr.flush()

        relayer = threading.Thread(target=relay, name="ssh-stderr", daemon=True)
        relayer.start()
        try:
            if send is not None:
                with contextlib.suppress(BrokenPipeError):
                    process.stdin.write(send)
                    process.stdin.close()
            code = process.wait(timeout=None if deadline == math.inf else max(1.0, deadline - time.monotonic()))
        except BaseException:
            process.terminate()
            raise
        relayer.join(timeout=5)
    return code, in_greeting.is_set()


def _stop_quietly(client: Api, instance: dict) -> None:
    """Stop the run's instance, whatever state it reached; says so on stderr. Never raises."""
    try:
        stopped = client.request("POST", f"/instances/{instance['id']}/stop")
    except ApiError as error:
        click.echo(f"devcloud run: could not stop {instance['short_id']}: {error.message}", err=True)
        return
    click.echo(f"devcloud run: {stopped['short_id']} is {stopped['state']}. Billing has stopped.", err=True)


@cli.command(name="ls")
@json_option
@click.pass_context
def list_instances(ctx):
    """Your live instances, then the latest ended ones."""
    rows = api(ctx).get("/instances")
    table = _table(
        [
            [
                row["short_id"],
                row["state"],
                row["size"],
                row["image"],
                row.get("project") or "you",
                row["created_at"][:16].replace("T", " "),
                _starts(row),
                _time_left(row.get("session_ends_at")),
            ]
            for row in rows
        ],
        ["ID", "STATE", "SIZE", "IMAGE", "PAID BY", "CREATED (UTC)", "STARTS", "TIME LEFT"],
    )
    # A waiting launch's basis is a sentence; it goes under the table, one line per queued instance.
    waiting = [
        f"{row['short_id']}: {row['estimated_start_basis']}"
        for row in rows
        if row.get("estimated_start_basis")
    ]
    text = table + ("\n\n" + "\n".join(waiting) if waiting else "")
    emit(ctx, rows, text if rows else "No instances. Launch one: devcloud launch --size 1x --image <image>")


def _starts(row: dict, now: datetime | None = None) -> str:
    """A queued launch's place and estimated start, as "#3 ~40m" ("#3 ?" with no estimate); "-" otherwise."""
    if not row.get("queue_position"):
        return "-"
    at = row.get("estimated_start_at")
    if not at:
        return f"#{row['queue_position']} ?"
    minutes = max(int((datetime.fromisoformat(at) - (now or datetime.now(UTC))).total_seconds() // 60), 0)
    wait = f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m"
    return f"#{row['queue_position']} ~{wait}"


def _time_left(session_ends_at: str | None, now: datetime | None = None) -> str:
    """Until the portal stops it, as "2h05m" or "12m"; "-" when nothing will."""
    if not session_ends_at:
        return "-"
    ends = datetime.fromisoformat(session_ends_at)
    minutes = max(int((ends - (now or datetime.now(UTC))).total_seconds() // 60), 0)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m"


@cli.command()
@click.argument("instance")
@click.option("--hours", type=click.IntRange(min=1), required=True, help="Hours to add to the session.")
@json_option
@click.pass_context
def extend(ctx, instance, hours):
    """Add hours to a running instance's session before its time limit stops it (while credit covers them)."""
    client = api(ctx)
    target = client.resolve(instance)
    extended = client.request("POST", f"/instances/{target['id']}/extend", json={"hours": hours})
    ends = extended.get("session_ends_at")
    emit(
        ctx,
        extended,
        f"{extended['short_id']} extended by {hours} hour{'s' if hours != 1 else ''}; "
        + (f"it now stops at {ends[:16].replace('T', ' ')} UTC." if ends else "nothing stops it now."),
    )


@cli.command()
@click.argument("instance")
@json_option
@click.pass_context
def stop(ctx, instance):
    """Stop an instance. Billing stops at once; /workspace is kept."""
    client = api(ctx)
    target = client.resolve(instance)
    stopped = client.request("POST", f"/instances/{target['id']}/stop")
    emit(ctx, stopped, f"{stopped['short_id']} is {stopped['state']}. Billing has stopped.")


@cli.command()
@click.argument("instance")
@click.option("--lines", default=100, show_default=True, help="How many of the last lines.")
@json_option
@click.pass_context
def logs(ctx, instance, lines):
    """The last lines an instance printed (its secret token hidden)."""
    client = api(ctx)
    target = client.resolve(instance)
    body = client.get(f"/instances/{target['id']}/logs", params={"lines": lines})
    emit(ctx, body, "\n".join(body["lines"]) if body["lines"] else body["note"])


@cli.command(name="open")
@click.argument("instance")
@click.option("--browser", is_flag=True, help="Open the link in a web browser instead of printing it.")
@json_option
@click.pass_context
def open_lab(ctx, instance, browser):
    """Print (or open) the JupyterLab link of a running instance; the browser must be logged in to the
    portal."""
    client = api(ctx)
    target = client.resolve(instance)
    if not target["lab_url"]:
        client.fail(
            f"Instance {target['short_id']} is {target['state']}, not running: it has no JupyterLab.", REFUSED
        )
    if browser:
        webbrowser.open(target["lab_url"])
    emit(ctx, {"id": target["id"], "lab_url": target["lab_url"]}, target["lab_url"])


# --- Exposed ports ---------------------------------------------------------------------------------


@cli.command()
@click.argument("instance")
@click.argument("port", type=int)
@json_option
@click.pass_context
def expose(ctx, instance, port):
    """Open PORT of a running instance at its own address, for you alone until you share it
    (devcloud share). Your app must listen on 0.0.0.0 at that port."""
    client = api(ctx)
    target = client.resolve(instance)
    exposed = client.request("POST", f"/instances/{target['id']}/ports", json={"port": port})
    emit(ctx, exposed, f"Port {exposed['port']} of {target['short_id']} is at {exposed['url']}")


@cli.command()
@click.argument("instance")
@json_option
@click.pass_context
def ports(ctx, instance):
    """List an instance's exposed ports and their addresses."""
    client = api(ctx)
    target = client.resolve(instance)
    rows = client.get(f"/instances/{target['id']}/ports")
    table = _table([[str(row["port"]), row["url"]] for row in rows], ["PORT", "URL"])
    emit(
        ctx,
        rows,
        table if rows else f"No exposed ports. Expose one: devcloud expose {target['short_id']} 8000",
    )


@cli.command()
@click.argument("instance")
@click.argument("port", type=int)
@json_option
@click.pass_context
def unexpose(ctx, instance, port):
    """Close an exposed port: its address and share links stop working at once."""
    client = api(ctx)
    target = client.resolve(instance)
    client.request("DELETE", f"/instances/{target['id']}/ports/{port}")
    emit(
        ctx,
        {"id": target["id"], "port": port, "closed": True},
        f"Port {port} of {target['short_id']} is closed.",
    )


@cli.command()
@click.argument("instance")
@click.argument("port", type=int)
@click.option(
    "--hours", type=click.IntRange(1, 720), default=24, show_default=True, help="How long it works."
)
@click.option(
    "--email", default="", help="Only this DevCloud account may use it (default: anyone with the link)."
)
@json_option
@click.pass_context
def share(ctx, instance, port, hours, email):
    """Make a link to an exposed PORT for anyone holding it (or only --email's account). Shown once."""
    client = api(ctx)
    target = client.resolve(instance)
    link = client.request(
        "POST", f"/instances/{target['id']}/ports/{port}/shares", json={"hours": hours, "email": email}
    )
    who = link["email"] or "anyone with the link"
    emit(
        ctx,
        link,
        f"{link['url']}\nFor {who}, until {link['expires_at'][:16].replace('T', ' ')} UTC (id {link['id']}).",
    )


@cli.command()
@click.argument("instance")
@click.argument("port", type=int)
@json_option
@click.pass_context
def shares(ctx, instance, port):
    """List the share links of an exposed port."""
    client = api(ctx)
    target = client.resolve(instance)
    rows = client.get(f"/instances/{target['id']}/ports/{port}/shares")
    table = _table(
        [
            [
                str(row["id"]),
                row["prefix"] + "…",
                row["email"] or "anyone",
                row["expires_at"][:16].replace("T", " "),
                "active" if row["active"] else ("revoked" if row["revoked_at"] else "expired"),
            ]
            for row in rows
        ],
        ["ID", "LINK", "FOR", "EXPIRES (UTC)", "STATE"],
    )
    emit(ctx, rows, table if rows else "No share links.")


@cli.command()
@click.argument("instance")
@click.argument("port", type=int)
@click.argument("share_id", type=int)
@json_option
@click.pass_context
def unshare(ctx, instance, port, share_id):
    """Revoke a share link (its id from devcloud shares): it stops working at once."""
    client = api(ctx)
    target = client.resolve(instance)
    client.request("DELETE", f"/instances/{target['id']}/ports/{port}/shares/{share_id}")
    emit(ctx, {"id": share_id, "revoked": True}, f"Share link {share_id} is revoked.")


# --- SSH -------------------------------------------------------------------------------------------

LIVE_STATES = ("queued", "provisioning", "running", "stopping")


def _ssh_access(client: Api, *, accept_new_gateway_key: bool = False) -> dict:
    """GET /ssh, with the gateway's published host key checked against the one pinned in the CLI's
    known_hosts (written there on first use). Refuses (exit 1) when the portal has no key to publish or
    publishes another one than was pinned."""
    access = client.get("/ssh")
    if not access.get("host_key"):
        client.fail(
            "The portal publishes no host key for its SSH gateway, so the gateway cannot be checked: "
            f"{access.get('host_key_note') or 'ask the operators.'}",
            REFUSED,
        )
    path = config.gateway_known_hosts_path()
    try:
        outcome = hostkeys.pin_gateway_key(path, access["host_key"], accept_new=accept_new_gateway_key)
    except hostkeys.GatewayKeyChanged as changed:
        pinned = ", ".join(hostkeys.fingerprint(key) for key in changed.pinned)
        client.fail(
            f"The SSH gateway's host key has changed: {client.url} now publishes "
            f"{access['host_key_fingerprint']} for {changed.pattern}, but this computer pinned {pinned} "
            f"(in {path}). Not connecting. If your operators announced a new gateway key with that "
            "fingerprint, run `devcloud ssh-config --accept-new-gateway-key`; otherwise do not connect, "
            "and tell them.",
            REFUSED,
        )
    if outcome != "known":
        what = "Pinned" if outcome == "pinned" else "Replaced the pinned key with"
        click.echo(
            f"{what} the SSH gateway's host key {access['host_key_fingerprint']} (in {path}).", err=True
        )
    return {**access, "known_hosts_file": str(path)}


def _prune_instance_keys(client: Api) -> None:
    live = [row for row in client.get("/instances") if row["state"] in LIVE_STATES]
    hostkeys.prune_instance_keys(config.instance_known_hosts_path(), live)


def _ssh_path(path) -> str:
    """A file name for an OpenSSH option: `%` doubled (it starts a token), quoted (it may hold spaces)."""
    return '"' + str(path).replace("%", "%%") + '"'


def _has_terminal() -> bool:
    """Whether this process has a controlling terminal, where OpenSSH could ask for a passphrase."""
    try:
        os.close(os.open("/dev/tty", os.O_RDWR))
    except OSError:
        return False
    return True


def _split_command(args: list[str]) -> tuple[list[str], list[str]]:
    """(ssh options, the command) from what follows the instance: the command is what follows `--`."""
    if args[:1] == ["--"]:
        return [], args[1:]
    if "--" in args:
        index = args.index("--")
        return args[:index], args[index + 1 :]
    return args, []


def _config_file(options: list[str]) -> str | None:
    """The -F file among the ssh options, which OpenSSH's own -J hands to the jump too."""
    for index, arg in enumerate(options):
        if arg == "-F" and index + 1 < len(options):
            return options[index + 1]
        if arg.startswith("-F") and len(arg) > 2:
            return arg[2:]
    return None


def _identity_options(identity: Path | None) -> list[str]:
    """ssh options that offer only `identity`'s key (none: whatever ssh would offer)."""
    if identity is None:
        return []
    return ["-i", str(identity), "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none"]


def _gateway_hop(
    program: str, access: dict, *, batch: bool, config_file: str | None, identity: Path | None = None
) -> str:
    """The ProxyCommand that reaches the instance through the gateway, with the gateway's key checked
    strictly against the pinned file. Options given to ssh on its command line do not reach the jump
    connection -J makes, so the CLI spells that connection out itself."""
    command = [program]
    if config_file:
        command += ["-F", config_file]
    command += [
        "-o",
        f"UserKnownHostsFile={_ssh_path(access['known_hosts_file'])}",
        "-o",
        "StrictHostKeyChecking=yes",
    ]
    if batch:
        command += ["-o", "BatchMode=yes"]
    command += _identity_options(identity)
    command += ["-p", str(access["gateway_port"]), "-W", "[%h]:%p", "--", access["gateway_host"]]
    quoted = [shlex.quote(part) for part in command]
    # %h and %p are OpenSSH's (the instance's name and port); any other % is literal.
    return " ".join(part if part == "'[%h]:%p'" else part.replace("%", "%%") for part in quoted)


def _ssh_argv(
    client: Api, target: dict, options: list[str], command_line: str = "", *, identity: Path | None = None
) -> list[str]:
    """The OpenSSH command line, full path first, for `target` through the gateway: the gateway's key
    checked strictly against the pinned one; the instance's new key taken on first use (the portal does
    not know it), kept under the instance's full id and never reused; never a question without a
    terminal (BatchMode). `options` go to ssh, `command_line` (if any) is what the instance runs.
    `identity`, a private key file, is the only key offered, on both hops."""
    access = _ssh_access(client)
    _prune_instance_keys(client)
    program = shutil.which("ssh")
    if program is None:
        client.fail("OpenSSH's `ssh` is not installed (or not on PATH).", USAGE)
    batch = not _has_terminal()
    return [
        program,
        "-o",
        f"ProxyCommand={_gateway_hop(program, access, batch=batch, config_file=_config_file(options), identity=identity)}",
        "-o",
        f"UserKnownHostsFile={_ssh_path(config.instance_known_hosts_path())}",
        "-o",
        f"HostKeyAlias={hostkeys.instance_alias(target['id'])}",
        "-o",
        "StrictHostKeyChecking=accept-new",
        "-o",
        "HashKnownHosts=no",
        "-o",
        "CheckHostIP=no",
        *(["-o", "BatchMode=yes"] if batch else []),
        *_identity_options(identity),
        f"{access['user']}@{target['short_id']}",
        *options,
        *(["--", command_line] if command_line else []),
    ]


@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("instance")
@click.argument("ssh_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def ssh(ctx, instance, ssh_args):
    """Open a shell in an instance with OpenSSH, through the portal's gateway.

    Runs `ssh developer@<short id> [SSH_ARGS]` through the gateway, whose host key is checked against
    the one the portal publishes; anything after the instance goes to ssh, e.g.
    `devcloud ssh 1a2b3c4d -L 8000:localhost:8000` or `devcloud ssh 1a2b3c4d -- amd-smi`. After `--`,
    one argument is a shell command line; several are a program and its arguments, each kept whole
    (`-- python3 -c 'print(6 * 7)'`). The command's exit code is devcloud's, and a connection that broke
    off in the greeting, before the command could run, is tried again (up to SSH_ATTEMPTS times in all).
    Without a terminal it never asks anything (BatchMode): keys come from the agent or files without a
    passphrase.
    """
    client = api(ctx)
    target = client.resolve(instance)
    if target["state"] != "running":
        client.fail(f"Instance {target['short_id']} is {target['state']}, not running.", REFUSED)
    options, command = _split_command(list(ssh_args))
    argv = _ssh_argv(client, target, options, run_parts.command_line(command) if command else "")
    sys.stdout.flush()
    sys.stderr.flush()
    if command:
        ctx.exit(_ssh(argv, deadline=math.inf))
    os.execv(argv[0], argv)


@cli.command(name="ssh-config")
@click.option(
    "--accept-new-gateway-key",
    is_flag=True,
    help="Pin the gateway host key the portal now publishes in place of the one pinned before (only when "
    "your operators announced a new key).",
)
@json_option
@click.pass_context
def ssh_config(ctx, accept_new_gateway_key):
    """Print an ~/.ssh/config block, so that plain `ssh devcloud-<short id>` (and scp, rsync, VS Code)
    work, checking the gateway's host key against the one the portal publishes."""
    client = api(ctx)
    access = _ssh_access(client, accept_new_gateway_key=accept_new_gateway_key)
    _prune_instance_keys(client)
    block = (
        "Host devcloud-gateway\n"
        f"    HostName {access['gateway_host']}\n"
        f"    Port {access['gateway_port']}\n"
        f"    UserKnownHostsFile {_ssh_path(access['known_hosts_file'])}\n"
        "    StrictHostKeyChecking yes\n"
        "\n"
        "Host devcloud-* !devcloud-gateway\n"
        f"    User {access['user']}\n"
        "    ProxyJump devcloud-gateway\n"
        f"    UserKnownHostsFile {_ssh_path(config.instance_known_hosts_path())}\n"
        "    StrictHostKeyChecking accept-new\n"
        "    HashKnownHosts no\n"
        "    CheckHostIP no\n"
    )
    emit(ctx, {**access, "config": block}, block.rstrip("\n"))


# --- Reservations ----------------------------------------------------------------------------------


def _utc(text: str) -> datetime:
    """A date and time typed as ISO 8601 (2026-12-10T09:00, or with a space); UTC unless it says."""
    try:
        moment = datetime.fromisoformat(text.strip().replace(" ", "T"))
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a date and time like 2026-12-10T09:00 (UTC).") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _resolve_booking(client: Api, name: str) -> dict:
    """The caller's booking named by a full id or a prefix of it (the 8-character short id)."""
    wanted = name.strip().lower()
    matches = [row for row in client.get("/reservations") if row["id"].startswith(wanted)] if wanted else []
    if len(matches) != 1:
        client.fail(
            f"{name!r} names {'none' if not matches else 'more than one'} of your bookings. "
            "`devcloud reservations` lists them.",
            REFUSED,
        )
    return matches[0]


def _window(row: dict) -> str:
    return f"{row['starts_at'][:16].replace('T', ' ')} to {row['ends_at'][:16].replace('T', ' ')}"


@cli.command()
@click.option(
    "--gpus", type=click.IntRange(1, 8), default=8, show_default=True, help="GPUs; 8 is a whole host."
)
@click.option("--start", "start", required=True, help="When the window starts, e.g. 2026-12-10T09:00 (UTC).")
@click.option("--end", "end", help="When it ends (UTC); or give --hours.")
@click.option("--hours", type=click.FloatRange(min=0.25), help="How long it lasts, instead of --end.")
@click.option("--project", help="Pay from this project's pool (you must be an owner).")
@json_option
@click.pass_context
def reserve(ctx, gpus, start, end, hours, project):
    """Book GPUs of one host for a time window. Its credit is held until the window ends."""
    if (end is None) == (hours is None):
        raise click.UsageError("Give the window's end with --end or its length with --hours (one of them).")
    starts_at = _utc(start)
    ends_at = _utc(end) if end else starts_at + timedelta(hours=hours)
    body = {"gpus": gpus, "starts_at": starts_at.isoformat(), "ends_at": ends_at.isoformat()}
    if project:
        body["project"] = project
    booked = api(ctx).request("POST", "/reservations", json=body)
    emit(
        ctx,
        booked,
        f"Booked {booked['gpus']} GPU{'s' if booked['gpus'] != 1 else ''} on {booked['host']}, "
        f"{_window(booked)} UTC ({booked['short_id']}). Inside the window: "
        f"devcloud launch --size {'8x' if booked['gpus'] == 8 else '1x'} --image <image>",
    )


@cli.group(invoke_without_command=True)
@json_option
@click.pass_context
def reservations(ctx):
    """Your bookings, and when a whole host is next free. `reservations cancel ID` cancels one."""
    if ctx.invoked_subcommand is not None:
        return
    client = api(ctx)
    rows = client.get("/reservations")
    free = client.get("/reservations/availability", params={"gpus": 8, "hours": 1})
    table = _table(
        [
            [
                row["short_id"],
                _window(row),
                str(row["gpus"]),
                row["host"],
                row["project"] or "you",
                row["state"],
            ]
            for row in rows
        ],
        ["ID", "WINDOW (UTC)", "GPUS", "HOST", "PAID BY", "STATE"],
    )
    hint = (
        f"A whole host is next free for an hour from {free['free_from'][:16].replace('T', ' ')} UTC."
        if free.get("free_from")
        else "No whole host is free for an hour within the booking horizon."
    )
    emit(
        ctx,
        rows,
        (table + "\n" if rows else "No bookings. Book: devcloud reserve --start ... --hours 2\n") + hint,
    )


@reservations.command(name="cancel")
@click.argument("reservation")
@json_option
@click.pass_context
def reservations_cancel(ctx, reservation):
    """Cancel one of your bookings before its window opens; its held credit is free again."""
    client = api(ctx)
    booking = _resolve_booking(client, reservation)
    cancelled = client.request("DELETE", f"/reservations/{booking['id']}")
    emit(
        ctx, cancelled, f"Cancelled {cancelled['short_id']} ({_window(cancelled)} UTC). Nothing was charged."
    )


# --- SSH keys --------------------------------------------------------------------------------------


@cli.group()
def keys():
    """Your SSH public keys (the ones the gateway and your instances accept)."""


@keys.command(name="add")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--name", help="A name for the key (default: the file's name).")
@json_option
@click.pass_context
def keys_add(ctx, file, name):
    """Add the public key in FILE, e.g. ~/.ssh/id_ed25519.pub."""
    key = api(ctx).request(
        "POST",
        "/ssh-keys",
        json={"name": name or file.name.removesuffix(".pub"), "public_key": file.read_text()},
    )
    emit(ctx, key, f"Added {key['name']!r}: {key['fingerprint']}")


@keys.command(name="ls")
@json_option
@click.pass_context
def keys_ls(ctx):
    """List your SSH keys."""
    rows = api(ctx).get("/ssh-keys")
    table = _table(
        [[str(row["id"]), row["name"], row["key_type"], row["fingerprint"]] for row in rows],
        ["ID", "NAME", "TYPE", "FINGERPRINT"],
    )
    emit(ctx, rows, table if rows else "No SSH keys. Add one: devcloud keys add ~/.ssh/id_ed25519.pub")


def main():
    """The console script: click's own handling, whose usage errors exit with 2."""
    cli(prog_name="devcloud")
