"""The `devcloud` commands. Each one calls the API and prints a short summary, or JSON with --json."""

import json
import os
import shutil
import sys
import time
import webbrowser
from pathlib import Path

import click

from . import config
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


def api(ctx) -> Api:
    credentials = config.load()
    if credentials is None:
        raise ApiError(
            "Not logged in. Run `devcloud login` (or set DEVCLOUD_URL and DEVCLOUD_TOKEN).",
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
@json_option
@click.pass_context
def launch(ctx, size, image, wait, timeout):
    """Launch an instance (retried requests launch once)."""
    client = api(ctx)
    instance = client.launch(size=size, image=image)
    if not wait:
        emit(
            ctx,
            instance,
            f"Launched {instance['short_id']} ({instance['size']} {instance['image']}): {instance['state']}.",
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
                row["created_at"][:16].replace("T", " "),
            ]
            for row in rows
        ],
        ["ID", "STATE", "SIZE", "IMAGE", "CREATED (UTC)"],
    )
    emit(ctx, rows, table if rows else "No instances. Launch one: devcloud launch --size 1x --image <image>")


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


# --- SSH -------------------------------------------------------------------------------------------


def _ssh_access(client: Api) -> dict:
    return client.get("/ssh")


@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("instance")
@click.argument("ssh_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def ssh(ctx, instance, ssh_args):
    """Open a shell in an instance with OpenSSH, through the portal's gateway.

    Runs `ssh -J <gateway> developer@<short id> [SSH_ARGS]`; anything after the instance goes to ssh,
    e.g. `devcloud ssh 1a2b3c4d -L 8000:localhost:8000` or `devcloud ssh 1a2b3c4d -- nvidia-smi`.
    """
    client = api(ctx)
    target = client.resolve(instance)
    if target["state"] != "running":
        client.fail(f"Instance {target['short_id']} is {target['state']}, not running.", REFUSED)
    access = _ssh_access(client)
    program = shutil.which("ssh")
    if program is None:
        client.fail("OpenSSH's `ssh` is not installed (or not on PATH).", USAGE)
    args = list(ssh_args)
    if args[:1] == ["--"]:
        args = args[1:]
    argv = [
        "ssh",
        "-J",
        access["proxy_jump"],
        # Every instance makes a new host key at start: trust it on first use, through the gateway.
        "-o",
        "StrictHostKeyChecking=accept-new",
        f"{access['user']}@{target['short_id']}",
        *args,
    ]
    sys.stdout.flush()
    os.execv(program, argv)


@cli.command(name="ssh-config")
@json_option
@click.pass_context
def ssh_config(ctx):
    """Print an ~/.ssh/config block, so that plain `ssh devcloud-<short id>` (and scp, rsync, VS Code)
    work."""
    access = _ssh_access(api(ctx))
    block = (
        "Host devcloud-gateway\n"
        f"    HostName {access['gateway_host']}\n"
        f"    Port {access['gateway_port']}\n"
        "\n"
        "Host devcloud-* !devcloud-gateway\n"
        f"    User {access['user']}\n"
        "    ProxyJump devcloud-gateway\n"
        "    StrictHostKeyChecking accept-new\n"
    )
    emit(ctx, {**access, "config": block}, block.rstrip("\n"))


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
