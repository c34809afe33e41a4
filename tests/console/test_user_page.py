"""One page per user for operators: ledger, instances and bonus applications together, with the suspend
button; developers (alice) and staff without the permission cannot open it."""

import re
import uuid

from django.test import Client

from portal.credits import services as credits
from portal.credits.models import BonusProgram
from portal.instances.models import Instance

from .conftest import launch, make_host

HOUR = 3600


def user_page(user):
    return f"/admin/accounts/user/{user.pk}/change/"


def section(response, testid) -> str:
    """The HTML of the element marked data-testid=`testid`, up to its table's end."""
    html = response.content.decode()
    return html.split(f'data-testid="{testid}"', 1)[1].split("</table>", 1)[0]


def test_it_shows_the_ledger_instances_and_applications_on_one_page(alice, bob, olivia, olivia_client, image):
    credits.credits_adjust(
        user=alice,
        gpu_seconds=10 * HOUR,
        reason="Workshop voucher",
        actor=olivia,
        idempotency_key=str(uuid.uuid4()),
    )
    program, _ = BonusProgram.objects.get_or_create(
        slug="rocm-star", defaults={"name": "ROCm Star developer certificate", "max_gpu_seconds": 50 * HOUR}
    )
    credits.bonus_apply(user=alice, program=program, evidence="ROCM-STAR-0042")
    host = make_host("gpu-07")
    running = launch(alice, image, state=Instance.State.RUNNING, gpus=list(host.gpus.all()[:1]))
    Instance.objects.filter(pk=running.pk).update(host=host)
    failed = launch(alice, image, state=Instance.State.FAILED, size="8x")
    Instance.objects.filter(pk=failed.pk).update(failure_reason="The image could not be pulled.")
    stopped = launch(alice, image, state=Instance.State.STOPPED)
    Instance.objects.filter(pk=stopped.pk).update(stop_reason="idle")
    bobs = launch(bob, image, state=Instance.State.RUNNING)

    response = olivia_client.get(user_page(alice))

    assert response.status_code == 200
    ledger = section(response, "ledger")
    assert "Workshop voucher" in ledger and "+10.00" in ledger
    instances = section(response, "instances")
    rows = re.findall(r"<tr data-state=.*?</tr>", instances, re.S)
    assert len(rows) == 3
    assert f'href="/admin/instances/instance/{running.pk}/change/"' in instances
    running_row = next(row for row in rows if running.short_id in row)
    assert "Running" in running_row and "gpu-07" in running_row and "CPU test" in running_row
    assert "The image could not be pulled." in next(row for row in rows if failed.short_id in row)
    assert "8x" in next(row for row in rows if failed.short_id in row)
    assert "idle" in next(row for row in rows if stopped.short_id in row)
    assert bobs.short_id not in instances
    assert "ROCM-STAR-0042" in response.content.decode()
    assert f"/admin/accounts/user/{alice.pk}/suspend/" in response.content.decode()


def test_the_link_to_all_instances_lists_only_that_users(alice, bob, olivia_client, image):
    mine = launch(alice, image, state=Instance.State.STOPPED)
    bobs = launch(bob, image, state=Instance.State.STOPPED)
    page = olivia_client.get(user_page(alice)).content.decode()
    link = re.search(r'href="(/admin/instances/instance/\?q=[^"]+)">All instances of this user', page).group(
        1
    )

    listing = olivia_client.get(link.replace("&amp;", "&")).content.decode()

    assert mine.short_id in listing and bobs.short_id not in listing


def test_a_user_without_instances_says_so(alice, olivia_client):
    assert "No instances yet." in olivia_client.get(user_page(alice)).content.decode()


def test_alice_cannot_open_a_user_page(alice, bob):
    browser = Client()
    browser.force_login(alice)

    for url in (user_page(bob), user_page(alice), f"/admin/accounts/user/{bob.pk}/launch-sizes/"):
        response = browser.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/admin/login/"), url


def test_staff_without_the_permission_cannot_open_it(alice, oscar):
    browser = Client()
    browser.force_login(oscar)

    assert browser.get(user_page(alice)).status_code == 403
    assert browser.get(f"/admin/accounts/user/{alice.pk}/suspend/").status_code == 403
