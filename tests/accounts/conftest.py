import re

import pytest
from django.conf import settings
from django.core.cache import caches

from portal.credits.models import SignupGrantProgram


@pytest.fixture(autouse=True)
def _fresh_rate_limits(db):
    """Each test starts with no rate-limit counters (a transactional test may have committed some)."""
    caches["ratelimit"].clear()


@pytest.fixture(autouse=True)
def signup_program(db):
    """The seeded early-registrant grant (25 GPU-hours). Re-created if a transactional test flushed it."""
    program, _ = SignupGrantProgram.objects.get_or_create(
        name="Early-registrant grant",
        defaults={"gpu_seconds": settings.SIGNUP_GRANT_GPU_HOURS * 3600, "max_accounts": 10000},
    )
    return program


@pytest.fixture
def run_on_commit(django_capture_on_commit_callbacks):
    """Run the on_commit callbacks (email sending) of whatever happens in the block, as a commit would."""
    return lambda: django_capture_on_commit_callbacks(execute=True)


def link_path(message) -> str:
    """The site-relative path of the one account link in an email (a locmem EmailMessage or a body)."""
    body = message if isinstance(message, str) else message.body
    links = re.findall(re.escape(settings.SITE_URL) + r"(/accounts/\S+)", body)
    assert len(links) == 1, body
    return links[0]
