"""Start slots on a real Redis: an engine brings up no more instances at once than it has slots, the rest
wait in the order they came, and neither a killed holder nor a vanished waiter blocks the line for good.
Then the launch path: a launch that waits its turn says so on its timeline, and one stopped while it waits
starts nothing."""

import threading
import time
import uuid

import pytest

from portal.console.instrumentation import launch_phases
from portal.instances import lifecycle, services, tasks
from portal.instances.models import Instance
from provisioning import start_slots
from provisioning.drivers import fake
from provisioning.drivers.base import Driver
from tests.conftest import give
from tests.support.worker import redis_url


@pytest.fixture(autouse=True)
def slots_redis(settings):
    """A Redis database of these tests' own, and a portal id no other run shares (the keys carry it)."""
    settings.REDIS_URL = redis_url(11)
    portal_id = settings.DEVCLOUD_PORTAL_ID = f"test-slots-{uuid.uuid4().hex[:8]}"
    client = start_slots._redis()
    yield
    for key in client.scan_iter(f"devcloud:start-slots:{portal_id}:*"):
        client.delete(key)


def line(limit: int) -> start_slots.Line:
    return start_slots.Line(engine=f"tcp://10.0.0.{limit}:2376", limit=limit)


def test_an_engine_starts_no_more_at_once_than_its_slots_and_the_rest_go_in_the_order_they_came():
    engine = line(2)
    inside, most_inside, entered = [0], [0], []
    lock = threading.Lock()

    def launch(number):
        with start_slots.start_slot(engine, f"launch-{number}"):
            with lock:
                inside[0] += 1
                most_inside[0] = max(most_inside[0], inside[0])
                entered.append(number)
            time.sleep(0.5)
            with lock:
                inside[0] -= 1

    threads = []
    for number in range(6):
        threads.append(threading.Thread(target=launch, args=(number,)))
        threads[-1].start()
        time.sleep(0.2)  # arrive one after another, far enough apart for a loaded machine to keep the order
    for thread in threads:
        thread.join(30)

    assert most_inside[0] == 2
    assert entered == [0, 1, 2, 3, 4, 5]


def test_a_waiting_launch_is_told_how_many_start_before_it():
    engine = line(1)
    told = []
    with start_slots.start_slot(engine, "first"):
        waiter = threading.Thread(
            target=lambda: start_slots.start_slot(engine, "second", waiting=told.append).__enter__()
        )
        waiter.start()
        time.sleep(0.6)
        assert told == [1]
    waiter.join(10)
    assert not waiter.is_alive()


def test_a_slot_a_killed_worker_held_frees_itself_when_its_lease_runs_out(settings, monkeypatch):
    # The lease is the readiness wait's deadline plus a margin; both made short here.
    settings.READY_TIMEOUT_SECONDS = 1
    monkeypatch.setattr(start_slots, "LEASE_MARGIN_SECONDS", 0)
    engine = line(1)
    assert start_slots.take(engine, "held-by-a-killed-worker") == 0  # taken, never given back

    started = time.monotonic()
    # Gives up (Cancelled, failing the test) rather than waiting forever for a slot that never frees.
    with start_slots.start_slot(
        engine, "next-launch", wanted=lambda: time.monotonic() < started + 10, check_every=0.5
    ):
        waited = time.monotonic() - started

    assert 0.5 < waited < 5


def test_a_waiter_whose_worker_died_does_not_hold_up_the_launches_behind_it(monkeypatch):
    monkeypatch.setattr(start_slots, "WAITER_TTL_SECONDS", 1)
    engine = line(1)
    assert start_slots.take(engine, "holder") == 0
    assert start_slots.take(engine, "dies-while-waiting") == 1  # in line, then never asks again
    assert start_slots.take(engine, "behind-it") == 2
    start_slots.give_back(engine, "holder")

    started = time.monotonic()
    with start_slots.start_slot(
        engine, "behind-it", wanted=lambda: time.monotonic() < started + 10, check_every=0.5
    ):
        waited = time.monotonic() - started

    assert waited < 5


