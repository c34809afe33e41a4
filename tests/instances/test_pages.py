"""The instance pages: the launch form with prices and shortfalls, launch and stop from the browser, and
the live progress JSON the instance page polls."""

import re

import kombu.pools
import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from portal.accounts.models import User
from portal.instances import lifecycle
from portal.instances.models import Instance
from provisioning.drivers import fake
from tests.conftest import give, text
from tests.support.worker import celery_publishing_to, unique_queue

pytestmark = pytest.mark.usefixtures("cloud")


@pytest.fixture
def kombu_pools_reset():
    # celery_publishing_to force-closes the default broker's connection pool but leaves it in kombu's
    # global registry, so later publishes (even eager ones, which borrow a producer) would hit
    # "Acquire on closed pool". Dropping every pool afterwards lets the next publish build fresh ones.
    yield
    kombu.pools.reset()


@pytest.fixture
def images(db):
    fake.make_host("gpu-01")
    return [
        fake.make_image("cpu", name="CPU JupyterLab"),
        fake.make_image("sglang", sizes=["8x"], name="SGLang"),
    ]


def launch_button(response) -> str:
    return re.search(r'<button[^>]*data-testid="launch"[^>]*>', response.content.decode()).group(0)


def test_it_shows_each_size_with_its_price_and_how_long_the_balance_lasts(alice_client, alice, images):
    give(alice, 25)

    response = alice_client.get(reverse("instances:list"))

    page = text(response)
    assert "1x MI300X" in page and "8x MI300X" in page
    assert "1 GPU-hour per hour · your balance lasts 25 h 00 min at this size" in page
    assert "8 GPU-hours per hour · your balance lasts 3 h 07 min at this size" in page
    assert "CPU JupyterLab" in page and "SGLang" in page
    assert "disabled" not in launch_button(response)


def test_it_disables_launch_and_explains_the_shortfall(alice_client, alice, images):
    give(alice, 0.1)

    response = alice_client.get(reverse("instances:list"))

    assert "disabled" in launch_button(response)
    assert (
        "A 1x MI300X launch needs at least 0.25 GPU-hours (15 minutes at 1 GPU-hour per hour); you have 0.10. "
        "You are 0.15 GPU-hours short." in text(response)
    )
    assert "Apply for bonus hours" in text(response)


def test_it_explains_why_a_bigger_size_is_out_of_reach(alice_client, alice, images):
    give(alice, 1)

    response = alice_client.get(reverse("instances:list"))

    assert "disabled" not in launch_button(response)
    assert re.search(r'value="8x"\s+disabled', response.content.decode())
    assert "A 8x MI300X launch needs at least 2.00 GPU-hours" in text(response)


def test_an_unverified_user_is_told_to_confirm_their_email(client, charlie, images):
    give(charlie, 25)
    client.force_login(charlie)
    response = client.get(reverse("instances:list"))
    assert "disabled" in launch_button(response)
    assert "Confirm your email address to launch instances." in text(response)


def test_it_launches_from_the_form_and_follows_to_the_progress_page(alice_client, alice, images):
    give(alice, 25)

    response = alice_client.post(reverse("instances:launch"), {"size": "1x", "image": "cpu"})

    instance = Instance.objects.get(user=alice)
    assert response.status_code == 302
    assert response["Location"] == reverse("instances:detail", args=[instance.id])
    page = alice_client.get(response["Location"])
    assert "Launch queued. This page follows its progress." in text(page)
    assert f'data-status-url="{reverse("instances:status", args=[instance.id])}"' in page.content.decode()
    assert "Allocating GPUs" in text(page) and "Waiting for JupyterLab" in text(page)


