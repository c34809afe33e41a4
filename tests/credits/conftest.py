"""Helpers for the credit tests. Personas come from tests/conftest.py."""

import pytest
from django.test import Client

from portal.credits.models import BonusProgram, LedgerEntry

HOUR = 3600


def entries_of(user):
    return LedgerEntry.objects.filter(account__user=user)


def shown_messages(response):
    return [str(message) for message in response.context["messages"]]


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    # Argon2 costs about a second per persona on this machine; nothing here tests password hashing
    # (tests/accounts does), so the credit tests use a cheap hasher.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def rocm_star(db):
    """The program seeded by migration 0003."""
    return BonusProgram.objects.get(slug="rocm-star")


@pytest.fixture
def hackathon(db):
    return BonusProgram.objects.create(name="MI300X hackathon", slug="hackathon", max_gpu_seconds=30 * HOUR)


@pytest.fixture
def charlie_client(charlie):
    client = Client()
    client.force_login(charlie)
    return client
