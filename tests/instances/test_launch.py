"""instance_launch: who may launch what, the credit check (also under concurrency), and a broker outage."""

import threading

import kombu.pools
import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import connection
from django.utils import timezone

from portal.accounts.models import User
from portal.credits.models import LedgerEntry
from portal.instances import services
from portal.instances.models import Instance
from provisioning.drivers import fake
from tests.conftest import balance, give
from tests.support.worker import celery_publishing_to, unique_queue

pytestmark = pytest.mark.usefixtures("cloud")


@pytest.fixture
def kombu_pools_reset():
    # celery_publishing_to force-closes the default broker's connection pool but leaves it in kombu's
    # global registry, so later publishes (even eager ones, which borrow a producer) would hit
    # "Acquire on closed pool". Dropping every pool afterwards lets the next publish build fresh ones.
    yield
    kombu.pools.reset()


HOUR = 3600


@pytest.fixture(autouse=True)
def launch_needs_15_credit_minutes(settings):
    settings.LAUNCH_MIN_CREDIT_MINUTES = 15


@pytest.fixture
def cpu(db):
    return fake.make_image("cpu", sizes=["1x", "8x"])


@pytest.fixture
def rich_alice(alice):
    give(alice, 25)
    return alice


def test_it_queues_a_launch_with_a_secret_token_and_charges_nothing(rich_alice, cpu):
    before = balance(rich_alice)

    instance = services.instance_launch(user=rich_alice, size="1x", image_key="cpu")

    instance.refresh_from_db()
    assert instance.state == Instance.State.QUEUED
    assert instance.user == rich_alice and instance.size == "1x" and instance.image == cpu
    assert len(instance.jupyter_token) == 48
    assert instance.driver == "fake"
    assert instance.metered_until is None
    assert [e.message for e in instance.events.all()] == ["Launch of CPU on 1x MI300X queued."]
    assert balance(rich_alice) == before


def test_it_gives_every_launch_its_own_token(rich_alice, cpu):
    first = services.instance_launch(user=rich_alice, size="1x", image_key="cpu")
    second = services.instance_launch(user=rich_alice, size="1x", image_key="cpu")
    assert first.jupyter_token != second.jupyter_token


@pytest.mark.parametrize(
    ("size", "image_key", "message"),
    [
        ("2x", "cpu", "Unknown size '2x'. Choose one of: 1x MI300X, 8x MI300X."),
        ("", "cpu", "Unknown size ''"),
        ("1x", "tensorflow", "Unknown image 'tensorflow'"),
        ("1x", "", "Unknown image ''"),
    ],
)
def test_it_refuses_unknown_sizes_and_images(rich_alice, cpu, size, image_key, message):
    with pytest.raises(ValidationError) as refused:
        services.instance_launch(user=rich_alice, size=size, image_key=image_key)
    assert message in refused.value.messages[0]
    assert not Instance.objects.exists()


def test_it_refuses_a_disabled_image(rich_alice, cpu):
    fake.make_image("jax", enabled=False, name="JAX")
    with pytest.raises(ValidationError, match="The JAX image is switched off by the operators right now"):
        services.instance_launch(user=rich_alice, size="1x", image_key="jax")
    assert not Instance.objects.exists()


def test_it_refuses_a_size_the_image_does_not_allow(rich_alice, cpu):
    fake.make_image("sglang", sizes=["8x"], name="SGLang")
    with pytest.raises(
        ValidationError, match="The SGLang image cannot run on 1x MI300X; it runs on 8x MI300X"
    ):
        services.instance_launch(user=rich_alice, size="1x", image_key="sglang")
    assert not Instance.objects.exists()


def test_it_refuses_an_unverified_user(charlie, cpu):
    give(charlie, 25)
    with pytest.raises(ValidationError, match="Confirm your email address before launching"):
        services.instance_launch(user=charlie, size="1x", image_key="cpu")
    assert not Instance.objects.exists()


def test_it_refuses_a_disabled_account(rich_alice, cpu):
    User.objects.filter(pk=rich_alice.pk).update(is_active=False)
    rich_alice.refresh_from_db()
    with pytest.raises(PermissionDenied):
        services.instance_launch(user=rich_alice, size="1x", image_key="cpu")
    assert not Instance.objects.exists()


def test_it_refuses_too_little_credit_and_says_how_much_is_missing(alice, cpu):
    give(alice, 0.2)  # 12 minutes of one GPU
    entries = LedgerEntry.objects.count()

    with pytest.raises(ValidationError) as refused:
        services.instance_launch(user=alice, size="1x", image_key="cpu")

    assert refused.value.messages == [
        (
            "A 1x MI300X launch needs at least 0.25 GPU-hours (15 minutes at 1 GPU-hour per hour); you have 0.20. "
            "You are 0.05 GPU-hours short."
        )
    ]
    assert not Instance.objects.exists()
    assert LedgerEntry.objects.count() == entries
    assert balance(alice) == int(0.2 * HOUR)


def test_it_launches_with_exactly_the_minimum(alice, cpu):
    give(alice, 0.25)
    assert services.instance_launch(user=alice, size="1x", image_key="cpu").state == Instance.State.QUEUED


