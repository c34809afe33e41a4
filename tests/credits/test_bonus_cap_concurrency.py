"""Concurrent grants and approvals on real PostgreSQL transactions: no double grant, the cap holds.

Each worker is a thread with its own database connection; a barrier releases them together so their
transactions overlap. The rows are committed (transaction=True), so every connection sees them.
"""

import threading
import uuid

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.db.models import Sum

from portal.credits import services
from portal.credits.models import (
    BonusApplication,
    BonusProgram,
    CreditAccount,
    LedgerEntry,
    SignupGrantProgram,
)

from ..conftest import make_user

# Transactional: the threads commit on their own connections (tests/conftest.py re-seeds the programs).
pytestmark = pytest.mark.django_db(transaction=True)

HOUR = 3600
ROUNDS = 3  # each race is run a few times: one lucky interleaving proves little


def run_together(workers):
    """Run each callable in its own thread, released at once. Returns [("ok", value) | ("error", exc)]."""
    barrier = threading.Barrier(len(workers))
    results = [None] * len(workers)

    def run(index, work):
        try:
            barrier.wait(timeout=10)
            results[index] = ("ok", work())
        except Exception as error:  # noqa: BLE001 -- reported to the test, which asserts on it
            results[index] = ("error", error)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, work)) for i, work in enumerate(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads), "a worker hung (deadlock?)"
    return results


def assert_balance_matches_ledger(user):
    account = CreditAccount.objects.get(user=user)
    total = LedgerEntry.objects.filter(account=account).aggregate(total=Sum("gpu_seconds"))["total"] or 0
    assert account.balance_gpu_seconds == total
    return account


def unexpected_errors(results, allowed=()):
    return [value for status, value in results if status == "error" and not isinstance(value, allowed)]


@pytest.fixture
def operators(db):
    return [make_user(f"op{i}@ops.example.com", staff=True, first_name=f"Op{i}") for i in range(2)]


@pytest.mark.parametrize("program_hours, expected_clamped_grant", [(50, 0), (30, 20)])
def test_it_caps_two_concurrent_approvals_for_the_same_person(
    operators, program_hours, expected_clamped_grant
):
    for round_ in range(ROUNDS):
        person = make_user(f"dev{round_}@example.com")
        programs = [
            BonusProgram.objects.create(
                name=f"P{round_}-{i}", slug=f"p{round_}-{i}", max_gpu_seconds=program_hours * HOUR
            )
            for i in range(2)
        ]
        applications = [
            services.bonus_apply(user=person, program=p, evidence=f"CERT-{p.pk}") for p in programs
        ]

        results = run_together(
            [
                lambda app=app, op=op: services.bonus_approve(application_id=app.pk, actor=op)
                for app, op in zip(applications, operators)
            ]
        )

        assert unexpected_errors(results) == []
        decided = list(BonusApplication.objects.filter(user=person))
        assert all(a.status == "approved" for a in decided)
        assert sum(a.granted_gpu_seconds for a in decided) == 50 * HOUR
        clamped = [a for a in decided if a.clamped]
        assert len(clamped) == 1
        assert clamped[0].granted_gpu_seconds == expected_clamped_grant * HOUR
        account = assert_balance_matches_ledger(person)
        assert account.bonus_gpu_seconds == 50 * HOUR
        assert account.balance_gpu_seconds == 50 * HOUR


def test_it_approves_the_same_application_once_when_operators_click_together(operators):
    program = BonusProgram.objects.get(slug="rocm-star")
    for round_ in range(ROUNDS):
        person = make_user(f"dev{round_}@example.com")
        application = services.bonus_apply(user=person, program=program, evidence="ROCM-STAR-1")

        results = run_together(
            [
                lambda op=op, app=application: services.bonus_approve(application_id=app.pk, actor=op)
                for op in operators * 2
            ]
        )

        assert unexpected_errors(results, allowed=ValidationError) == []
        assert [status for status, _ in results].count("ok") == 1
        assert LedgerEntry.objects.filter(account__user=person, kind="bonus").count() == 1
        assert assert_balance_matches_ledger(person).balance_gpu_seconds == 50 * HOUR


