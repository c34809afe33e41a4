"""A token of A sees nothing of B's: B's instances, keys and applications are 404s, as if they did not
exist."""

import uuid

import pytest

from portal.accounts import services as account_services
from portal.instances.models import Instance
from provisioning.drivers import fake
from tests.conftest import give

from .conftest import assert_problem, token_for

pytestmark = pytest.mark.django_db
ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl bob@laptop"


@pytest.fixture
def bobs_instance(bob, cpu):
    give(bob, 25)
    from portal.instances import services

    return services.instance_launch(user=bob, size="1x", image_key="cpu")


def test_alice_gets_404_for_everything_of_bobs_instance(alice, bobs_instance):
    _, api = token_for(alice)
    base = f"/api/v1/instances/{bobs_instance.id}"
    for answer in (api.get(base), api.post(f"{base}/stop"), api.get(f"{base}/logs")):
        assert_problem(answer, 404, kind="not-found")
    assert api.get("/api/v1/instances").json() == []
    bobs_instance.refresh_from_db()
    assert bobs_instance.state == Instance.State.QUEUED


def test_an_unknown_instance_reads_the_same_as_another_persons(alice, bobs_instance):
    _, api = token_for(alice)
    theirs = api.get(f"/api/v1/instances/{bobs_instance.id}").json()
    unknown = api.get(f"/api/v1/instances/{uuid.uuid4()}").json()
    assert theirs == unknown


def test_alice_cannot_delete_or_see_bobs_key(alice, bob):
    key = account_services.sshkey_add(user=bob, name="laptop", public_key=ED25519)
    _, api = token_for(alice)
    assert_problem(api.delete(f"/api/v1/ssh-keys/{key.pk}"), 404)
    assert api.get("/api/v1/ssh-keys").json() == []
    assert bob.ssh_keys.count() == 1


def test_alice_sees_none_of_bobs_ledger_or_applications(alice, bob):
    give(bob, 5)
    _, api = token_for(alice)
    assert api.get("/api/v1/ledger").json()["count"] == 0
    assert api.get("/api/v1/bonus-applications").json() == []


def test_the_fake_cloud_is_untouched_by_a_refused_stop(alice, bobs_instance):
    _, api = token_for(alice)
    api.post(f"/api/v1/instances/{bobs_instance.id}/stop")
    assert fake.cloud.count("stop") == 0
