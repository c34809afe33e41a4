"""Who may go where through the SSH gateway. Plain synchronous functions over the database; the asyncio
server (server.py) calls them in a thread.

A person is whoever holds the private half of a public key on an active account. The same public key
can sit on two accounts (a public key is public: anyone can paste someone else's), so a key never picks
one account: a connection may reach a running instance whose owner has that key on their account.
That is exactly what the instance's own sshd checks (its authorized_keys hold the owner's keys), so
pasting Alice's public key into Mallory's account lets Alice into Mallory's instances, never the reverse.
"""

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlparse

from django.conf import settings
from django.urls import reverse

from portal.accounts.models import SshKey
from portal.instances.models import Instance

# The port the client asks the gateway to reach: sshd's standard port, whatever the container uses.
SSH_PORT = 22
# Accepted ways to name an instance: its short id, its full id, or the container's hostname.
HOSTNAME_PREFIX = "devcloud-"
_HEX = re.compile(r"^[0-9a-f-]{8,36}$")
SHORT_ID_LENGTH = 8


class Refused(Exception):
    """The gateway will not forward this. `message` is what the person reads (a channel-open failure)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class Route:
    """Where an allowed connection goes: the instance's sshd as published on its host's private address."""

    instance_id: str
    short_id: str
    user_id: int
    key_fingerprint: str
    key_name: str
    address: str
    port: int


def gateway_command(target: str = "<instance>") -> str:
    """The exact command a person types, e.g. "ssh -J 127.0.0.1:2222 developer@1a2b3c4d"."""
    return f"ssh -J {settings.SSH_GATEWAY_HOST}:{settings.SSH_GATEWAY_PORT} developer@{target}"


def keys_with(fingerprint: str) -> list[SshKey]:
    """The account keys with this fingerprint on active accounts, not expired (usually one; see the
    module docstring)."""
    return list(
        SshKey.objects.trusted().filter(fingerprint=fingerprint, user__is_active=True).select_related("user")
    )


def key_is_known(fingerprint: str) -> bool:
    """Whether the gateway accepts this key at all: it is on at least one active account."""
    return SshKey.objects.trusted().filter(fingerprint=fingerprint, user__is_active=True).exists()


def _instance_id_prefix(target: str) -> str | None:
    """The lower-case id or id prefix that `target` names ("1a2b3c4d", "devcloud-1a2b3c4d", a full id), or
    None when it cannot name an instance.

    A short id made only of digits reaches the gateway as an IPv4 address: OpenSSH reads a hostname the
    way inet_aton does, so "63082398" arrives as "3.194.143.158" (decimal) and "01234567" as "0.5.57.119"
    (a leading zero reads as octal). Such an address is read back into the digits it came from; the two
    readings never overlap (eight decimal digits are at least 10**7, seven octal ones below 8**7).
    """
    name = target.strip().lower()
    name = name.removeprefix(HOSTNAME_PREFIX)
    if _HEX.match(name):
        return name
    try:
        number = int(ipaddress.IPv4Address(name))
    except ValueError:
        return None
    decimal, octal = str(number), format(number, "o")
    if len(decimal) == SHORT_ID_LENGTH:
        return decimal
    return octal.zfill(SHORT_ID_LENGTH) if len(octal) < SHORT_ID_LENGTH else None


def _running_list(users) -> str:
    running = Instance.objects.filter(user__in=users, state=Instance.State.RUNNING).order_by("created_at")
    names = [f"{instance.short_id} ({instance.size} {instance.image.name})" for instance in running]
    return ", ".join(names) if names else "none"


def route_for(*, fingerprint: str, target: str, port: int) -> Route:
    """Decide a direct-tcpip request (what `ssh -J` sends) from a client authenticated with `fingerprint`.

    Returns the Route to the instance's sshd. Raises Refused with the sentence the person reads: the key
    was removed since they connected, a port other than 22, an unknown name (another person's instance
    reads the same: the gateway does not say whose it is), a suspended owner, an instance that is not
    running, or one without SSH (the local driver, or an image from before SSH).
    """
    keys = keys_with(fingerprint)
    if not keys:
        raise Refused(
            "This key is no longer on any DevCloud account. Add it in Settings, then connect again."
        )
    users = [key.user for key in keys]
    if port != SSH_PORT:
        raise Refused(
            f"The gateway reaches only the SSH server of your instances (port {SSH_PORT}), not port {port}. "
            "To reach another port inside, forward it through the instance: "
            f"{gateway_command()} -L 8888:localhost:{port}"
        )
    prefix = _instance_id_prefix(target)
    matches = (
        list(
            Instance.objects.filter(user__in=users, id__startswith=prefix)
            .select_related("user", "image")
            .order_by("-created_at")[:2]
        )
        if prefix and len(prefix) >= SHORT_ID_LENGTH
        else []
    )
    if not matches:
        # The name as typed: digits that arrived as an address are shown as the digits.
        named = target if prefix is None or prefix in target.lower() else prefix
        raise Refused(
            f"You have no instance named {named!r}. Your running instances: {_running_list(users)}. "
            f"Connect with: {gateway_command()}"
        )
    if len(matches) > 1:
        raise Refused(f"{target!r} names more than one of your instances; use more of its id.")
    instance = matches[0]
    owner = instance.user
    if owner.is_suspended:
        raise Refused(owner.suspension_notice)
    if instance.state != Instance.State.RUNNING:
        raise Refused(
            f"Instance {instance.short_id} is {instance.get_state_display().lower()}, not running: "
            "SSH reaches running instances only. Launch a new one from the portal "
            "(your /workspace files are kept)."
        )
    state = instance.driver_state or {}
    ssh_port = state.get("ssh_port")
    address = urlparse(state.get("endpoint") or "").hostname
    if not ssh_port or not address:
        why = (
            "the local driver runs JupyterLab without a container, and SSH needs one"
            if instance.driver == "local"
            else "it was started from an image without SSH; launch a new one"
        )
        raise Refused(f"Instance {instance.short_id} has no SSH server: {why}.")
    key = next(key for key in keys if key.user_id == owner.pk)
    return Route(
        instance_id=str(instance.id),
        short_id=instance.short_id,
        user_id=owner.pk,
        key_fingerprint=fingerprint,
        key_name=key.name,
        address=address,
        port=int(ssh_port),
    )


def help_text(fingerprint: str) -> str:
    """What a shell on the gateway itself prints before it closes: how to reach an instance, and which."""
    keys = keys_with(fingerprint)
    users = [key.user for key in keys]
    lines = [
        f"This is the {settings.SITE_NAME} SSH gateway. It has no shell: it only forwards to the SSH server "
        "of your running instances.",
        "",
        f"  {gateway_command()}",
        "",
        "where <instance> is the short id shown on the Instances page. scp, sftp, rsync and ssh -L work "
        "the same way (add -J to each).",
    ]
    suspended = [user for user in users if user.is_suspended]
    if suspended and len(suspended) == len(users):
        lines += ["", suspended[0].suspension_notice]
    else:
        lines += ["", f"Your running instances: {_running_list(users)}"]
    lines += ["", f"Keys and the ~/.ssh/config block: {settings.SITE_URL}{reverse('accounts:settings')}", ""]
    return "\r\n".join(lines)
