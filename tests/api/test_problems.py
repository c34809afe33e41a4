"""Every error is an RFC 9457 problem, also for paths and methods the API does not have."""

import pytest

from .conftest import assert_problem, token_for

pytestmark = pytest.mark.django_db


def test_an_unknown_path_is_a_problem_not_the_html_page(alice):
    _, api = token_for(alice)
    assert_problem(api.get("/api/v1/nothing-here"), 404, kind="not-found")
    assert_problem(api.get("/api/v1/instances/not-a-uuid"), 404, kind="not-found")


def test_a_wrong_method_is_a_problem(alice):
    _, api = token_for(alice)
    assert_problem(api.delete("/api/v1/me"), 405, kind="method-not-allowed")


def test_a_body_that_is_not_json_is_a_415_problem(alice):
    _, api = token_for(alice)
    answer = api.http.post(
        "/api/v1/ssh-keys",
        "name=x",
        content_type="application/x-www-form-urlencoded",
        headers=api._headers(None),
    )
    assert_problem(answer, 415, kind="unsupported-media-type")


def test_a_request_without_a_token_says_how_to_send_one(client, db):
    body = assert_problem(client.get("/api/v1/me"), 401, kind="unauthenticated")

    assert "Authorization: Bearer <token>" in body["detail"]
    assert "devcloud login" in body["detail"]
