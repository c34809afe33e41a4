"""GET /api/v1/instances[/<id>], POST .../stop and GET .../logs: the owner's instances, through the pages'
services."""

import pytest

from portal.instances import services
from portal.instances.models import Instance
from provisioning.drivers import fake
from tests.conftest import give

from .conftest import assert_problem, token_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def instance(alice, cpu):
    give(alice, 25)
    return services.instance_launch(user=alice, size="1x", image_key="cpu")


def test_it_lists_and_gets_the_owners_instances(alice, instance):
    _, api = token_for(alice, scope="read")
    listed = api.get("/api/v1/instances").json()
    assert [row["id"] for row in listed] == [str(instance.id)]
    one = api.get(f"/api/v1/instances/{instance.id}").json()
    assert one["state"] == "queued" and one["lab_url"] == ""


def test_it_stops_an_instance_and_a_second_stop_is_a_409(alice, instance):
    _, api = token_for(alice)
    answer = api.post(f"/api/v1/instances/{instance.id}/stop")
    assert answer.status_code == 202
    assert answer.json()["state"] == "stopped"
    instance.refresh_from_db()
    assert instance.state == Instance.State.STOPPED
    body = assert_problem(api.post(f"/api/v1/instances/{instance.id}/stop"), 409, kind="instance-ended")
    assert body["detail"] == "This instance has already stopped."


def test_a_read_scoped_token_cannot_stop(alice, instance):
    _, api = token_for(alice, scope="read")
    assert_problem(api.post(f"/api/v1/instances/{instance.id}/stop"), 403, kind="insufficient-scope")
    instance.refresh_from_db()
    assert instance.state == Instance.State.QUEUED


def test_logs_of_a_queued_instance_say_why_there_are_none(alice, instance):
    _, api = token_for(alice, scope="read")
    body = api.get(f"/api/v1/instances/{instance.id}/logs").json()
    assert body == {"lines": [], "note": "No container: the instance never got a host."}


def test_logs_hide_the_jupyter_token(alice, instance, monkeypatch):
    host = fake.make_host()
    Instance.objects.filter(pk=instance.pk).update(host=host, state=Instance.State.RUNNING)
    token = instance.jupyter_token
    printed = "\n".join([f"line {n}" for n in range(5)] + [f"http://127.0.0.1:8888/lab?token={token}"])
    monkeypatch.setattr(fake.FakeDriver, "logs", lambda self, inst, tail=100: printed, raising=False)
    _, api = token_for(alice, scope="read")
    body = api.get(f"/api/v1/instances/{instance.id}/logs", {"lines": 3}).json()
    assert body["lines"] == ["line 3", "line 4", "http://127.0.0.1:8888/lab?token=[token hidden]"]
    assert token not in str(body)


def test_logs_refuse_a_bad_line_count(alice, instance):
    _, api = token_for(alice, scope="read")
    body = assert_problem(api.get(f"/api/v1/instances/{instance.id}/logs", {"lines": 0}), 400)
    assert "lines" in body["errors"]
