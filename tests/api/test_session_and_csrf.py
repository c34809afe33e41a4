"""The API accepts the portal session, as the browser sends it, with CSRF enforced on unsafe methods."""

import pytest
from django.test import Client

from portal.instances.models import Instance
from tests.conftest import give

from .conftest import assert_problem

pytestmark = pytest.mark.django_db


@pytest.fixture
def browser(alice):
    give(alice, 25)
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    return client


def test_the_session_reads_without_a_csrf_token(browser):
    assert browser.get("/api/v1/me").json()["email"] == "alice@example.com"


def test_a_launch_without_the_csrf_token_is_refused(browser, cpu):
    body = assert_problem(
        browser.post("/api/v1/instances", {"size": "1x", "image": "cpu"}, content_type="application/json"),
        403,
        kind="csrf",
    )
    assert "CSRF" in body["detail"]
    assert not Instance.objects.exists()


def test_a_launch_with_the_csrf_token_works(browser, cpu):
    browser.get("/accounts/settings/")
    token = browser.cookies["csrftoken"].value
    answer = browser.post(
        "/api/v1/instances",
        {"size": "1x", "image": "cpu"},
        content_type="application/json",
        headers={"X-CSRFToken": token},
    )
    assert answer.status_code == 201, answer.content
