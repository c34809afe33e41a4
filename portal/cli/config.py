"""Where `devcloud login` keeps the portal URL and token: $XDG_CONFIG_HOME/devcloud/config.toml (by default
~/.config/devcloud/config.toml), readable by its owner only (mode 0600, in a 0700 directory).

DEVCLOUD_URL and DEVCLOUD_TOKEN in the environment win over the file, for CI jobs that keep the token
in a secret store.

The same directory holds the SSH host keys `devcloud ssh` and `ssh-config` check: the gateway's, pinned
from the API (`known_hosts`), and the instances' (`instances_known_hosts`; see hostkeys.py).
"""

import json
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Credentials:
    url: str
    token: str


def config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "devcloud"


def config_path() -> Path:
    return config_dir() / "config.toml"


def gateway_known_hosts_path() -> Path:
    """The known_hosts file holding the gateway's host key as first read from the API."""
    return config_dir() / "known_hosts"


def instance_known_hosts_path() -> Path:
    """The known_hosts file holding the host keys of the instances themselves (the hop past the gateway)."""
    return config_dir() / "instances_known_hosts"


def load() -> Credentials | None:
    """The credentials from the environment or the file; None when neither has both a URL and a token."""
    stored = {}
    path = config_path()
    if path.exists():
        with path.open("rb") as file:
            stored = tomllib.load(file)
    url = os.environ.get("DEVCLOUD_URL") or stored.get("url", "")
    token = os.environ.get("DEVCLOUD_TOKEN") or stored.get("token", "")
    if not url or not token:
        return None
    return Credentials(url=url.rstrip("/"), token=token)


def save(credentials: Credentials) -> Path:
    """Write the file with mode 0600 from the first byte (never world-readable, even for a moment).
    Returns its path."""
    path = config_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    # JSON strings are valid TOML basic strings (same escapes), so json.dumps quotes safely.
    text = f"url = {json.dumps(credentials.url)}\ntoken = {json.dumps(credentials.token)}\n"
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(descriptor, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(text)
    return path
