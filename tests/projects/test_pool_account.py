"""A project's pool is a CreditAccount of its own: exactly one of user and project, its own ledger."""

import pytest
from django.db import IntegrityError, transaction

from portal.credits.models import CreditAccount, LedgerEntry
from tests.conftest import balance, give

from .conftest import fund, pool_balance


def test_it_makes_the_pool_with_the_project_and_alice_its_owner(vllm, alice):
    pool = CreditAccount.objects.get(project=vllm)
    assert pool.user_id is None and pool.balance_gpu_seconds == 0
    assert vllm.memberships.get(user=alice).role == "owner"


def test_it_refuses_an_account_with_both_a_user_and_a_project(vllm, alice):
    with pytest.raises(IntegrityError), transaction.atomic():
        CreditAccount.objects.create(user=alice, project=vllm)


def test_it_refuses_an_account_with_neither(db):
    with pytest.raises(IntegrityError), transaction.atomic():
        CreditAccount.objects.create()


def test_it_keeps_the_pools_ledger_apart_from_its_members_own(vllm, alice):
    give(alice, 2)
    entry = fund(vllm, 10)

    assert entry.account.project_id == vllm.pk
    assert pool_balance(vllm) == 10 * 3600
    assert balance(alice) == 2 * 3600
    assert LedgerEntry.objects.filter(account__project=vllm).count() == 1


def test_it_refuses_to_rewrite_a_pool_entry(vllm):
    entry = fund(vllm, 1)
    with pytest.raises(Exception, match="append-only|not allowed|UPDATE"), transaction.atomic():
        LedgerEntry.objects.filter(pk=entry.pk).update(gpu_seconds=10)
