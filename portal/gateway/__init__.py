"""The route from a browser to an instance's JupyterLab, authorised by the portal session.

`portal.asgi` mounts it next to Django: /instances/<uuid>/lab/... (HTTP and websockets) is proxied to
the JupyterLab the driver started (driver_state["endpoint"]), for the instance's owner only. See
docs/gateway.md for what it guarantees and how production puts nginx in front of it.
"""

# JupyterLab's base_url for an instance; the gateway forwards paths under it unchanged.
LAB_PREFIX = "/instances/{instance_id}/lab/"


def lab_path(instance_id) -> str:
    """Returns the path the browser opens for an instance's JupyterLab, e.g. /instances/<uuid>/lab/."""
    return LAB_PREFIX.format(instance_id=instance_id)


def open_path(instance_id) -> str:
    """Returns where "Open JupyterLab" should link, e.g. /instances/<uuid>/open.

    It works in both modes: it redirects to lab_path() on this host in path mode, and in subdomain mode
    (GATEWAY_LAB_URL) to the lab's own host with a short-lived ticket.
    """
    return f"/instances/{instance_id}/open"
