"""An attacker who types someone's address into the sign-up form must not learn whether it has an
account: the answer for a taken address is the answer for a new one (same status, same page, no session),
and the address's owner is told by email instead."""

import re
import time

import pytest
from django.contrib.auth import SESSION_KEY
from django.test import Client

from portal.accounts.models import User

from .conftest import link_path

pytestmark = pytest.mark.django_db

SIGNUP = "/accounts/signup/"
# The attacker's own choice, not alice's password.
CHOSEN = "a passphrase of my own 42"


def sign_up(browser, email, run_on_commit, password=CHOSEN):
    with run_on_commit():
        started = time.monotonic()
        response = browser.post(SIGNUP, {"email": email, "password": password, "password_confirm": password})
        return response, time.monotonic() - started


def test_the_answer_for_a_taken_address_is_the_answer_for_a_new_one(alice, run_on_commit, mailoutbox):
    taken_browser, new_browser = Client(), Client()

    taken, _ = sign_up(taken_browser, "alice@example.com", run_on_commit)
    new, _ = sign_up(new_browser, "nobody-yet@example.com", run_on_commit)

    assert taken.status_code == new.status_code
    assert taken.get("Location") == new.get("Location")
    same_page = taken.content.decode().replace("alice@example.com", "ADDRESS")
    assert same_page == new.content.decode().replace("nobody-yet@example.com", "ADDRESS")
    assert "already exists" not in taken.content.decode()
    # Neither browser is logged in: being logged in would tell the new address from the taken one.
    assert SESSION_KEY not in taken_browser.session and SESSION_KEY not in new_browser.session
    assert User.objects.filter(email="alice@example.com").count() == 1


def test_the_owner_of_a_taken_address_is_told_by_email_with_a_way_back_in(alice, run_on_commit, mailoutbox):
    sign_up(Client(), "Alice@Example.com", run_on_commit)

    [message] = [m for m in mailoutbox if m.to == ["alice@example.com"]]
    assert "already have" in message.subject.lower()
    assert link_path(message).startswith("/accounts/password/reset/")
    assert "Log in with this address" in message.body


def test_a_taken_address_takes_about_as_long_as_a_new_one(alice, run_on_commit):
    # Hashing the password is the slow part of a sign-up; a taken address must not skip it.
    taken = min(sign_up(Client(), "alice@example.com", run_on_commit)[1] for _ in range(3))
    new = min(sign_up(Client(), f"new{i}@example.com", run_on_commit)[1] for i in range(3))

    assert taken > new * 0.5, (taken, new)


def test_logging_in_with_the_password_just_signed_up_with_tells_nothing_either(alice, run_on_commit):
    # The attacker signs up a taken address and a new one with a password of their own, then tries it.
    answers = []
    for email in ("alice@example.com", "nobody-yet@example.com"):
        browser = Client()
        sign_up(browser, email, run_on_commit)
        answer = browser.post("/accounts/login/", {"username": email, "password": CHOSEN})
        page = re.sub(r'name="csrfmiddlewaretoken" value="[^"]*"', "", answer.content.decode())
        answers.append((answer.status_code, page.replace(email, "ADDRESS")))
        assert SESSION_KEY not in browser.session

    assert answers[0] == answers[1]


def test_the_newcomer_confirms_with_the_password_from_the_emailed_link_and_is_logged_in(
    run_on_commit, mailoutbox
):
    browser = Client()
    sign_up(browser, "dana@example.com", run_on_commit)
    link = link_path(mailoutbox[-1])

    page = browser.get(link).content.decode()
    wrong = browser.post(link, {"password": "not the password at all"})
    logged_in_by_a_wrong_password = bool(browser.session.get(SESSION_KEY))
    with run_on_commit():
        confirmed = browser.post(link, {"password": CHOSEN}, follow=True)

    assert 'id="id_password"' in page
    assert wrong.status_code == 403 and not logged_in_by_a_wrong_password
    assert confirmed.redirect_chain[-1][0] == "/"
    assert "Thank you: dana@example.com is confirmed." in confirmed.content.decode()
    assert User.objects.get(email="dana@example.com").email_verified
    assert browser.session[SESSION_KEY] == str(User.objects.get(email="dana@example.com").pk)
