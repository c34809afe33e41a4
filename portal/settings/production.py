"""Production: the deployed settings (portal/settings/deployed.py), and a refusal to start with unsafe ones.

`manage.py check --deploy` passes clean."""

import os
from urllib.parse import urlparse

from django.core.exceptions import ImproperlyConfigured

from .deployed import *  # noqa: F403
from .base import (
    ALLOWED_HOSTS,
    DEVCLOUD_SEALING_KEY,
    GATEWAY_AUTH_SECRET,
    GATEWAY_LAB_URL,
    SECRET_KEY,
    SITE_URL,
    env,
)


def unsafe_settings() -> list[str]:
    """What in the environment makes this portal unsafe to put on the internet, each with its fix."""
    from portal.lib.sealed import SealingKeyError, configured_keys

    problems = []
    if SECRET_KEY.startswith("insecure") or len(SECRET_KEY) < 50 or "CHANGE-ME" in SECRET_KEY:
        problems.append(
            "SECRET_KEY is unset or insecure. Set it to a random string of at least 50 characters, e.g. the "
            "output of: python3 -c 'import secrets; print(secrets.token_urlsafe(50))'"
        )
    if env.bool("DEBUG", default=False):
        problems.append("DEBUG is on: it shows settings and code to anyone who hits an error. Set DEBUG=false.")
    if urlparse(SITE_URL).scheme != "https":
        problems.append(f"SITE_URL is {SITE_URL}: links in emails would go over plain HTTP. Set it to https://.")
    if not GATEWAY_LAB_URL:
        problems.append(
            "GATEWAY_LAB_URL is empty, which puts every user's JupyterLab on the portal's own origin, where "
            "one user's notebook can act as anyone who opens it (docs/gateway.md). Set it to "
            "https://{instance_id}.lab.<your domain> with the wildcard DNS record and certificate."
        )
    elif urlparse(GATEWAY_LAB_URL).scheme != "https" or "{instance_id}" not in GATEWAY_LAB_URL:
        problems.append(
            f"GATEWAY_LAB_URL is {GATEWAY_LAB_URL}: it must be https:// with {{instance_id}} in the host name, "
            "e.g. https://{instance_id}.lab.example.com."
        )
    if len(GATEWAY_AUTH_SECRET) < 32 or "CHANGE-ME" in GATEWAY_AUTH_SECRET:
        problems.append(
            "GATEWAY_AUTH_SECRET is missing or shorter than 32 characters, so the lab auth endpoint trusts "
            "whoever calls it. Set it (and nginx's X-DevCloud-Gateway-Secret) to the output of: "
            "python3 -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )
    if not ALLOWED_HOSTS or "*" in ALLOWED_HOSTS or set(ALLOWED_HOSTS) <= {"localhost", "127.0.0.1", "[::1]"}:
        problems.append(
            f"ALLOWED_HOSTS is {','.join(ALLOWED_HOSTS) or 'empty'}. Set it to the portal's host name(s), "
            "e.g. ALLOWED_HOSTS=portal.example.com (no *)."
        )
    try:
        configured_keys(DEVCLOUD_SEALING_KEY)
    except SealingKeyError as error:
        problems.append(str(error))
    left = sorted(name for name, value in os.environ.items() if "CHANGE-ME" in value and name != "SECRET_KEY")
    if left:
        problems.append(f"{', '.join(left)} still hold CHANGE-ME from deploy/devcloud.env: fill them in.")
    return problems


# Refused here, while settings load, so the web process, the workers and `manage.py check --deploy` all
# refuse to start rather than run in the open.
if _problems := unsafe_settings():
    raise ImproperlyConfigured(
        "Refusing to start with unsafe production settings:\n- " + "\n- ".join(_problems)
    )

