from datetime import timedelta

import pytest
from django.utils import timezone
from social_django.models import UserSocialAuth

from portal.credits import services
from portal.credits.models import CreditAccount, GrantedIdentity, LedgerEntry, SignupGrantProgram

from ..conftest import make_user
from .conftest import entries_of

HOUR = 3600


@pytest.fixture
def program(db):
    """The early-registrant grant seeded by migration 0003: 25 hours."""
    return SignupGrantProgram.objects.get(name="Early-registrant grant")


def balance_of(user):
    account = CreditAccount.objects.filter(user=user).first()
    return account.balance_gpu_seconds if account else 0


def link_github(user, uid):
    return UserSocialAuth.objects.create(
        user=user, provider="github", uid=str(uid), extra_data={"login": f"gh{uid}"}
    )


def delete_account(user):
    """What deleting an account leaves behind: the row, scrubbed, with its identities gone."""
    user.social_auth.all().delete()
    user.email = f"deleted-{user.pk}@deleted.invalid"
    user.email_verified_at = None
    user.deleted_at = timezone.now()
    user.is_active = False
    user.save()


def test_it_grants_25_hours_to_a_verified_account(alice, program):
    entry = services.credits_grant_signup(user=alice)

    assert (entry.kind, entry.gpu_seconds, entry.reason, entry.actor_name) == (
        "grant",
        25 * HOUR,
        "Early-registrant grant",
        "system",
    )
    assert balance_of(alice) == 25 * HOUR
    program.refresh_from_db()
    assert program.granted_count == 1


def test_it_is_idempotent_when_called_twice(alice, program):
    services.credits_grant_signup(user=alice)

    assert services.credits_grant_signup(user=alice) is None

    assert entries_of(alice).count() == 1
    assert balance_of(alice) == 25 * HOUR
    program.refresh_from_db()
    assert program.granted_count == 1


def test_it_grants_nothing_to_an_unverified_account(charlie, program):
    assert services.credits_grant_signup(user=charlie) is None

    assert balance_of(charlie) == 0
    assert not GrantedIdentity.objects.exists()


@pytest.mark.parametrize(
    "first_email, second_email",
    [
        ("dana.smith@gmail.com", "DanaSmith@gmail.com"),  # Gmail ignores dots and case
        ("dana@example.com", "Dana+devcloud@Example.com"),  # +tags and case
        ("d.a.n.a+gpu@googlemail.com", "dana@gmail.com"),  # googlemail is gmail
    ],
)
def test_it_grants_once_per_person_whose_emails_normalise_the_same(program, first_email, second_email):
    first = make_user(first_email)
    second = make_user(second_email)

    assert services.credits_grant_signup(user=first) is not None
    assert services.credits_grant_signup(user=second) is None

    assert (balance_of(first), balance_of(second)) == (25 * HOUR, 0)
    assert LedgerEntry.objects.filter(kind="grant").count() == 1


def test_it_grants_different_people_separately(alice, bob, program):
    services.credits_grant_signup(user=alice)
    services.credits_grant_signup(user=bob)

    assert (balance_of(alice), balance_of(bob)) == (25 * HOUR, 25 * HOUR)


def test_it_grants_nothing_after_the_account_is_deleted_and_made_again_with_the_same_email(program):
    dana = make_user("dana@example.com")
    services.credits_grant_signup(user=dana)
    delete_account(dana)

    dana_again = make_user("Dana+again@example.com")

    assert services.credits_grant_signup(user=dana_again) is None
    assert balance_of(dana_again) == 0


def test_it_grants_nothing_after_the_account_is_deleted_and_made_again_with_the_same_github_id(program):
    dana = make_user("dana@example.com")
    link_github(dana, 583231)
    services.credits_grant_signup(user=dana)
    delete_account(dana)

    # A new account on another address, logging in with the same GitHub account.
    dana_again = make_user("dana@work.example.com")
    link_github(dana_again, 583231)

    assert services.credits_grant_signup(user=dana_again) is None
    assert balance_of(dana_again) == 0


def test_it_remembers_a_github_id_linked_after_the_grant(program):
    dana = make_user("dana@example.com")
    services.credits_grant_signup(user=dana)
    link_github(dana, 583231)
    assert services.credits_grant_signup(user=dana) is None  # called again after the GitHub login
    delete_account(dana)

    dana_again = make_user("dana@work.example.com")
    link_github(dana_again, 583231)

    assert services.credits_grant_signup(user=dana_again) is None
    assert balance_of(dana_again) == 0


def test_it_grants_nothing_once_the_program_has_closed(alice, program):
    program.open_until = timezone.now() - timedelta(minutes=1)
    program.save()

    assert services.credits_grant_signup(user=alice) is None

    assert balance_of(alice) == 0
    program.refresh_from_db()
    assert program.granted_count == 0


def test_it_grants_while_the_program_is_still_open(alice, program):
    program.open_until = timezone.now() + timedelta(days=1)
    program.save()

    assert services.credits_grant_signup(user=alice) is not None


def test_it_grants_nothing_once_the_program_is_full(alice, bob, program):
    program.max_accounts = 1
    program.save()
    services.credits_grant_signup(user=alice)

    assert services.credits_grant_signup(user=bob) is None

    assert (balance_of(alice), balance_of(bob)) == (25 * HOUR, 0)
    program.refresh_from_db()
    assert program.granted_count == 1


def test_it_grants_nothing_when_the_program_is_switched_off(alice, program):
    program.is_active = False
    program.save()

    assert services.credits_grant_signup(user=alice) is None
    assert balance_of(alice) == 0


def test_it_grants_the_hours_the_operator_configured(alice, program):
    program.gpu_seconds = 30 * HOUR
    program.save()

    services.credits_grant_signup(user=alice)

    assert balance_of(alice) == 30 * HOUR
