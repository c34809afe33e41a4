"""Who may see and touch an instance: its owner only. Everyone else gets the same 404 as for an id that
does not exist, and a logged-out browser is sent to the login page."""

import uuid

import pytest
from django.urls import reverse

from portal.instances.models import Instance
from provisioning.drivers import fake


@pytest.fixture
def alices(alice, db):
    return Instance.objects.create(
        user=alice, size="1x", image=fake.make_image("cpu"), jupyter_token="secret-token"
    )


def views(instance_id):
    return [
        ("get", reverse("instances:detail", args=[instance_id])),
        ("get", reverse("instances:status", args=[instance_id])),
        ("post", reverse("instances:stop", args=[instance_id])),
    ]


def test_bob_gets_404_on_every_view_of_alices_instance(bob_client, alices):
    for method, url in views(alices.id):
        response = getattr(bob_client, method)(url)
        assert response.status_code == 404, url
        assert b"secret-token" not in response.content
    assert Instance.objects.get(pk=alices.pk).state == Instance.State.QUEUED


def test_a_forged_id_gets_the_same_404(alice_client, alices):
    for method, url in views(uuid.uuid4()):
        assert getattr(alice_client, method)(url).status_code == 404, url


def test_a_malformed_id_is_not_found(alice_client):
    for path in ("/instances/not-a-uuid/", "/instances/1/status.json", "/instances/../stop/"):
        assert alice_client.get(path).status_code == 404, path


def test_a_logged_out_browser_is_sent_to_log_in(client, alices):
    for method, url in views(alices.id) + [
        ("get", reverse("instances:list")),
        ("post", reverse("instances:launch")),
    ]:
        response = getattr(client, method)(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith(reverse("accounts:login")), url
    assert Instance.objects.get(pk=alices.pk).state == Instance.State.QUEUED


def test_alice_sees_her_own_instance(alice_client, alices):
    for method, url in views(alices.id)[:2]:
        assert getattr(alice_client, method)(url).status_code == 200


def test_bobs_list_does_not_show_alices_instances(bob_client, alices):
    response = bob_client.get(reverse("instances:list"))
    assert str(alices.id) not in response.content.decode()
    assert "You have not launched anything yet." in response.content.decode()


def test_launch_and_stop_only_answer_post(alice_client, alices):
    assert alice_client.get(reverse("instances:launch")).status_code == 405
    assert alice_client.get(reverse("instances:stop", args=[alices.id])).status_code == 405
    assert Instance.objects.get(pk=alices.pk).state == Instance.State.QUEUED