def test_a_launch_starts_at_once_when_redis_does_not_answer(settings):
    settings.REDIS_URL = "redis://127.0.0.1:9/0"  # nothing listens on the discard port
    ran = []
    with start_slots.start_slot(line(1), "launch"):
        ran.append(True)
    assert ran == [True]


def test_slots_follow_the_engines_cpus_and_zero_turns_the_limit_off(settings):
    settings.LAUNCH_STARTS_PER_CPU = 2
    assert start_slots.slots_for(2) == 4
    assert start_slots.slots_for(128) == 256
    settings.LAUNCH_STARTS_PER_CPU = 0.25
    assert start_slots.slots_for(2) == 1
    settings.LAUNCH_STARTS_PER_CPU = 0
    assert start_slots.slots_for(64) == 0


# --- The launch path ------------------------------------------------------------------------------------


@pytest.fixture
def one_slot_engine(settings, monkeypatch):
    """The fake driver behind an engine with one start slot."""
    settings.DEVCLOUD_DRIVER = "fake"
    settings.READY_TIMEOUT_SECONDS = 20
    cloud = fake.install()
    engine = line(1)
    monkeypatch.setattr(fake.FakeDriver, "start_line", lambda self: engine, raising=False)
    # The launch's own task is run by the test's thread, as a provisioning worker would, not eagerly.
    monkeypatch.setattr(tasks.provision_instance, "apply_async", lambda *args, **kwargs: None)
    return cloud, engine


@pytest.fixture
def launch_behind_an_earlier_one(one_slot_engine, alice):
    """Alice's launch, provisioning in a thread of its own while an earlier launch holds the one slot.
    Returns (instance, outcome list the thread appends to, the thread)."""
    fake.make_host("gpu-01", gpus=8)
    fake.make_image("cpu")
    give(alice, 25)
    instance = services.instance_launch(user=alice, size="1x", image_key="cpu")
    _, engine = one_slot_engine
    assert start_slots.take(engine, "an-earlier-launch") == 0
    outcome = []
    worker = threading.Thread(
        target=lambda: outcome.append(lifecycle.instance_provision(instance_id=instance.id))
    )
    worker.start()
    return instance, outcome, worker


@pytest.mark.django_db(transaction=True)
def test_a_launch_waits_its_turn_with_a_note_on_its_timeline_and_then_runs(
    one_slot_engine, launch_behind_an_earlier_one
):
    cloud, engine = one_slot_engine
    instance, outcome, worker = launch_behind_an_earlier_one
    time.sleep(1.0)
    assert str(instance.id) not in cloud.containers  # not started while the earlier launch holds the slot
    messages = list(Instance.objects.get(pk=instance.pk).events.values_list("message", flat=True))
    assert any("Waiting for its turn to start on gpu-01: 1 launch starts first" in m for m in messages)

    start_slots.give_back(engine, "an-earlier-launch")
    worker.join(30)

    assert outcome == ["running"]
    assert Instance.objects.get(pk=instance.pk).state == Instance.State.RUNNING
    # Its own slot went back once JupyterLab answered: the next launch takes it at once.
    assert start_slots.take(engine, "the-next-launch") == 0
    # The launch metrics time the wait for the slot as a phase of its own, not as part of the start.
    phases = launch_phases(instance.id)
    assert phases["slot"] >= 1.0
    assert phases["start"] < phases["slot"]


@pytest.mark.django_db(transaction=True)
def test_a_launch_stopped_while_it_waits_its_turn_starts_nothing(
    one_slot_engine, launch_behind_an_earlier_one, alice
):
    cloud, engine = one_slot_engine
    instance, outcome, worker = launch_behind_an_earlier_one
    time.sleep(0.5)
    services.instance_stop(user=alice, instance_id=instance.id)
    worker.join(10)

    assert outcome == ["skipped"]
    assert str(instance.id) not in cloud.containers
    assert cloud.count("start") == 0
    # It left the line: with the earlier launch done, a new one is first.
    start_slots.give_back(engine, "an-earlier-launch")
    assert start_slots.take(engine, "a-new-launch") == 0


def test_drivers_without_an_engine_have_no_start_line():
    assert Driver(host=None).start_line() is None
