"""The instance's Ports page: the owner exposes, shares, revokes and closes; nobody else sees it."""

import pytest
from django.utils import timezone

from portal.instances.models import Image, Instance
from portal.ports.models import ExposedPort, ShareLink
from tests.conftest import text

pytestmark = pytest.mark.django_db


@pytest.fixture
def running(alice):
    image = Image.objects.create(key="cpu", name="CPU", sizes=["1x"], reference="devcloud/cpu:test")
    return Instance.objects.create(
        user=alice,
        size="1x",
        image=image,
        state=Instance.State.RUNNING,
        ready_at=timezone.now(),
        jupyter_token="t" * 48,
        driver_state={"endpoint": "http://127.0.0.1:1", "address": "172.30.0.2"},
    )


def page(instance, tail=""):
    return f"/instances/{instance.id}/ports/{tail}"


def test_it_links_the_ports_page_from_a_running_instance(alice_client, running):
    response = alice_client.get(f"/instances/{running.id}/")

    assert f'href="{page(running)}"' in response.content.decode()


def test_it_exposes_shares_revokes_and_closes(alice_client, running):
    exposed = alice_client.post(page(running, "expose/"), {"port": "8000"}, follow=True)
    assert f"http://{running.short_id}-8000.localhost:8000/" in text(exposed)

    shared = alice_client.post(page(running, "8000/shares/"), {"hours": "2", "email": ""})
    assert shared.status_code == 201
    assert f"/ports/{running.short_id}-8000/open?share=" in shared.content.decode()
    link = ShareLink.objects.get()
    assert "anyone with the link" in text(alice_client.get(page(running)))

    alice_client.post(page(running, f"shares/{link.id}/revoke/"))
    link.refresh_from_db()
    assert link.revoked_at is not None

    closed = alice_client.post(page(running, "8000/close/"), follow=True)
    assert "Port 8000 is closed" in text(closed)
    assert not ExposedPort.objects.filter(closed_at__isnull=True).exists()


def test_a_refused_port_says_why(alice_client, running):
    response = alice_client.post(page(running, "expose/"), {"port": "22"}, follow=True)

    assert "Expose a port from 1024 to 65535." in text(response)
    assert not ExposedPort.objects.exists()


def test_another_person_gets_404(bob_client, alice_client, running):
    alice_client.post(page(running, "expose/"), {"port": "8000"})

    assert bob_client.get(page(running)).status_code == 404
    assert bob_client.post(page(running, "expose/"), {"port": "9000"}).status_code == 404
    assert bob_client.post(page(running, "8000/close/")).status_code == 404
    assert ExposedPort.objects.filter(closed_at__isnull=True).count() == 1
