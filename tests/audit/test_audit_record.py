"""audit_record: what other apps call after each operator action."""

import datetime
import uuid
from decimal import Decimal

import pytest

from portal.audit.models import AuditEntry
from portal.audit.services import audit_record
from provisioning.models import GpuHost


def test_it_records_who_did_what_to_which_object_and_why(olivia, alice):
    entry = audit_record(
        actor=olivia,
        action="user.suspend",
        target=alice,
        reason="  Crypto mining on a free account  ",
        details={"instances_stopped": 2},
    )

    stored = AuditEntry.objects.get(pk=entry.pk)
    assert stored.actor == olivia
    assert stored.actor_name == "Olivia Operator <olivia@ops.example.com>"
    assert (stored.action, stored.target_type, stored.target_id) == (
        "user.suspend",
        "accounts.user",
        str(alice.pk),
    )
    assert stored.target_repr == "alice@example.com"
    assert stored.reason == "Crypto mining on a free account"
    assert stored.details == {"instances_stopped": 2}
    assert stored.created_at is not None


def test_it_keeps_the_actor_name_as_it_was_after_a_rename(olivia, alice):
    entry = audit_record(actor=olivia, action="credits.adjust", target=alice, reason="Voucher")

    olivia.first_name, olivia.last_name, olivia.email = "Liv", "Renamed", "liv@ops.example.com"
    olivia.save()

    assert AuditEntry.objects.get(pk=entry.pk).actor_name == "Olivia Operator <olivia@ops.example.com>"


def test_it_names_an_operator_without_a_name_by_address(bob, alice):
    bob.first_name = ""
    bob.save()

    assert audit_record(actor=bob, action="bonus.approve", target=alice).actor_name == "bob@example.com"


def test_it_records_system_actions_without_an_actor(alice):
    entry = audit_record(actor=None, action="bonus.approve", target=alice, reason="Listed certificate ID")

    assert (entry.actor, entry.actor_name) == (None, "system")


def test_it_accepts_any_model_as_target_including_uuid_keys(olivia, db):
    host = GpuHost.objects.create(name="gpu-07")

    entry = audit_record(actor=olivia, action="host.drain", target=host, reason="Fan failure")

    assert (entry.target_type, entry.target_id, entry.target_repr) == (
        "provisioning.gpuhost",
        str(host.pk),
        "gpu-07",
    )


def test_it_names_a_target_that_is_not_a_row(olivia):
    entry = audit_record(
        actor=olivia,
        action="setting.change",
        target="LAUNCH_MIN_CREDIT_MINUTES",
        details={"old": 15, "new": 30},
    )

    assert (entry.target_type, entry.target_id, entry.target_repr) == ("", "", "LAUNCH_MIN_CREDIT_MINUTES")
    assert AuditEntry.objects.get(pk=entry.pk).details == {"old": 15, "new": 30}


def test_it_stores_dates_decimals_and_uuids_in_details(olivia):
    key = uuid.uuid4()

    entry = audit_record(
        actor=olivia,
        action="credits.adjust",
        details={"hours": Decimal("2.50"), "at": datetime.date(2025, 3, 1), "key": key},
    )

    assert AuditEntry.objects.get(pk=entry.pk).details == {
        "hours": "2.50",
        "at": "2025-03-01",
        "key": str(key),
    }


@pytest.mark.parametrize("action", ["", "drain", "Host.Drain", "host drain", "host.", "x" * 60 + ".y"])
def test_it_refuses_a_malformed_action_code(olivia, action):
    with pytest.raises(ValueError, match="dotted code"):
        audit_record(actor=olivia, action=action)

    assert not AuditEntry.objects.exists()


def test_it_refuses_details_it_cannot_store(olivia):
    with pytest.raises(ValueError, match="JSON"):
        audit_record(actor=olivia, action="host.drain", details={"host": object()})

    assert not AuditEntry.objects.exists()


def test_it_refuses_an_unsaved_actor(olivia):
    from portal.accounts.models import User

    with pytest.raises(ValueError, match="saved user"):
        audit_record(actor=User(email="ghost@example.com"), action="host.drain")
