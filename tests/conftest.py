"""Shared personas: alice and bob are verified developers, charlie is unverified, olivia is the superuser who
runs the console, otto is an operator (staff in the Operators group, nothing more), oscar is staff without
any permission."""

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


def make_staff(email, *permissions):
    """Staff holding exactly `permissions` ("app_label.codename"), for tests of who may do what."""
    from django.contrib.auth.models import Permission

    user = make_user(email)
    user.is_staff = True
    user.save(update_fields=["is_staff"])
    for name in permissions:
        app_label, codename = name.split(".", 1)
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
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
def otto(db):
    """An operator as the console means it: staff, and exactly the "Operators" group."""
    from django.contrib.auth.models import Group, Permission

    from portal.console.operators import operators_group_seed

    otto = make_user("otto@ops.example.com", first_name="Otto", last_name="Operator")
    otto.is_staff = True
    otto.save(update_fields=["is_staff"])
    # get-or-create: a transactional test may have flushed the group the migration made.
    otto.groups.set([operators_group_seed(Group, Permission)])
    return otto


@pytest.fixture
def otto_client(otto):
    from django.test import Client

    browser = Client()
    browser.force_login(otto)
    return browser


@pytest.fixture
def oscar(db):
    """Staff without any permission: may open the console, may do nothing in it."""
    oscar = make_user("oscar@ops.example.com", first_name="Oscar")
    oscar.is_staff = True
    oscar.save(update_fields=["is_staff"])
    return oscar


@pytest.fixture
def alice_client(client, alice):
    client.force_login(alice)
    return client


def _is_transactional(request) -> bool:
    marker = request.node.get_closest_marker("django_db")
    if marker is not None and marker.kwargs.get("transaction"):
        return True
    return bool({"transactional_db", "live_server"} & set(request.fixturenames))


@pytest.fixture(autouse=True)
def seeded_programs_after_flush(request):
    """A transactional test starts from a database the previous one emptied (Django flushes it, and
    serialized_rollback clashes with the content types Django re-creates). Put back what the migrations
    seed, so every test sees a freshly migrated database."""
    if _is_transactional(request):
        request.getfixturevalue("_django_db_helper")
        from django.contrib.auth.models import Group, Permission

        from portal.console.operators import operators_group_seed
        from portal.credits.models import BonusProgram, SignupGrantProgram
        from portal.credits.seed import seed_programs

        seed_programs(SignupGrantProgram, BonusProgram)
        operators_group_seed(Group, Permission)


@pytest.fixture(autouse=True)
def celery_runs_tasks_inline_by_default():
    """Celery reads CELERY_TASK_ALWAYS_EAGER once, on first use. If that first use happens inside a test
    that turned it off, every later test would publish to Redis instead of running tasks inline."""
    from django.conf import settings as django_settings

    from portal.celery import app

    eager = django_settings.CELERY_TASK_ALWAYS_EAGER
    app.conf.task_always_eager = eager
    yield
    app.conf.task_always_eager = eager
