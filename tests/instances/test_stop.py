"""instance_stop: the owner stops from any live state; billing ends at the stop; nobody else can stop it."""

import uuid

import pytest
from django.core.exceptions import ValidationError
from django.http import Http404

from portal.credits import services as credits
from portal.credits.models import CreditAccount, LedgerEntry
from portal.instances import lifecycle, services
from portal.instances.models import Instance
from provisioning.drivers import fake
from provisioning.models import GpuAllocation

pytestmark = pytest.mark.usefixtures("cloud")

HOUR = 3600


@pytest.fixture
def launched(alice, db):
    credits.credits_adjust(
        user=alice, gpu_seconds=25 * HOUR, reason="Test", actor=None, idempotency_key=str(uuid.uuid4())
    )
    fake.make_host("gpu-01")
    fake.make_image("cpu")
    return services.instance_launch(user=alice, size="1x", image_key="cpu")


@pytest.fixture
def running(launched):
    assert lifecycle.instance_provision(instance_id=launched.id) == "running"
    launched.refresh_from_db()
    return launched


def test_it_stops_a_running_instance_and_tears_it_down(running, alice, cloud):
    stopped = services.instance_stop(user=alice, instance_id=running.id)

    assert stopped.state == Instance.State.STOPPING
    assert stopped.stop_reason == "user"
    assert str(running.id) in cloud.containers  # until the teardown task runs
    lifecycle.instance_teardown(instance_id=running.id)
    running.refresh_from_db()
    assert running.state == Instance.State.STOPPED
    assert cloud.containers == {}
    assert not GpuAllocation.objects.filter(instance=running, released_at__isnull=True).exists()


def test_it_stops_a_queued_instance_at_once_and_charges_nothing(launched, alice):
    stopped = services.instance_stop(user=alice, instance_id=launched.id)

    assert stopped.state == Instance.State.STOPPED
    assert stopped.stopped_at is not None
    assert not LedgerEntry.objects.filter(kind=LedgerEntry.Kind.USAGE).exists()


def test_it_stops_an_instance_that_is_still_provisioning(launched, alice):
    Instance.objects.filter(pk=launched.pk).update(state=Instance.State.PROVISIONING)
    assert services.instance_stop(user=alice, instance_id=launched.id).state == Instance.State.STOPPING


def test_stopping_twice_is_harmless_and_stopping_an_ended_instance_says_so(running, alice):
    services.instance_stop(user=alice, instance_id=running.id)
    assert services.instance_stop(user=alice, instance_id=running.id).state == Instance.State.STOPPING
    lifecycle.instance_teardown(instance_id=running.id)

    with pytest.raises(ValidationError, match="This instance has already stopped."):
        services.instance_stop(user=alice, instance_id=running.id)


def test_bob_cannot_stop_alices_instance(running, bob):
    with pytest.raises(Http404):
        services.instance_stop(user=bob, instance_id=running.id)
    assert Instance.objects.get(pk=running.pk).state == Instance.State.RUNNING


def test_a_forged_id_is_not_found(alice, db):
    with pytest.raises(Http404):
        services.instance_stop(user=alice, instance_id=uuid.uuid4())


def test_an_operator_stop_records_its_reason(running):
    services.instance_request_stop(
        instance_id=running.id, reason="operator", note="Disk check", message="Stopped by Olivia."
    )
    running.refresh_from_db()
    assert (running.stop_reason, running.stop_note) == ("operator", "Disk check")
    assert running.events.last().message == "Stopped by Olivia."


def test_billing_ends_when_the_stop_is_asked_for(running, alice, cloud):
    services.instance_stop(user=alice, instance_id=running.id)
    balance = CreditAccount.objects.get(user=alice).balance_gpu_seconds
    cloud.behave(engine_down=True)  # the teardown is stuck for a while

    lifecycle.meter_tick()

    assert CreditAccount.objects.get(user=alice).balance_gpu_seconds == balance
