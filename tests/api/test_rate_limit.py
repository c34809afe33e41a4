"""Each token has its own request rate: one busy script cannot use up another's."""

import pytest

from .conftest import assert_problem, token_for

pytestmark = pytest.mark.django_db


def test_it_limits_requests_per_token(alice, settings):
    settings.API_RATE_PER_TOKEN = "3/min"
    _, busy = token_for(alice, name="busy")
    _, other = token_for(alice, name="other")
    for _ in range(3):
        assert busy.get("/api/v1/me").status_code == 200
    answer = busy.get("/api/v1/me")
    assert_problem(answer, 429, kind="rate-limited")
    assert int(answer["Retry-After"]) > 0
    # Another token of the same person still has its own allowance.
    assert other.get("/api/v1/me").status_code == 200
