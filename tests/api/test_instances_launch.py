"""POST /api/v1/instances: the same launch service as the page, with its messages, an Idempotency-Key that
launches once, and nothing queued or charged when the request is refused."""

import uuid

import pytest
from django.utils import timezone

from portal.credits.models import LedgerEntry
from portal.instances.models import Instance
from tests.conftest import give

from .conftest import assert_problem, token_for

pytestmark = pytest.mark.django_db
URL = "/api/v1/instances"


@pytest.fixture
def rich_alice(alice):
    give(alice, 25)
    return alice


def test_it_launches_and_answers_the_instance(rich_alice, cpu):
    _, api = token_for(rich_alice)
    answer = api.post(URL, {"size": "1x", "image": "cpu"})
    assert answer.status_code == 201, answer.content
    body = answer.json()
    instance = Instance.objects.get(user=rich_alice)
    assert body["id"] == str(instance.id) and body["short_id"] == str(instance.id)[:8]
    assert body["state"] == "queued" and body["size"] == "1x" and body["image"] == "cpu"
    assert [step["status"] for step in body["steps"]][0] == "current"


@pytest.mark.parametrize(
    ("payload", "field", "message"),
    [
        ({"size": "2x", "image": "cpu"}, "size", "Unknown size '2x'. Choose one of: 1x MI300X, 8x MI300X."),
        (
            {"size": "1x", "image": "tensorflow"},
            "image",
            "Unknown image 'tensorflow'. Choose one of: cpu.",
        ),
        ({"image": "cpu"}, "size", "Choose a size."),
        ({"size": "1x"}, "image", "Choose an image."),
        ({"size": 1, "image": ["cpu"]}, "image", "Not a valid string."),
    ],
)
def test_it_refuses_bad_input_with_the_pages_message_and_queues_nothing(
    rich_alice, cpu, payload, field, message
):
    _, api = token_for(rich_alice)
    entries = LedgerEntry.objects.count()
    body = assert_problem(api.post(URL, payload), 400, kind="validation")
    assert message in body["errors"][field]
    assert message in body["detail"]
    assert not Instance.objects.exists()
    assert LedgerEntry.objects.count() == entries


def test_it_refuses_a_body_that_is_not_json(rich_alice, cpu):
    _, api = token_for(rich_alice)
    answer = api.http.post(URL, "{not json", content_type="application/json", headers=api._headers(None))
    assert_problem(answer, 400, kind="validation")
    assert not Instance.objects.exists()


def test_it_refuses_too_little_credit_with_402_and_the_shortfall(alice, cpu):
    give(alice, 0.1)
    _, api = token_for(alice)
    body = assert_problem(api.post(URL, {"size": "1x", "image": "cpu"}), 402, kind="insufficient-credit")
    assert "GPU-hours short" in body["detail"]
    assert not Instance.objects.exists()


def test_it_refuses_a_suspended_account_as_the_page_does(rich_alice, cpu):
    _, api = token_for(rich_alice)
    type(rich_alice).objects.filter(pk=rich_alice.pk).update(
        suspended_at=timezone.now(), suspended_reason="abuse"
    )
    body = assert_problem(api.post(URL, {"size": "1x", "image": "cpu"}), 403, kind="account-suspended")
    assert body["detail"] == "Your account is suspended: abuse. Contact support to lift it."
    assert not Instance.objects.exists()
    # Reads still work for a suspended account.
    assert api.get("/api/v1/me").json()["suspended"] is True


def test_a_read_scoped_token_cannot_launch(rich_alice, cpu):
    _, api = token_for(rich_alice, scope="read")
    body = assert_problem(api.post(URL, {"size": "1x", "image": "cpu"}), 403, kind="insufficient-scope")
    assert "read and launch" in body["detail"]
    assert not Instance.objects.exists()
    assert api.get(URL).status_code == 200


