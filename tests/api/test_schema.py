"""/api/schema/ serves the OpenAPI schema and /api/docs/ the interactive page, its JavaScript served by the
portal itself (the sidecar package), never a CDN. Schemathesis then calls every operation with generated
data as an authenticated script: no 500s, and every answer conforms to the schema."""

import pytest
import schemathesis
from django.contrib.staticfiles import finders
from django.core import signals
from django.core.cache import caches
from django.db import close_old_connections
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from portal.wsgi import application
from tests.conftest import give

from .conftest import token_for

pytestmark = pytest.mark.django_db


def test_it_serves_the_schema(client, db):
    answer = client.get("/api/schema/", {"format": "json"})
    assert answer.status_code == 200
    paths = answer.json()["paths"]
    assert {
        "/api/v1/me",
        "/api/v1/instances",
        "/api/v1/instances/{instance_id}/logs",
        "/api/v1/ssh-keys",
    } <= set(paths)


def test_the_docs_page_loads_its_script_from_the_portal(client, db):
    page = client.get("/api/docs/").content.decode()
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js" in page
    assert "cdn" not in page.lower()
    # The file ships in the sidecar package, so collectstatic (and whitenoise) serve it.
    assert finders.find("drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js")


@pytest.fixture
def wsgi_in_test_transaction(db):
    """Schemathesis calls the WSGI app directly; keep Django from closing the test's connection after each
    request, as Django's own test client does."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


# The schema /api/schema/ serves (test_it_serves_the_schema checks that it does), built the same way but
# without a request: collecting tests may not touch the database.
schema = schemathesis.openapi.from_dict(SchemaGenerator().get_schema(request=None, public=True))


@pytest.fixture
def script(alice, settings):
    """A launch-scoped token of a person with credit and an image, and a rate limit out of the way."""
    from provisioning.drivers import fake

    settings.API_RATE_PER_TOKEN = "100000/min"
    caches["ratelimit"].clear()
    give(alice, 25)
    fake.make_image("cpu", sizes=["1x", "8x"])
    return token_for(alice)[1].token_text


@schema.parametrize()
@hypothesis_settings(
    max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True
)
def test_every_operation_conforms_to_the_schema(case, script, wsgi_in_test_transaction):
    case.call_and_validate(
        app=application,
        headers={"Authorization": f"Bearer {script}"},
        checks=[
            not_a_server_error,
            status_code_conformance,
            content_type_conformance,
            response_schema_conformance,
        ],
    )
