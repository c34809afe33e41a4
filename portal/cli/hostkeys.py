"""The known_hosts files the CLI keeps, so OpenSSH checks host keys without ever asking.

- The gateway's key: GET /api/v1/ssh publishes it (over the portal's HTTPS, with the person's token).
  The first time, the CLI writes it to its own known_hosts file; after that the published key must
  equal the pinned one, or the CLI refuses (GatewayKeyChanged) until the person accepts the new one.
  OpenSSH then checks the gateway with StrictHostKeyChecking=yes against that file.
- The instances' keys: each instance makes a new host key when it starts and the portal does not learn
  it, so the hop past the gateway takes it on first use (accept-new) into a file of its own. Entries of
  instances that are no longer live are dropped whenever the CLI runs, so the file does not grow and a
  later instance with the same short id does not meet an old instance's key.
"""

import base64
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path


class GatewayKeyChanged(Exception):
    """The portal publishes a gateway key other than the one pinned for that gateway."""

    def __init__(self, *, pattern: str, pinned: list[str], published: list[str], path: Path):
        super().__init__(pattern)
        self.pattern = pattern
        self.pinned = pinned
        self.published = published
        self.path = path


@dataclass(frozen=True)
class Entry:
    """One known_hosts line: the host patterns it names and its key ("ssh-ed25519 AAAA…")."""

    hosts: tuple[str, ...]
    key: str
    line: str


def fingerprint(key: str) -> str:
    """The SHA256 fingerprint of "type base64-blob", as `ssh-keygen -l` prints it ("an unreadable key"
    for a line edited out of shape)."""
    try:
        digest = hashlib.sha256(base64.b64decode(key.split()[1], validate=True)).digest()
    except (ValueError, IndexError):
        return "an unreadable key"
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def parse(text: str) -> list[Entry]:
    """The plain entries of known_hosts text; comments, markers (@revoked, @cert-authority) and hashed
    names are not ours and are skipped."""
    entries = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 3 or fields[0].startswith(("#", "@", "|")):
            continue
        entries.append(Entry(hosts=tuple(fields[0].split(",")), key=f"{fields[1]} {fields[2]}", line=line))
    return entries


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def _write(path: Path, lines: list[str]) -> None:
    """Replace the file in one step (mode 0600, in a 0700 directory)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.new")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write("".join(f"{line}\n" for line in lines))
    os.replace(partial, path)


def pin_gateway_key(path: Path, published: str, *, accept_new: bool = False) -> str:
    """Check the gateway key the portal publishes (known_hosts lines) against the ones pinned in `path`.

    Returns "pinned" (first use: now written), "known" (the same as pinned) or "replaced" (different,
    and `accept_new`: the new key replaced the old). Raises GatewayKeyChanged when it differs and not
    `accept_new`, leaving the file as it was.
    """
    wanted = parse(published)
    existing = parse(_read(path))
    patterns = {host for entry in wanted for host in entry.hosts}
    published_keys = sorted({entry.key for entry in wanted})
    pinned_keys = sorted({entry.key for entry in existing if patterns & set(entry.hosts)})
    if pinned_keys == published_keys:
        return "known"
    if pinned_keys and not accept_new:
        raise GatewayKeyChanged(
            pattern=", ".join(sorted(patterns)), pinned=pinned_keys, published=published_keys, path=path
        )
    others = [entry.line for entry in existing if not patterns & set(entry.hosts)]
    _write(path, [*others, *(entry.line for entry in wanted)])
    return "replaced" if pinned_keys else "pinned"


def instance_alias(instance_id: str) -> str:
    """The name an instance's host key is kept under by `devcloud ssh`: its full id, never reused."""
    return f"devcloud-{instance_id}"


def prune_instance_keys(path: Path, live_instances: list[dict]) -> int:
    """Drop the entries of instances not in `live_instances` (rows with "id" and "short_id"): those kept
    by `devcloud ssh` (devcloud-<id>) and by the ssh-config block (devcloud-<short id>). Returns how many
    lines went."""
    text = _read(path)
    if not text:
        return 0
    live = {instance_alias(row["id"]) for row in live_instances}
    live |= {f"devcloud-{row['short_id']}" for row in live_instances}
    entries = parse(text)
    kept = [entry.line for entry in entries if set(entry.hosts) & live]
    if len(kept) != len(text.splitlines()):
        _write(path, kept)
    return len(text.splitlines()) - len(kept)
