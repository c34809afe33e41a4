import logging

import pytest
from django.contrib.auth import SESSION_KEY
from django.test import override_settings

from portal.accounts.models import User
from portal.credits.selectors import balance_for
from tests.conftest import PASSWORD
from tests.support.worker import celery_publishing_to

from .conftest import link_path

SIGNUP = "/accounts/signup/"


def form(email="dana@example.com", password=PASSWORD, confirm=None):
    return {
        "email": email,
        "password": password,
        "password_confirm": password if confirm is None else confirm,
    }


def test_it_creates_the_account_and_emails_a_link_without_logging_in(client, run_on_commit, mailoutbox):
    with run_on_commit():
        response = client.post(SIGNUP, form())

    # Not logged in: that would tell a new address from one that has an account.
    assert response.status_code == 200
    assert "We sent an email to <strong>dana@example.com</strong>" in response.content.decode()
    assert SESSION_KEY not in client.session
    user = User.objects.get(email="dana@example.com")
    assert user.password.startswith("argon2")
    assert not user.email_verified
    [message] = mailoutbox
    assert message.to == ["dana@example.com"]
    assert "Confirm your email address" in message.subject
    assert link_path(message).startswith("/accounts/verify/")


def test_an_unconfirmed_session_sees_the_banner_and_holds_no_credit(client, run_on_commit):
    with run_on_commit():
        client.post(SIGNUP, form())
    client.force_login(User.objects.get(email="dana@example.com"))
    response = client.get("/")

    page = response.content.decode()
    assert "Confirm your email address." in page
    assert 'action="/accounts/verify/resend/"' in page
    assert balance_for(User.objects.get(email="dana@example.com")) == 0


def test_it_stores_the_address_in_lower_case(client, run_on_commit):
    with run_on_commit():
        client.post(SIGNUP, form(email="  Dana.Smith@Example.COM "))

    assert User.objects.filter(email="dana.smith@example.com").exists()


@pytest.mark.parametrize("email", ["alice@example.com", "ALICE@Example.com", "Alice@EXAMPLE.COM"])
def test_an_address_that_has_an_account_makes_none_and_tells_its_owner_whatever_its_case(
    client, alice, run_on_commit, mailoutbox, email
):
    with run_on_commit():
        response = client.post(SIGNUP, form(email=email))

    assert response.status_code == 200
    assert "We sent an email to" in response.content.decode()
    assert "already exists" not in response.content.decode()
    assert User.objects.filter(email__iexact="alice@example.com").count() == 1
    assert SESSION_KEY not in client.session
    [message] = mailoutbox
    assert message.to == ["alice@example.com"] and "already have" in message.subject


@pytest.mark.parametrize(
    "data, field, error",
    [
        ({}, "email", "This field is required."),
        ({"email": "", "password": "", "password_confirm": ""}, "password", "This field is required."),
        (form(email="not-an-address"), "email", "Enter a valid email address."),
        (form(email="dana@"), "email", "Enter a valid email address."),
        (
            form(password="Sh0rt!"),
            "password",
            "This password is too short. It must contain at least 10 characters.",
        ),
        (form(password="password123"), "password", "This password is too common."),
        (form(password="83920174650183"), "password", "This password is entirely numeric."),
        (form(email="danasmithers@example.com", password="danasmithers"), "password", "too similar"),
        (form(confirm="correct horse battery stable"), "password_confirm", "The two passwords differ."),
    ],
    ids=[
        "nothing",
        "empty",
        "malformed",
        "no-domain",
        "short",
        "common",
        "numeric",
        "like-email",
        "mismatch",
    ],
)
def test_it_refuses_bad_input_and_creates_nothing(client, mailoutbox, data, field, error):
    response = client.post(SIGNUP, data)

    assert response.status_code == 200
    assert error in " ".join(response.context["form"].errors.get(field, []))
    assert error.replace("'", "&#x27;") in response.content.decode()
    assert not User.objects.exists()
    assert SESSION_KEY not in client.session
    assert mailoutbox == []


def test_it_sends_the_link_inline_when_the_broker_is_down(client, run_on_commit, mailoutbox, caplog):
    # Nothing listens on port 1: publishing fails the way it does when Redis is down.
    with (
        override_settings(CELERY_TASK_ALWAYS_EAGER=False),
        celery_publishing_to(broker_url="redis://127.0.0.1:1/0", queue="acct-unreachable"),
        caplog.at_level(logging.WARNING, logger="portal.accounts.services"),
    ):
        with run_on_commit():
            response = client.post(SIGNUP, form())

    assert response.status_code == 200
    assert User.objects.filter(email="dana@example.com").exists()
    [message] = mailoutbox
    assert message.to == ["dana@example.com"]
    assert "Broker unreachable" in caplog.text


def test_it_sends_a_logged_in_user_to_the_dashboard(alice_client):
    response = alice_client.get(SIGNUP)

    assert response.status_code == 302 and response["Location"] == "/"
