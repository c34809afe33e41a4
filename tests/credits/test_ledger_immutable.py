"""The database itself refuses changes to ledger rows (migration 0002), whatever the code above it does."""

import pytest
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.db.models import ProtectedError

from portal.credits.models import CreditAccount, LedgerEntry
from tests.conftest import give


def row(entry_id):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT gpu_seconds, balance_after, reason, kind FROM credits_ledgerentry WHERE id = %s",
            [entry_id],
        )
        return cursor.fetchone()


@pytest.fixture
def entry(alice):
    return give(alice, 25, reason="Early-registrant grant")


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE credits_ledgerentry SET gpu_seconds = 999999999 WHERE id = %s",
        "UPDATE credits_ledgerentry SET reason = 'rewritten' WHERE id = %s",
        "DELETE FROM credits_ledgerentry WHERE id = %s",
    ],
)
def test_it_refuses_raw_sql_changes_to_an_entry(entry, statement):
    before = row(entry.pk)

    with (
        pytest.raises(IntegrityError, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(statement, [entry.pk])

    assert row(entry.pk) == before == (90000, 90000, "Early-registrant grant", "grant")


def test_it_refuses_an_orm_update(entry):
    with pytest.raises(DatabaseError), transaction.atomic():
        LedgerEntry.objects.filter(pk=entry.pk).update(gpu_seconds=1)

    assert row(entry.pk)[0] == 90000


def test_it_refuses_saving_a_changed_entry(entry):
    entry.reason = "rewritten"

    with pytest.raises(DatabaseError), transaction.atomic():
        entry.save()

    assert row(entry.pk)[2] == "Early-registrant grant"


def test_it_refuses_an_orm_delete(entry):
    with pytest.raises(DatabaseError), transaction.atomic():
        LedgerEntry.objects.filter(pk=entry.pk).delete()
    with pytest.raises(DatabaseError), transaction.atomic():
        entry.delete()

    assert LedgerEntry.objects.filter(pk=entry.pk).exists()


def test_it_refuses_to_delete_the_account_under_its_entries(entry):
    with pytest.raises(ProtectedError), transaction.atomic():
        CreditAccount.objects.filter(pk=entry.account_id).delete()

    assert LedgerEntry.objects.filter(pk=entry.pk).exists()


def test_it_still_appends_corrections(alice, entry):
    correction = give(alice, -5, reason="Correction")

    assert correction.balance_after == 20 * 3600
    assert LedgerEntry.objects.filter(account__user=alice).count() == 2
    assert row(entry.pk)[0] == 90000


def test_it_gives_every_entry_a_unique_idempotency_key(entry):
    with pytest.raises(IntegrityError), transaction.atomic():
        LedgerEntry.objects.create(
            account=entry.account,
            kind="grant",
            gpu_seconds=1,
            balance_after=1,
            idempotency_key=entry.idempotency_key,
            reason="Duplicate",
        )
