"""`devcloud expose`, `ports`, `share`, `shares`, `unshare` and `unexpose`, against the live portal. What
the gateway then lets through is tests/gateway/test_exposed_ports.py."""

import json

import pytest

from portal.instances.models import Instance
from portal.ports.models import ExposedPort, ShareLink

from .test_cli import OK, REFUSED, logged_in  # noqa: F401  (logged_in is a fixture, used by name)


@pytest.fixture
def running(logged_in, alice):  # noqa: F811
    assert logged_in("launch", "--size", "1x", "--image", "cpu", "--wait").returncode == OK
    instance = Instance.objects.get(user=alice)
    # The fake driver reports no address for the instance's ports; a Docker instance has one.
    Instance.objects.filter(pk=instance.pk).update(
        driver_state={**instance.driver_state, "address": "172.30.0.2"}
    )
    return instance


def test_expose_list_share_revoke_and_close(logged_in, running):  # noqa: F811
    exposed = logged_in("expose", running.short_id, "8000")
    assert exposed.returncode == OK, exposed.stderr
    assert f"Port 8000 of {running.short_id} is at http://{running.short_id}-8000.localhost" in exposed.stdout

    listed = logged_in("ports", running.short_id)
    assert "PORT" in listed.stdout and f"{running.short_id}-8000.localhost" in listed.stdout

    shared = logged_in("share", running.short_id, "8000", "--hours", "2")
    assert shared.returncode == OK, shared.stderr
    assert f"/ports/{running.short_id}-8000/open?share=" in shared.stdout
    assert "For anyone with the link" in shared.stdout
    link = ShareLink.objects.get()
    assert link.active()

    assert "active" in logged_in("shares", running.short_id, "8000").stdout
    assert logged_in("unshare", running.short_id, "8000", str(link.id)).returncode == OK
    link.refresh_from_db()
    assert not link.active()
    assert "revoked" in logged_in("shares", running.short_id, "8000").stdout

    closed = logged_in("unexpose", running.short_id, "8000")
    assert closed.returncode == OK
    assert not ExposedPort.objects.filter(closed_at__isnull=True).exists()
    assert "No exposed ports" in logged_in("ports", running.short_id).stdout


def test_the_instances_own_ports_are_refused_with_the_reason(logged_in, running):  # noqa: F811
    refused = logged_in("expose", running.short_id, "8888")

    assert refused.returncode == REFUSED
    assert "JupyterLab or SSH port" in refused.stderr


def test_json_output_for_scripts(logged_in, running):  # noqa: F811
    exposed = json.loads(logged_in("expose", running.short_id, "8000", "--json").stdout)
    assert exposed["port"] == 8000

    link = json.loads(logged_in("share", running.short_id, "8000", "--json").stdout)
    assert link["url"].split("share=", 1)[1] and link["active"] is True