@pytest.mark.parametrize(
    ("form", "message"),
    [
        ({"size": "3x", "image": "cpu"}, "Unknown size &#x27;3x&#x27;"),
        ({"size": "1x", "image": "nope"}, "Unknown image &#x27;nope&#x27;"),
        ({"size": "1x", "image": "sglang"}, "The SGLang image cannot run on 1x MI300X"),
        ({"image": "cpu"}, "Choose a size."),
        ({"size": "1x"}, "Choose an image."),
    ],
)
def test_it_answers_bad_input_with_a_clear_error_and_queues_nothing(
    alice_client, alice, images, form, message
):
    give(alice, 25)
    response = alice_client.post(reverse("instances:launch"), form)
    assert response.status_code == 400
    assert message in response.content.decode()
    assert not Instance.objects.exists()


def test_it_refuses_a_launch_without_the_csrf_token(alice, images):
    give(alice, 25)
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    assert client.post(reverse("instances:launch"), {"size": "1x", "image": "cpu"}).status_code == 403
    assert not Instance.objects.exists()


def test_the_progress_json_follows_the_instance_to_ready(alice_client, alice, images):
    give(alice, 25)
    alice_client.post(reverse("instances:launch"), {"size": "1x", "image": "cpu"})
    instance = Instance.objects.get(user=alice)
    url = reverse("instances:status", args=[instance.id])

    queued = alice_client.get(url)
    assert queued["Cache-Control"].startswith("max-age=0")
    queued = queued.json()
    assert (queued["state"], queued["step"], queued["queue_position"]) == ("queued", "queued", 1)
    assert [s["status"] for s in queued["steps"]] == ["current", "todo", "todo", "todo", "todo"]
    assert queued["lab_url"] == "" and queued["can_stop"] is True

    lifecycle.instance_provision(instance_id=instance.id)
    ready = alice_client.get(url).json()

    assert (ready["state"], ready["step"], ready["queue_position"]) == ("running", "ready", None)
    assert [s["status"] for s in ready["steps"]] == ["done"] * 5
    assert ready["lab_url"] == f"/instances/{instance.id}/open"
    assert [e["step"] for e in ready["events"]] == ["queued", "allocating", "starting", "waiting", "ready"]
    token = Instance.objects.get(pk=instance.pk).jupyter_token
    assert token not in alice_client.get(url).content.decode()
    assert token not in alice_client.get(reverse("instances:detail", args=[instance.id])).content.decode()
    assert token not in alice_client.get(reverse("instances:list")).content.decode()


def test_a_failed_launch_says_why_on_its_page(alice_client, alice, images, cloud):
    give(alice, 25)
    alice_client.post(reverse("instances:launch"), {"size": "1x", "image": "cpu"})
    instance = Instance.objects.get(user=alice)
    cloud.behave(permanent_start_error="The image is broken.")
    lifecycle.instance_provision(instance_id=instance.id)

    status = alice_client.get(reverse("instances:status", args=[instance.id])).json()
    page = text(alice_client.get(reverse("instances:detail", args=[instance.id])))

    assert status["state"] == "failed" and status["is_final"] is True
    assert "The image is broken. Nothing was charged." in status["failure_reason"]
    assert [s["status"] for s in status["steps"]] == ["done", "done", "failed", "todo", "todo"]
    assert "The image is broken. Nothing was charged." in page


def test_the_list_offers_jupyterlab_and_stop_for_a_running_instance(alice_client, alice, images):
    give(alice, 25)
    alice_client.post(reverse("instances:launch"), {"size": "1x", "image": "cpu"})
    instance = Instance.objects.get(user=alice)
    lifecycle.instance_provision(instance_id=instance.id)

    response = alice_client.get(reverse("instances:list"))

    html = response.content.decode()
    assert f'href="/instances/{instance.id}/open"' in html and "Open JupyterLab" in html
    assert f'action="{reverse("instances:stop", args=[instance.id])}"' in html


