"""Helpers for the notification tests. Personas come from tests/conftest.py."""

import threading
import uuid

import pytest
from django.db import connection

from portal.credits import services as credit_services
from portal.credits.models import LedgerEntry
from portal.credits.selectors import balance_for
from portal.instances.models import Image, Instance

HOUR = 3600


@pytest.fixture
def image(db):
    image, _ = Image.objects.get_or_create(
        key="notif-cpu",
        defaults={"name": "CPU JupyterLab", "sizes": ["1x", "8x"], "reference": "devcloud/cpu:test"},
    )
    return image


def make_instance(user, image, *, size="1x", **fields):
    return Instance.objects.create(user=user, image=image, size=size, **fields)


def spend_to(user, balance_gpu_seconds):
    """Charge usage through the ledger until the balance is `balance_gpu_seconds`. Returns the new balance."""
    owed = balance_for(user) - balance_gpu_seconds
    assert owed > 0, "spend_to only spends"
    credit_services.ledger_post(
        user=user,
        kind=LedgerEntry.Kind.USAGE,
        gpu_seconds=-owed,
        idempotency_key=f"usage:test:{uuid.uuid4()}",
        reason="Test usage",
    )
    return balance_for(user)


def run_together(workers):
    """Run each callable in its own thread (own database connection), released at once by a barrier.

    Returns [("ok", value) | ("error", exception)] in the order of `workers`.
    """
    barrier = threading.Barrier(len(workers))
    results = [None] * len(workers)

    def run(index, work):
        try:
            barrier.wait(timeout=10)
            results[index] = ("ok", work())
        except Exception as error:  # noqa: BLE001 -- handed to the test, which asserts on it
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


