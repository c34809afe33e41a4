"""The database itself refuses changes to audit entries (migration 0002), whatever the code above it does."""

import pytest
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.db.models import ProtectedError

from portal.audit.models import AuditEntry
from portal.audit.services import audit_record


def row(entry_id):
    with connection.cursor() as cursor:
        cursor.execute("SELECT action, reason, actor_name FROM console_auditentry WHERE id = %s", [entry_id])
        return cursor.fetchone()


@pytest.fixture
def entry(olivia, alice):
    return audit_record(actor=olivia, action="user.suspend", target=alice, reason="Abuse report")


ORIGINAL = ("user.suspend", "Abuse report", "Olivia Operator <olivia@ops.example.com>")


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE console_auditentry SET reason = 'nothing happened' WHERE id = %s",
        "UPDATE console_auditentry SET actor_name = 'someone else' WHERE id = %s",
        "DELETE FROM console_auditentry WHERE id = %s",
    ],
)
def test_it_refuses_raw_sql_changes_to_an_entry(entry, statement):
    with (
        pytest.raises(IntegrityError, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(statement, [entry.pk])

    assert row(entry.pk) == ORIGINAL


def test_it_refuses_an_orm_update_and_save(entry):
    with pytest.raises(DatabaseError), transaction.atomic():
        AuditEntry.objects.filter(pk=entry.pk).update(reason="rewritten")
    entry.reason = "rewritten"
    with pytest.raises(DatabaseError), transaction.atomic():
        entry.save()

    assert row(entry.pk) == ORIGINAL


def test_it_refuses_an_orm_delete(entry):
    with pytest.raises(DatabaseError), transaction.atomic():
        AuditEntry.objects.all().delete()
    with pytest.raises(DatabaseError), transaction.atomic():
        entry.delete()

    assert AuditEntry.objects.filter(pk=entry.pk).exists()


def test_it_refuses_to_delete_the_operator_behind_an_entry(entry, olivia):
    with pytest.raises(ProtectedError), transaction.atomic():
        olivia.delete()

    assert row(entry.pk) == ORIGINAL


def test_it_still_appends_new_entries(entry, olivia, alice):
    audit_record(actor=olivia, action="user.unsuspend", target=alice, reason="Appeal accepted")

    assert list(AuditEntry.objects.values_list("action", flat=True)) == ["user.unsuspend", "user.suspend"]
    assert row(entry.pk) == ORIGINAL
