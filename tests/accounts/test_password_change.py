import pytest
from django.contrib.auth import SESSION_KEY

from portal.accounts.models import User
from tests.conftest import PASSWORD

CHANGE = "/accounts/settings/password/"
NEW = "another long passphrase"


def test_it_changes_the_password_and_keeps_the_session(alice_client, alice):
    response = alice_client.post(
        CHANGE, {"old_password": PASSWORD, "new_password1": NEW, "new_password2": NEW}, follow=True
    )

    assert response.redirect_chain == [("/accounts/settings/", 302)]
    assert "Your password was changed." in response.content.decode()
    alice.refresh_from_db()
    assert alice.check_password(NEW)
    # Still logged in: the session was re-signed with the new password hash.
    assert alice_client.get("/accounts/settings/").status_code == 200
    assert alice_client.session[SESSION_KEY] == str(alice.pk)


@pytest.mark.parametrize(
    "data, error",
    [
        ({}, "This field is required."),
        (
            {"old_password": "wrong", "new_password1": NEW, "new_password2": NEW},
            "Your old password was entered incorrectly.",
        ),
        ({"old_password": PASSWORD, "new_password1": "short", "new_password2": "short"}, "too short"),
        (
            {"old_password": PASSWORD, "new_password1": "1234567890123", "new_password2": "1234567890123"},
            "entirely numeric",
        ),
        ({"old_password": PASSWORD, "new_password1": NEW, "new_password2": NEW + "x"}, "didn’t match"),
    ],
    ids=["empty", "wrong-old", "short", "numeric", "mismatch"],
)
def test_it_refuses_bad_input_and_keeps_the_password(alice_client, alice, data, error):
    response = alice_client.post(CHANGE, data)

    assert response.status_code == 200
    assert error in response.content.decode().replace("&#x27;", "'")
    alice.refresh_from_db()
    assert alice.check_password(PASSWORD)


def test_an_account_made_with_github_sets_a_first_password(client):
    github_user = User.objects.create_user("gh@example.com", None)
    client.force_login(github_user)

    page = client.get(CHANGE).content.decode()
    assert "Set a password" in page and "Old password" not in page
    client.post(CHANGE, {"new_password1": NEW, "new_password2": NEW})

    github_user.refresh_from_db()
    assert github_user.check_password(NEW)