def test_the_same_idempotency_key_twice_launches_once(rich_alice, cpu):
    _, api = token_for(rich_alice)
    key = str(uuid.uuid4())
    first = api.post(URL, {"size": "1x", "image": "cpu"}, headers={"Idempotency-Key": key})
    again = api.post(URL, {"size": "1x", "image": "cpu"}, headers={"Idempotency-Key": key})
    assert first.status_code == 201
    assert again.status_code == 200 and again["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    assert Instance.objects.filter(user=rich_alice).count() == 1


def test_it_refuses_an_idempotency_key_reused_with_another_body(rich_alice, cpu):
    _, api = token_for(rich_alice)
    key = str(uuid.uuid4())
    api.post(URL, {"size": "1x", "image": "cpu"}, headers={"Idempotency-Key": key})
    body = assert_problem(
        api.post(URL, {"size": "8x", "image": "cpu"}, headers={"Idempotency-Key": key}),
        422,
        kind="idempotency-key-reused",
    )
    assert "different size, image, project, time limit or booking" in body["detail"]
    assert Instance.objects.filter(user=rich_alice).count() == 1


def test_a_launch_with_a_time_limit_answers_its_deadline_and_replays_only_with_the_same_limit(
    rich_alice, cpu
):
    _, api = token_for(rich_alice)
    key = str(uuid.uuid4())
    first = api.post(
        URL, {"size": "1x", "image": "cpu", "stop_after_seconds": 900}, headers={"Idempotency-Key": key}
    )
    again = api.post(
        URL, {"size": "1x", "image": "cpu", "stop_after_seconds": 900}, headers={"Idempotency-Key": key}
    )
    other = api.post(
        URL, {"size": "1x", "image": "cpu", "stop_after_seconds": 60}, headers={"Idempotency-Key": key}
    )

    assert first.status_code == 201, first.content
    deadline = Instance.objects.get(user=rich_alice).deadline_at
    assert first.json()["deadline_at"] == deadline.isoformat().replace("+00:00", "Z")
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    assert_problem(other, 422, kind="idempotency-key-reused")
    assert Instance.objects.filter(user=rich_alice).count() == 1


@pytest.mark.parametrize("seconds", [30, 10**9, "soon"])
def test_it_refuses_a_time_limit_out_of_range_and_queues_nothing(rich_alice, cpu, seconds):
    _, api = token_for(rich_alice)
    body = assert_problem(api.post(URL, {"size": "1x", "image": "cpu", "stop_after_seconds": seconds}), 400)
    assert (
        "stop_after_seconds" in body.get("errors", {})
        or "stop_after_seconds must be between" in body["detail"]
    )
    assert not Instance.objects.exists()


def test_a_refused_launch_leaves_its_key_free_for_the_retry(alice, cpu):
    _, api = token_for(alice)
    key = str(uuid.uuid4())
    assert_problem(api.post(URL, {"size": "1x", "image": "cpu"}, headers={"Idempotency-Key": key}), 402)
    give(alice, 25)
    assert api.post(URL, {"size": "1x", "image": "cpu"}, headers={"Idempotency-Key": key}).status_code == 201


def test_keys_are_per_person(rich_alice, bob, cpu):
    give(bob, 25)
    key = "same-key"
    _, alice_api = token_for(rich_alice)
    _, bob_api = token_for(bob)
    alice_api.post(URL, {"size": "1x", "image": "cpu"}, headers={"Idempotency-Key": key})
    answer = bob_api.post(URL, {"size": "1x", "image": "cpu"}, headers={"Idempotency-Key": key})
    assert answer.status_code == 201
    assert Instance.objects.get(user=bob).id != Instance.objects.get(user=rich_alice).id


def test_without_a_key_each_request_launches(rich_alice, cpu):
    _, api = token_for(rich_alice)
    api.post(URL, {"size": "1x", "image": "cpu"})
    api.post(URL, {"size": "1x", "image": "cpu"})
    assert Instance.objects.filter(user=rich_alice).count() == 2


def test_it_refuses_an_overlong_idempotency_key(rich_alice, cpu):
    _, api = token_for(rich_alice)
    body = assert_problem(
        api.post(URL, {"size": "1x", "image": "cpu"}, headers={"Idempotency-Key": "k" * 201}), 400
    )
    assert "Idempotency-Key" in body["errors"]
    assert not Instance.objects.exists()


def test_it_refuses_a_launch_over_the_live_instance_limit_with_409(rich_alice, cpu):
    from portal.instances.models import LaunchPolicy

    LaunchPolicy.current()
    LaunchPolicy.objects.update(max_live_instances=1)
    _, api = token_for(rich_alice)
    api.post(URL, {"size": "1x", "image": "cpu"})
    body = assert_problem(api.post(URL, {"size": "1x", "image": "cpu"}), 409, kind="instance-limit")
    assert "the limit is 1 at once" in body["detail"]
    assert Instance.objects.filter(user=rich_alice).count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("with_key", [True, False])
def test_a_queue_outage_answers_503_charges_nothing_and_frees_the_key(alice, cpu, monkeypatch, with_key):
    from portal.instances import services as instance_services

    give(alice, 25)
    entries = LedgerEntry.objects.count()
    monkeypatch.setattr(instance_services, "enqueue", lambda *args, **kwargs: False)
    _, api = token_for(alice)
    headers = {"Idempotency-Key": "retry-me"} if with_key else {}
    body = assert_problem(
        api.post(URL, {"size": "1x", "image": "cpu"}, headers=headers), 503, kind="unavailable"
    )
    assert "nothing was charged" in body["detail"].lower() or "Nothing was charged" in body["detail"]
    assert LedgerEntry.objects.count() == entries
    assert Instance.objects.get(user=alice).state == Instance.State.FAILED
    monkeypatch.undo()
    if with_key:
        # The key was not spent on the launch that never started: the retry launches.
        assert api.post(URL, {"size": "1x", "image": "cpu"}, headers=headers).status_code == 201
