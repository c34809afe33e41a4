"""Deleting an account stops its instances at once, charges them up to that moment and no further, tells
each teardown to remove the owner's workspace, and is audited; a launch racing the deletion is refused."""

import uuid
from datetime import timedelta

import pytest
from django.core.exceptions import PermissionDenied
from django.test import Client
from django.utils import timezone

from portal.accounts.models import User
from portal.audit.models import AuditEntry
from portal.credits import services as credits
from portal.credits.models import LedgerEntry
from portal.credits.selectors import balance_for
from portal.instances import lifecycle, services
from portal.instances.models import Instance
from portal.instances.stop_reasons import StopReason
from provisioning.drivers import fake
from provisioning.models import GpuAllocation
from tests.conftest import PASSWORD

pytestmark = pytest.mark.usefixtures("cloud")

HOUR = 3600
DELETE = "/accounts/settings/delete/"


@pytest.fixture
def running(alice, db):
    credits.credits_adjust(
        user=alice, gpu_seconds=25 * HOUR, reason="Test", actor=None, idempotency_key=str(uuid.uuid4())
    )
    fake.make_host("gpu-01")
    fake.make_image("cpu")
    instance = services.instance_launch(user=alice, size="1x", image_key="cpu")
    assert lifecycle.instance_provision(instance_id=instance.id) == "running"
    # It has run for 90 seconds since it got ready, none of them charged yet.
    ninety_ago = timezone.now() - timedelta(seconds=90)
    Instance.objects.filter(pk=instance.pk).update(ready_at=ninety_ago, metered_until=ninety_ago)
    instance.refresh_from_db()
    return instance


def test_deleting_the_account_stops_its_instance_at_once_and_charges_up_to_that_moment(
    running, alice, cloud, django_capture_on_commit_callbacks
):
    browser = Client()
    browser.force_login(alice)
    before = balance_for(alice)

    with django_capture_on_commit_callbacks(execute=True):
        response = browser.post(DELETE, {"confirm_email": "alice@example.com", "password": PASSWORD})

    assert response.status_code == 302
    running.refresh_from_db()
    assert (running.state, running.stop_reason) == (Instance.State.STOPPED, StopReason.ACCOUNT_DELETED)
    assert str(running.id) not in cloud.containers
    assert not GpuAllocation.objects.filter(instance=running, released_at__isnull=True).exists()
    # Charged for the 90 seconds it ran, in one usage entry, and billing ended at the deletion.
    assert 90 <= running.charged_gpu_seconds <= 95
    assert before - balance_for(alice) == running.charged_gpu_seconds
    assert LedgerEntry.objects.filter(account__user=alice, kind=LedgerEntry.Kind.USAGE).count() == 1
    # The teardown was told the owner is gone, so the driver removes the workspace on that host.
    assert ("remove_workspace", str(alice.pk)) in cloud.calls
    [entry] = AuditEntry.objects.filter(action="account.delete")
    assert entry.details["instances_stopped"] == [str(running.id)]
    assert "alice@example.com" not in f"{entry.actor_name} {entry.target_repr}"


def test_nothing_is_charged_after_the_deletion(running, alice, django_capture_on_commit_callbacks):
    from portal.accounts.services import account_delete

    with django_capture_on_commit_callbacks(execute=True):
        account_delete(user=alice)
    after_delete = balance_for(alice)

    lifecycle.meter_tick(timezone.now() + timedelta(hours=2))

    assert balance_for(alice) == after_delete


def test_a_launch_that_checked_before_the_deletion_is_refused_under_the_lock(running, alice):
    # The launch read the account as active; the deletion commits before it takes the lock.
    stale = User.objects.get(pk=alice.pk)
    User.objects.filter(pk=alice.pk).update(is_active=False, deleted_at=timezone.now())

    with pytest.raises(PermissionDenied):
        services.instance_launch(user=stale, size="1x", image_key="cpu")

    assert Instance.objects.filter(user=alice).count() == 1

