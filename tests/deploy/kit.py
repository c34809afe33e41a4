"""Read the deploy kit (deploy/) the way systemd and nginx do, so tests run exactly what it ships.

Only what must differ on a test machine is changed, and each change is listed here: the virtualenv's
Python instead of /opt/devcloud/.venv/bin/python, free loopback ports instead of 8000/80/443, a
self-signed certificate, the gateway secret, and paths under the test's temporary directory (the auth
cache's among them, with nginx's workers running as the test's user so they can write there).
"""

import os
import re
import shlex
import sys
from pathlib import Path

from tests.support.certs import self_signed  # noqa: F401  (the deploy tests import it from here)

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
UNITS = DEPLOY / "systemd"
ENV_FILE = DEPLOY / "devcloud.env"
NGINX_SITE = DEPLOY / "nginx" / "devcloud.conf"
KIT_PYTHON = "/opt/devcloud/.venv/bin/python"


def unit_sections(name: str) -> dict[str, dict[str, list[str]]]:
    """The unit file `name` as {section: {key: [values]}} (keys may repeat, as in systemd)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for line in (UNITS / name).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def exec_start(name: str) -> list[str]:
    """The unit's ExecStart as argv, with the kit's Python replaced by this virtualenv's."""
    (command,) = unit_sections(name)["Service"]["ExecStart"]
    argv = shlex.split(command)
    assert argv[0] == KIT_PYTHON, f"{name} runs {argv[0]}, not the kit's virtualenv"
    return [sys.executable, *argv[1:]]


def environment() -> dict[str, str]:
    """deploy/devcloud.env as systemd's EnvironmentFile reads it (NAME=value lines; # comments)."""
    values = {}
    for line in ENV_FILE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, value = line.partition("=")
        values[name.strip()] = value.strip()
    return values


def nginx_site(
    *, https_port: int, http_port: int, portal_port: int, cert: Path, key: Path, secret: str
) -> str:
    """deploy/nginx/devcloud.conf listening on loopback test ports, in front of uvicorn on `portal_port`."""
    site = NGINX_SITE.read_text()
    # IPv6 may be off on a test machine; the IPv4 listeners are the same server blocks.
    site = re.sub(r"^\s*listen \[::\]:\d+[^;]*;\n", "", site, flags=re.MULTILINE)
    site = site.replace("listen 443 ssl", f"listen 127.0.0.1:{https_port} ssl")
    site = site.replace("listen 80;", f"listen 127.0.0.1:{http_port};")
    site = site.replace("server 127.0.0.1:8000;", f"server 127.0.0.1:{portal_port};")
    site = site.replace("CHANGE-ME-GATEWAY-SECRET", secret)
    site = re.sub(r"ssl_certificate\s+\S+;", f"ssl_certificate {cert};", site)
    site = re.sub(r"ssl_certificate_key\s+\S+;", f"ssl_certificate_key {key};", site)
    return site


def nginx_conf(site: str, root: Path) -> str:
    """A whole nginx.conf around `site` (Debian's includes it from the http block), run from `root`.

    The auth cache (`proxy_cache_path`) moves under `root` too. Started as root, nginx would run its
    workers as nobody, who cannot enter a test's temporary directory (pytest makes it 0700) to write the
    cache, so they run as root there; as any other user nginx runs them as that user anyway.
    """
    site, caches = re.subn(
        r"^(\s*proxy_cache_path\s+)\S+",
        lambda match: f"{match[1]}{root / 'devcloud-auth'}",
        site,
        flags=re.MULTILINE,
    )
    assert caches <= 1, "the site declares more than one cache"
    temp_paths = "\n".join(
        f"    {kind}_temp_path {root / kind};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    user = "user root;\n" if os.geteuid() == 0 else ""
    return (
        f"{user}daemon off;\npid {root / 'nginx.pid'};\nerror_log {root / 'error.log'} info;\n"
        f"events {{}}\nhttp {{\n    access_log {root / 'access.log'};\n{temp_paths}\n{site}\n}}\n"
    )


