"""The launch form's shared half (policy, images, hosts, programs) is read once every few seconds per web
process, not on every page: what a busy instance list costs the database is the person's own rows. A
change an operator makes shows at once in the process that made it and within the cache's seconds in the
others, and a launch never trusts the cached copy."""

import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from pytest_django.asserts import assertContains, assertNotContains

from portal.credits import services as credits
from portal.instances import selectors
from portal.instances.models import Image, Instance
from provisioning.drivers import fake
from provisioning.models import HostImage

pytestmark = pytest.mark.django_db

CATALOGUE_TABLES = ("instances_image", "instances_launchpolicy", "provisioning_gpuhost", "credits_bonusprogram")


@pytest.fixture(autouse=True)
def cached_catalogue(settings, monkeypatch):
    settings.DEVCLOUD_DRIVER = "fake"
    fake.install()
    settings.LAUNCH_CATALOGUE_CACHE_SECONDS = 30
    clock = {"now": 1000.0}
    monkeypatch.setattr(selectors.time, "monotonic", lambda: clock["now"])
    selectors.forget_launch_catalogue()
    yield clock
    selectors.forget_launch_catalogue()


@pytest.fixture
def launch_page(client, alice):
    credits.credits_adjust(
        user=alice, gpu_seconds=10 * 3600, reason="Test credit", actor=None, idempotency_key=str(uuid.uuid4())
    )
    host = fake.make_host("gpu-01")
    for key, name in (("cpu", "CPU JupyterLab"), ("pytorch", "PyTorch")):
        image = fake.make_image(key, name=name)
        HostImage.objects.create(host=host, reference=image.reference, present=True, checked_at=timezone.now())
    client.force_login(alice)
    return client


def _catalogue_queries(captured) -> list[str]:
    return [q["sql"] for q in captured.captured_queries if any(f'FROM "{t}"' in q["sql"] for t in CATALOGUE_TABLES)]


def test_a_second_look_at_the_instance_list_reads_none_of_the_shared_catalogue_again(launch_page):
    launch_page.get("/instances/")

    with CaptureQueriesContext(connection) as captured:
        page = launch_page.get("/instances/")

    assertContains(page, "PyTorch")
    assert _catalogue_queries(captured) == []


def test_an_image_disabled_elsewhere_leaves_the_page_within_the_cache_seconds_and_cannot_be_launched_meanwhile(
    launch_page, cached_catalogue
):
    assertContains(launch_page.get("/instances/"), 'value="pytorch"')
    # Another web process (or the console in one) disables it: no signal reaches this process.
    Image.objects.filter(key="pytorch").update(is_enabled=False)

    assertContains(launch_page.get("/instances/"), 'value="pytorch"')
    refused = launch_page.post("/instances/launch/", {"size": "1x", "image": "pytorch"})
    assert refused.status_code == 400
    assert not Instance.objects.exists()

    cached_catalogue["now"] += 31
    assertNotContains(launch_page.get("/instances/"), 'value="pytorch"')


def test_a_change_saved_in_this_process_shows_on_the_next_page_at_once(launch_page):
    assertContains(launch_page.get("/instances/"), "PyTorch")
    image = Image.objects.get(key="pytorch")
    image.name = "PyTorch 2.9"
    image.save()

    assertContains(launch_page.get("/instances/"), "PyTorch 2.9")


def test_a_busy_instance_list_reads_the_database_eight_times(launch_page, alice):
    # Session, user, live instances, ended ones, the account, the bonus applications (tier and what a
    # closed size's refusal says), the projects the person may pay from (with their pools' balances), the
    # notifications' unread count: the live instances are read once for the list and what they burn, and
    # the applications once for the tier and the refusal.
    for _ in range(2):
        launch_page.post("/instances/launch/", {"size": "1x", "image": "cpu"})
    now = timezone.now()
    assert Instance.objects.filter(user=alice).update(state=Instance.State.RUNNING, metered_until=now) == 2
    launch_page.get("/instances/")

    with CaptureQueriesContext(connection) as captured:
        page = launch_page.get("/instances/")

    assertContains(page, "8x MI300X opens once an operator approves one of your bonus-hour applications")
    assert len(captured) == 8, "\n".join(query["sql"][:150] for query in captured.captured_queries)
