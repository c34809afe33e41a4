"""The gateway's host key as clients check it: its public half, in known_hosts form, and its fingerprint.

The gateway writes `<SSH_GATEWAY_HOST_KEY>.pub` next to its private key whenever it starts, so the web
process reads only that public file and never needs the private key to be readable. A deployment that
has no `.pub` yet (a key made before the gateway wrote one) gets the public key derived from the private
one, when that is readable.
"""

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import asyncssh

logger = logging.getLogger(__name__)

NOT_STARTED = (
    "The SSH gateway has no host key yet: the operator has not started it. SSH through the gateway works "
    "once it runs."
)
UNREADABLE = (
    "The portal cannot read the SSH gateway's host key (SSH_GATEWAY_HOST_KEY and its .pub file); tell "
    "the operator."
)


@dataclass(frozen=True)
class PublishedKey:
    """The gateway's host key as clients should pin it.

    `known_hosts` holds one known_hosts line per key, `[host]:port ssh-ed25519 AAAA…` (just `host` on
    port 22); `fingerprint` is the SHA256 fingerprint as `ssh-keygen -l` prints it. When the key cannot
    be read both are "" and `note` says why.
    """

    known_hosts: str = ""
    fingerprint: str = ""
    note: str = ""

    @property
    def available(self) -> bool:
        return bool(self.known_hosts)


def public_path(private_path: str | Path) -> Path:
    private_path = Path(private_path)
    return private_path.with_name(private_path.name + ".pub")


def known_hosts_pattern(host: str, port: int) -> str:
    """How OpenSSH names host:port in known_hosts: the bare host on port 22, `[host]:port` otherwise."""
    return host if port == 22 else f"[{host}]:{port}"


def write_public(key: asyncssh.SSHKey, private_path: str | Path) -> Path:
    """Write the public half of `key` to `<private_path>.pub` (mode 0644), replacing it in one step so a
    reader never sees half a file. Returns its path."""
    path = public_path(private_path)
    partial = path.with_name(f"{path.name}.{os.getpid()}.new")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    with os.fdopen(fd, "wb") as handle:
        handle.write(key.convert_to_public().export_public_key("openssh"))
    os.replace(partial, path)
    return path


def _read_public(private_path: Path) -> asyncssh.SSHKey | None:
    """The public key from the .pub file, else derived from the private key; None when neither exists.
    Raises OSError or asyncssh.KeyImportError when a file exists but cannot be read."""
    pub = public_path(private_path)
    if pub.exists():
        return asyncssh.read_public_key(str(pub))
    if private_path.exists():
        return asyncssh.read_private_key(str(private_path)).convert_to_public()
    return None


def published_key(*, private_path: str | Path, host: str, port: int) -> PublishedKey:
    """The gateway's host key for clients reaching it at host:port. Never raises: a key that does not
    exist yet or cannot be read gives a PublishedKey with only `note`."""
    try:
        key = _read_public(Path(private_path))
    except (OSError, asyncssh.KeyImportError, ValueError):
        logger.warning("Could not read the SSH gateway host key at %s", private_path, exc_info=True)
        return PublishedKey(note=UNREADABLE)
    if key is None:
        return PublishedKey(note=NOT_STARTED)
    blob = key.export_public_key("openssh").decode().split()[:2]
    return PublishedKey(
        known_hosts=f"{known_hosts_pattern(host, port)} {' '.join(blob)}",
        fingerprint=key.get_fingerprint("sha256"),
    )
