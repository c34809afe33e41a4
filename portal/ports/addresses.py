"""Where an exposed port is served: its own origin on the lab domain, and how the gateway reads it back.

With GATEWAY_LAB_URL set (production's subdomain mode, e.g. `https://{instance_id}.lab.example.com`) the
port of instance 3f2a9c1e… at 8000 is `https://3f2a9c1e-8000.lab.example.com/`: the lab's template with
the label `<short id>-<port>` in place of the instance id, so the lab's wildcard DNS record and
certificate cover it. In path mode (`make run`, tests) it is `http://3f2a9c1e-8000.localhost:<SITE_URL's
port>/`: browsers resolve every `*.localhost` name to the loopback address, and each port still gets an
origin of its own, apart from the portal's.
"""

import re
from urllib.parse import urlencode, urlsplit

from django.conf import settings

LABEL = re.compile(r"^(?P<short_id>[0-9a-f]{8})-(?P<port>[0-9]{1,5})$")


def host_label(short_id: str, port: int) -> str:
    return f"{short_id}-{port}"


def port_origin(label: str) -> str:
    """Returns the origin serving the exposed port `label`, e.g. "https://3f2a9c1e-8000.lab.example.com"."""
    template = getattr(settings, "GATEWAY_LAB_URL", "")
    if template:
        return template.format(instance_id=label).rstrip("/")
    site = urlsplit(settings.SITE_URL)
    port = f":{site.port}" if site.port else ""
    return f"{site.scheme}://{label}.localhost{port}"


def port_url(label: str) -> str:
    """Returns the address people open for the exposed port `label` (its origin and "/")."""
    return port_origin(label) + "/"


def share_url(label: str, secret: str) -> str:
    """Returns a share link: the portal's page that checks it and lets its holder in to the port."""
    return f"{settings.SITE_URL}/ports/{label}/open?{urlencode({'share': secret})}"


def label_of_host(host: str) -> str | None:
    """Returns the exposed port's label when `host` (a Host header) is a port's host name, else None.

    In subdomain mode the whole host must be the template's; in path mode any `<label>.localhost`, on
    whichever port the server was reached.
    """
    host = host.strip().lower()
    template = getattr(settings, "GATEWAY_LAB_URL", "")
    if template:
        expected = urlsplit(template.format(instance_id="\0")).netloc.lower()
        before, _, after = expected.partition("\0")
        if not (host.startswith(before) and host.endswith(after)) or len(host) <= len(before) + len(after):
            return None
        label = host[len(before) : len(host) - len(after)]
    else:
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        if not name.endswith(".localhost"):
            return None
        label = name[: -len(".localhost")]
    return label if LABEL.match(label) else None
