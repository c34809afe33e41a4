"""The email preferences page: optional kinds can be turned off and on, mandatory ones cannot, and bad
input changes nothing."""

import pytest
from django.test import Client

from portal.notifications import selectors
from portal.notifications.models import EmailOptOut, Kind

pytestmark = pytest.mark.django_db

PREFERENCES = "/notifications/preferences/"
BOTH = [Kind.CREDIT_LOW_1H.value, Kind.CREDIT_LOW_10M.value]


def opted_out(user):
    return set(EmailOptOut.objects.filter(user=user).values_list("kind", flat=True))


def test_it_shows_every_optional_email_on_by_default_and_lists_the_mandatory_ones(alice_client):
    response = alice_client.get(PREFERENCES)

    page = response.content.decode()
    assert response.status_code == 200
    assert page.count("checked") == 2
    assert "About 1 hour of credit left" in page and "About 10 minutes of credit left" in page
    for kind in (Kind.INSTANCE_STOPPED, Kind.LAUNCH_FAILED, Kind.BONUS_DECISION, Kind.ACCOUNT_SUSPENDED):
        assert kind.label in page
    # Mandatory kinds are listed, not offered as boxes.
    assert 'value="instance_stopped"' not in page


def test_it_turns_optional_emails_off_and_on_again(alice_client, alice):
    response = alice_client.post(PREFERENCES, {"emailed_kinds": [Kind.CREDIT_LOW_10M]})

    assert response.status_code == 302 and response["Location"] == PREFERENCES
    assert opted_out(alice) == {Kind.CREDIT_LOW_1H}
    assert selectors.emailed_kinds(alice) == {Kind.CREDIT_LOW_10M}
    page = alice_client.get(PREFERENCES).content.decode()
    assert "Your email preferences were saved." in page
    assert page.count("checked") == 1

    alice_client.post(PREFERENCES, {})  # nothing ticked
    assert opted_out(alice) == set(BOTH)

    alice_client.post(PREFERENCES, {"emailed_kinds": BOTH})
    assert opted_out(alice) == set()


def test_it_changes_only_the_users_own_preferences(alice_client, alice, bob):
    alice_client.post(PREFERENCES, {})

    assert opted_out(alice) == set(BOTH)
    assert opted_out(bob) == set()


@pytest.mark.parametrize(
    "data",
    [
        {"emailed_kinds": ["bogus"]},
        {"emailed_kinds": [Kind.CREDIT_LOW_1H, "instance_stopped"]},  # a mandatory kind is not a choice
        {"emailed_kinds": ["x" * 5000]},
    ],
)
def test_it_refuses_bad_input_and_changes_nothing(alice_client, alice, data):
    alice_client.post(PREFERENCES, {"emailed_kinds": [Kind.CREDIT_LOW_10M]})
    before = opted_out(alice)

    response = alice_client.post(PREFERENCES, data)

    assert response.status_code == 400
    assert "Select a valid choice" in response.content.decode()
    assert opted_out(alice) == before


def test_it_refuses_a_post_without_the_csrf_token(alice):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(alice)

    response = browser.post(PREFERENCES, {})

    assert response.status_code == 403
    assert opted_out(alice) == set()


def test_it_refuses_other_methods(alice_client):
    assert alice_client.put(PREFERENCES).status_code == 405
