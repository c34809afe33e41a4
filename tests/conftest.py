"""Shared personas: alice and bob are verified developers, charlie is unverified, olivia is an operator."""

import pytest
from django.utils import timezone

from portal.accounts.models import User

PASSWORD = "correct horse battery staple"


def make_user(email, *, verified=True, staff=False, **extra):
    user = User.objects.create_user(
        email,
        PASSWORD,
        email_verified_at=timezone.now() if verified else None,
        is_staff=staff,
        is_superuser=staff,
        **extra,
    )
    return user


@pytest.fixture
def alice(db):
    return make_user("alice@example.com", first_name="Alice")


@pytest.fixture
def bob(db):
    return make_user("bob@example.com", first_name="Bob")


@pytest.fixture
def charlie(db):
    return make_user("charlie@example.com", verified=False, first_name="Charlie")


@pytest.fixture
def olivia(db):
    return make_user("olivia@ops.example.com", staff=True, first_name="Olivia", last_name="Operator")


@pytest.fixture
def alice_client(client, alice):
    client.force_login(alice)
    return client