def test_it_stops_from_the_page(alice_client, alice, images):
    give(alice, 25)
    alice_client.post(reverse("instances:launch"), {"size": "1x", "image": "cpu"})
    instance = Instance.objects.get(user=alice)
    lifecycle.instance_provision(instance_id=instance.id)

    response = alice_client.post(reverse("instances:stop", args=[instance.id]), follow=True)

    assert "Stopping. Billing has stopped; your /workspace files are kept." in text(response)
    assert Instance.objects.get(pk=instance.pk).state == Instance.State.STOPPING


def test_the_list_says_when_credits_ran_out(alice_client, alice, images):
    give(alice, 25)
    alice_client.post(reverse("instances:launch"), {"size": "1x", "image": "cpu"})
    instance = Instance.objects.get(user=alice)
    Instance.objects.filter(pk=instance.pk).update(
        state=Instance.State.STOPPED, stop_reason="credits_exhausted", stopped_at=timezone.now()
    )

    page = text(alice_client.get(reverse("instances:list")))

    assert "Your credits ran out." in page
    assert f"DevCloud stopped your 1x instance {instance.short_id}" in page
    assert "DevCloud stopped it because your credits ran out." in page


@pytest.mark.django_db(transaction=True)
def test_launch_says_it_is_unavailable_while_redis_is_down_and_pages_still_render(client, kombu_pools_reset):
    alice = User.objects.create_user("alice@example.com", "pw-alice-0123", email_verified_at=timezone.now())
    give(alice, 25)
    fake.make_image("cpu")
    client.force_login(alice)

    with celery_publishing_to(broker_url="redis://127.0.0.1:1/15", queue=unique_queue("orch-down")):
        assert client.get(reverse("instances:list")).status_code == 200
        response = client.post(reverse("instances:launch"), {"size": "1x", "image": "cpu"})

    assert response.status_code == 503
    assert "Launching is unavailable right now, nothing was charged." in text(response)
    assert Instance.objects.get(user=alice).state == Instance.State.FAILED


def test_how_long_the_balance_lasts_counts_the_instances_already_running(alice_client, alice, images):
    give(alice, 10)
    alice_client.post(reverse("instances:launch"), {"size": "1x", "image": "cpu"})
    lifecycle.instance_provision(instance_id=Instance.objects.get(user=alice).id)
    # Charged up to now, so the figures below do not depend on how long this test takes.
    Instance.objects.filter(user=alice).update(metered_until=timezone.now() + timezone.timedelta(minutes=5))

    page = text(alice_client.get(reverse("instances:list")))

    # 10 GPU-hours shared by the running 1x and a new one: 5 hours; with a new 8x: 10 / 9 hours.
    assert "your balance lasts 5 h 00 min at this size, next to your other instances" in page
    assert "your balance lasts 1 h 06 min at this size, next to your other instances" in page


def test_the_instance_page_says_how_much_disk_its_size_may_use(alice_client, alice, images, settings):
    settings.DEVCLOUD_WORKSPACE_GB = {"1x": 100, "8x": 500}
    settings.DEVCLOUD_CONTAINER_DISK_GB = {"1x": 50}
    give(alice, 25)
    alice_client.post(reverse("instances:launch"), {"size": "1x", "image": "cpu"})
    instance = Instance.objects.get(user=alice)

    page = text(alice_client.get(reverse("instances:detail", args=[instance.id])))

    assert "/workspace holds up to 100 GB" in page and "No space left on device" in page
    assert "up to 50 GB elsewhere in the instance" in page


def test_the_instance_page_does_not_promise_a_limit_its_host_could_not_enforce(alice_client, alice, images):
    give(alice, 25)
    alice_client.post(reverse("instances:launch"), {"size": "1x", "image": "cpu"})
    instance = Instance.objects.get(user=alice)
    Instance.objects.filter(pk=instance.pk).update(driver_state={"disk_limits_unenforced": ["workspace"]})

    page = text(alice_client.get(reverse("instances:detail", args=[instance.id])))

    assert "/workspace has no size limit" in page and "holds up to" not in page
    assert "host cannot enforce disk limits" in page
