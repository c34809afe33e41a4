"""/api/v1/instances/<id>/ports and their share links: the owner exposes, lists, shares, revokes and
closes; the port rules and other people's requests come back as problems. The gateway's side (who gets
through) is tests/gateway/test_exposed_ports.py."""

import pytest
from django.utils import timezone

from portal.audit.models import AuditEntry
from portal.instances import services
from portal.instances.models import Instance
from portal.ports.models import ExposedPort, ShareLink
from tests.conftest import give

from .conftest import assert_problem, token_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def running(alice, cpu):
    give(alice, 25)
    instance = services.instance_launch(user=alice, size="1x", image_key="cpu")
    Instance.objects.filter(pk=instance.pk).update(
        state=Instance.State.RUNNING,
        step="ready",
        ready_at=timezone.now(),
        metered_until=timezone.now(),
        driver_state={"endpoint": "http://127.0.0.1:1", "address": "172.30.0.2"},
    )
    instance.refresh_from_db()
    return instance


def ports_url(instance, tail=""):
    return f"/api/v1/instances/{instance.id}/ports{tail}"


def test_it_exposes_a_port_at_its_own_address(alice, running, settings):
    settings.GATEWAY_LAB_URL = "https://{instance_id}.lab.example.com"
    _, api = token_for(alice)

    response = api.post(ports_url(running), {"port": 8000})

    assert response.status_code == 201
    assert response.json()["url"] == f"https://{running.short_id}-8000.lab.example.com/"
    assert [p["port"] for p in api.get(ports_url(running)).json()] == [8000]
    assert AuditEntry.objects.filter(action="port.expose", target_id=str(running.id)).count() == 1


def test_exposing_an_open_port_again_changes_nothing(alice, running):
    _, api = token_for(alice)
    api.post(ports_url(running), {"port": 8000})

    assert api.post(ports_url(running), {"port": 8000}).status_code == 201
    assert ExposedPort.objects.filter(instance=running).count() == 1


@pytest.mark.parametrize("port", [22, 80, 1023, 8888, 2222, 65536])
def test_it_refuses_privileged_and_the_instances_own_ports(alice, running, port):
    _, api = token_for(alice)

    response = api.post(ports_url(running), {"port": port})

    assert_problem(response, 400)
    assert "port" in response.json()["errors"]
    assert not ExposedPort.objects.exists()


def test_a_stopped_instance_cannot_expose(alice, running):
    Instance.objects.filter(pk=running.pk).update(state=Instance.State.STOPPED)
    _, api = token_for(alice)

    assert_problem(api.post(ports_url(running), {"port": 8000}), 409)


def test_stopping_the_instance_closes_its_ports(alice, running, client):
    _, api = token_for(alice)
    api.post(ports_url(running), {"port": 8000})
    client.force_login(alice)
    assert f"{running.short_id}-8000" in client.get(f"/instances/{running.id}/ports/").content.decode()

    services.instance_stop(user=alice, instance_id=running.id)

    assert api.get(ports_url(running)).json() == []
    assert_problem(api.delete(ports_url(running, "/8000")), 404)
    assert f"{running.short_id}-8000" not in client.get(f"/instances/{running.id}/ports/").content.decode()


def test_an_instance_whose_ports_the_gateway_cannot_reach_says_so(alice, running):
    Instance.objects.filter(pk=running.pk).update(driver_state={"endpoint": "http://127.0.0.1:1"})
    _, api = token_for(alice)

    response = api.post(ports_url(running), {"port": 8000})

    assert_problem(response, 409, kind="ports-unavailable")


def test_another_person_gets_404_for_everything(bob, alice, running):
    _, alice_api = token_for(alice)
    alice_api.post(ports_url(running), {"port": 8000})
    _, bob_api = token_for(bob)

    assert_problem(bob_api.get(ports_url(running)), 404)
    assert_problem(bob_api.post(ports_url(running), {"port": 9000}), 404)
    assert_problem(bob_api.delete(ports_url(running, "/8000")), 404)
    assert_problem(bob_api.post(ports_url(running, "/8000/shares"), {}), 404)
    assert ExposedPort.objects.filter(closed_at__isnull=True).count() == 1


def test_closing_a_port(alice, running):
    _, api = token_for(alice)
    api.post(ports_url(running), {"port": 8000})

    assert api.delete(ports_url(running, "/8000")).status_code == 204

    assert api.get(ports_url(running)).json() == []
    assert_problem(api.delete(ports_url(running, "/8000")), 404)
    assert AuditEntry.objects.filter(action="port.close").count() == 1


def test_a_share_link_is_shown_once_and_stored_as_a_digest(alice, running):
    _, api = token_for(alice)
    api.post(ports_url(running), {"port": 8000})

    made = api.post(ports_url(running, "/8000/shares"), {"hours": 2}).json()

    secret = made["url"].split("share=", 1)[1]
    assert made["email"] is None and made["active"] is True
    listed = api.get(ports_url(running, "/8000/shares")).json()
    assert [link["id"] for link in listed] == [made["id"]]
    assert "url" not in listed[0]
    assert ShareLink.objects.get().secret_digest != secret
    assert AuditEntry.objects.filter(action="share.create").count() == 1


def test_a_share_link_for_a_named_person(alice, bob, running):
    _, api = token_for(alice)
    api.post(ports_url(running), {"port": 8000})

    made = api.post(ports_url(running, "/8000/shares"), {"email": "bob@example.com"})

    assert made.status_code == 201 and made.json()["email"] == "bob@example.com"
    unknown = api.post(ports_url(running, "/8000/shares"), {"email": "nobody@example.com"})
    assert_problem(unknown, 400)
    assert "email" in unknown.json()["errors"]


def test_revoking_a_share_link(alice, running):
    _, api = token_for(alice)
    api.post(ports_url(running), {"port": 8000})
    made = api.post(ports_url(running, "/8000/shares"), {}).json()

    assert api.delete(ports_url(running, f"/8000/shares/{made['id']}")).status_code == 204

    assert api.get(ports_url(running, "/8000/shares")).json()[0]["active"] is False
    assert AuditEntry.objects.filter(action="share.revoke").count() == 1