def test_it_prices_the_minimum_by_size(alice, cpu):
    alice.extra_sizes = ["8x"]  # an operator opened 8x to her; the price is what is checked here
    alice.save(update_fields=["extra_sizes"])
    give(alice, 1)  # enough for 1x, not for 15 minutes of 8 GPUs (2 GPU-hours)
    with pytest.raises(ValidationError, match="A 8x MI300X launch needs at least 2.00 GPU-hours"):
        services.instance_launch(user=alice, size="8x", image_key="cpu")
    assert services.instance_launch(user=alice, size="1x", image_key="cpu").size == "1x"


def test_it_counts_what_the_users_other_live_instances_will_burn(alice, cpu):
    give(alice, 0.4)  # 24 minutes: one 1x launch holds 15 of them
    services.instance_launch(user=alice, size="1x", image_key="cpu")

    with pytest.raises(ValidationError) as refused:
        services.instance_launch(user=alice, size="1x", image_key="cpu")

    assert "you have 0.15 after what your other instances will use in that time" in refused.value.messages[0]
    assert Instance.objects.filter(user=alice).count() == 1


def test_it_counts_running_time_not_yet_charged(alice, cpu):
    give(alice, 0.55)  # 33 minutes
    running = services.instance_launch(user=alice, size="1x", image_key="cpu")
    # Running for 4 minutes since its last charge: 15 + 4 of the 33 minutes are spoken for, 14 remain.
    Instance.objects.filter(pk=running.pk).update(
        state=Instance.State.RUNNING, metered_until=timezone.now() - timezone.timedelta(minutes=4)
    )
    with pytest.raises(ValidationError, match="you have 0.23 after what your other instances"):
        services.instance_launch(user=alice, size="1x", image_key="cpu")


def test_it_ignores_instances_that_ended(alice, cpu):
    give(alice, 0.3)
    first = services.instance_launch(user=alice, size="1x", image_key="cpu")
    Instance.objects.filter(pk=first.pk).update(state=Instance.State.STOPPED)
    assert services.instance_launch(user=alice, size="1x", image_key="cpu").state == Instance.State.QUEUED


def test_it_limits_how_many_instances_a_person_runs_at_once(rich_alice, cpu, settings):
    settings.MAX_LIVE_INSTANCES_PER_USER = 1
    services.instance_launch(user=rich_alice, size="1x", image_key="cpu")
    with pytest.raises(ValidationError, match="You already have 1 instances running or starting"):
        services.instance_launch(user=rich_alice, size="1x", image_key="cpu")


def test_it_keeps_sizes_the_operators_reserved_for_bonus_holders(rich_alice, cpu, settings):
    settings.SIZES_REQUIRING_BONUS = ["8x"]
    with pytest.raises(ValidationError, match="8x MI300X opens once an operator approves"):
        services.instance_launch(user=rich_alice, size="8x", image_key="cpu")
    assert services.instance_launch(user=rich_alice, size="1x", image_key="cpu").size == "1x"


def test_it_does_not_let_bob_launch_on_alices_credit(rich_alice, bob, cpu):
    with pytest.raises(ValidationError, match="you have 0.00"):
        services.instance_launch(user=bob, size="1x", image_key="cpu")


@pytest.mark.django_db(transaction=True)
def test_it_lets_exactly_one_of_two_concurrent_launches_through_when_credit_covers_one():
    alice = User.objects.create_user("alice@example.com", "pw-alice-0123", email_verified_at=timezone.now())
    fake.make_image("cpu")
    give(alice, 0.4)  # 24 minutes: one launch's 15, not two
    barrier = threading.Barrier(2)
    outcomes = []

    def launch():
        try:
            barrier.wait(timeout=10)
            services.instance_launch(user=alice, size="1x", image_key="cpu")
            outcomes.append("launched")
        except ValidationError as error:
            outcomes.append(error.messages[0])
        finally:
            connection.close()

    threads = [threading.Thread(target=launch) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    assert outcomes.count("launched") == 1
    assert next(o for o in outcomes if o != "launched").startswith(
        "A 1x MI300X launch needs at least 0.25 GPU-hours"
    )
    assert Instance.objects.filter(user=alice).count() == 1
    assert balance(alice) == int(0.4 * HOUR)


@pytest.mark.django_db(transaction=True)
def test_it_fails_the_launch_clearly_when_the_task_queue_is_down(kombu_pools_reset):
    alice = User.objects.create_user("alice@example.com", "pw-alice-0123", email_verified_at=timezone.now())
    fake.make_image("cpu")
    give(alice, 25)
    before = balance(alice)

    # Nothing listens on port 1: the publish is refused, as when Redis is down.
    with (
        celery_publishing_to(broker_url="redis://127.0.0.1:1/14", queue=unique_queue("orch-down")),
        pytest.raises(services.LaunchUnavailable) as refused,
    ):
        services.instance_launch(user=alice, size="1x", image_key="cpu")

    assert refused.value.messages == [services.UNAVAILABLE_MESSAGE]
    assert "nothing was charged" in services.UNAVAILABLE_MESSAGE
    instance = Instance.objects.get(user=alice)
    assert instance.state == Instance.State.FAILED
    assert "Nothing was charged" in instance.failure_reason
    assert balance(alice) == before