def test_it_takes_exactly_one_decision_when_approve_and_reject_race(operators):
    program = BonusProgram.objects.get(slug="rocm-star")
    for round_ in range(ROUNDS):
        person = make_user(f"dev{round_}@example.com")
        application = services.bonus_apply(user=person, program=program, evidence="ROCM-STAR-1")

        results = run_together(
            [
                lambda app=application: services.bonus_approve(application_id=app.pk, actor=operators[0]),
                lambda app=application: services.bonus_reject(
                    application_id=app.pk, actor=operators[1], reason="Not found"
                ),
            ]
        )

        assert unexpected_errors(results, allowed=ValidationError) == []
        assert [status for status, _ in results].count("ok") == 1
        application.refresh_from_db()
        entries = LedgerEntry.objects.filter(account__user=person).count()
        assert entries == (1 if application.status == "approved" else 0)
        if entries:
            assert_balance_matches_ledger(person)


def test_it_grants_the_signup_hours_once_to_concurrent_calls_for_one_person():
    for round_ in range(ROUNDS):
        person = make_user(f"dev{round_}@example.com")

        results = run_together(
            [lambda user=person: services.credits_grant_signup(user=user) for _ in range(6)]
        )

        assert unexpected_errors(results) == []
        assert sum(1 for _, entry in results if entry is not None) == 1
        assert LedgerEntry.objects.filter(account__user=person, kind="grant").count() == 1
        assert assert_balance_matches_ledger(person).balance_gpu_seconds == 25 * HOUR


def test_it_grants_the_signup_hours_once_to_concurrent_accounts_of_one_person():
    for round_ in range(ROUNDS):
        # Same inbox, written three ways: they normalise to one person.
        accounts = [
            make_user(f"dev.{round_}@gmail.com"),
            make_user(f"dev{round_}+gpu@gmail.com"),
            make_user(f"D.E.V{round_}@googlemail.com"),
        ]

        results = run_together(
            [lambda user=user: services.credits_grant_signup(user=user) for user in accounts]
        )

        assert unexpected_errors(results) == []
        assert LedgerEntry.objects.filter(account__user__in=accounts, kind="grant").count() == 1
        assert sum(
            CreditAccount.objects.filter(user__in=accounts).values_list("balance_gpu_seconds", flat=True)
        ) == (25 * HOUR)


def test_it_gives_the_last_signup_slot_to_exactly_one_of_many():
    program = SignupGrantProgram.objects.get(name="Early-registrant grant")
    for round_ in range(ROUNDS):
        people = [make_user(f"dev{round_}-{i}@example.com") for i in range(5)]
        program.refresh_from_db()
        SignupGrantProgram.objects.filter(pk=program.pk).update(max_accounts=program.granted_count + 1)

        run_together([lambda user=user: services.credits_grant_signup(user=user) for user in people])

        assert LedgerEntry.objects.filter(account__user__in=people, kind="grant").count() == 1
        program.refresh_from_db()
        assert program.granted_count == program.max_accounts


def test_it_posts_one_entry_for_concurrent_adjustments_with_the_same_key(operators):
    for round_ in range(ROUNDS):
        person = make_user(f"dev{round_}@example.com")
        key = f"adjust:{person.pk}:{uuid.uuid4()}"

        results = run_together(
            [
                lambda op=op, user=person, key=key: services.credits_adjust(
                    user=user, gpu_seconds=5 * HOUR, reason="Voucher", actor=op, idempotency_key=key
                )
                for op in operators * 2
            ]
        )

        assert unexpected_errors(results) == []
        assert len({entry.pk for _, entry in results}) == 1
        assert LedgerEntry.objects.filter(account__user=person).count() == 1
        assert assert_balance_matches_ledger(person).balance_gpu_seconds == 5 * HOUR


def test_it_loses_no_update_when_different_adjustments_land_together(operators):
    person = make_user("dev@example.com")
    services.credits_adjust(
        user=person, gpu_seconds=HOUR, reason="Opening", actor=None, idempotency_key="open"
    )

    results = run_together(
        [
            lambda i=i: services.credits_adjust(
                user=person,
                gpu_seconds=HOUR,
                reason=f"Voucher {i}",
                actor=operators[i % 2],
                idempotency_key=f"v{i}",
            )
            for i in range(6)
        ]
    )

    assert unexpected_errors(results) == []
    account = assert_balance_matches_ledger(person)
    assert account.balance_gpu_seconds == 7 * HOUR
    # Each entry saw the one before it: the running balances are 1..7 hours with no repeats.
    afters = sorted(LedgerEntry.objects.filter(account=account).values_list("balance_after", flat=True))
    assert afters == [h * HOUR for h in range(1, 8)]
