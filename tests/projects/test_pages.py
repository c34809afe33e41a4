"""The project pages as people see them: the owner's page (people, invitations, pool, limits form, usage,
live instances with Stop), a member's, a stranger's 404, the invitation page, and "Pay from" on the
launch page."""

import re

import pytest
from django.core import mail
from django.test import Client

from portal.instances import services as instance_services
from portal.instances.models import Instance
from portal.projects.models import Project
from tests.conftest import text

from .conftest import fund

pytestmark = pytest.mark.usefixtures("cloud")


def browser(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_owner_sees_people_invitations_pool_limits_usage_and_live_instances(vllm, alice, bob, cpu):
    fund(vllm, 10)
    bobs = instance_services.instance_launch(user=bob, size="1x", image_key="cpu", project="vllm")

    page = browser(alice).get("/projects/vllm/")

    assert page.status_code == 200
    seen = text(page)
    assert "10.00 GPU-hours" in seen and "bob@example.com" in seen and "you are owner" in seen
    assert 'data-testid="invite-form"' in page.content.decode()
    assert 'data-testid="limits-form"' in page.content.decode()
    assert "Usage" in seen and "Nothing used yet." in seen
    assert f"/projects/vllm/instances/{bobs.id}/stop/" in page.content.decode()


def test_a_member_sees_the_pool_and_limits_but_no_owner_controls(vllm, alice, bob, cpu):
    fund(vllm, 10)
    alices = instance_services.instance_launch(user=alice, size="1x", image_key="cpu", project="vllm")

    page = browser(bob).get("/projects/vllm/")

    html = page.content.decode()
    assert page.status_code == 200 and "10.00 GPU-hours" in text(page)
    assert "invite-form" not in html and "limits-form" not in html and "Usage" not in text(page)
    assert f"/instances/{alices.id}/stop/" not in html
    assert "Leave vLLM" in text(page)


def test_a_stranger_gets_404_for_the_project_and_for_stopping_its_instance(vllm, triton, alice, dave, cpu):
    fund(vllm, 10)
    alices = instance_services.instance_launch(user=alice, size="1x", image_key="cpu", project="vllm")
    daves = browser(dave)

    assert daves.get("/projects/vllm/").status_code == 404
    assert daves.post(f"/projects/vllm/instances/{alices.id}/stop/").status_code == 404
    # Through his own project's address it is not triton's instance: 404 too, and it keeps running.
    daves.post(f"/projects/triton/instances/{alices.id}/stop/")
    assert Instance.objects.get(pk=alices.pk).state == "queued"


def test_the_owner_stops_a_members_instance_from_the_page(vllm, alice, bob, cpu):
    fund(vllm, 10)
    bobs = instance_services.instance_launch(user=bob, size="1x", image_key="cpu", project="vllm")

    answer = browser(alice).post(f"/projects/vllm/instances/{bobs.id}/stop/", follow=True)

    assert "Stopping" in text(answer)
    assert Instance.objects.get(pk=bobs.pk).stop_reason == "project_owner"


def test_a_member_cannot_change_the_limits_from_a_forged_form(vllm, bob):
    answer = browser(bob).post(
        "/projects/vllm/limits/",
        {
            "max_live_instances": 50,
            "max_run_hours": "4",
            "allowed_sizes": ["1x"],
            "member_monthly_cap_hours": "0",
        },
    )
    assert answer.status_code == 403
    assert Project.objects.get(pk=vllm.pk).max_live_instances == 2


def test_the_owner_saves_limits_in_hours(vllm, alice):
    answer = browser(alice).post(
        "/projects/vllm/limits/",
        {
            "max_live_instances": 3,
            "max_run_hours": "1.5",
            "allowed_sizes": ["1x"],
            "member_monthly_cap_hours": "20",
        },
        follow=True,
    )
    assert "Limits saved." in text(answer)
    vllm.refresh_from_db()
    assert (vllm.max_live_instances, vllm.max_run_seconds, vllm.member_monthly_cap_gpu_seconds) == (
        3,
        5400,
        72000,
    )


def test_removing_a_member_from_the_page_stops_their_project_instance(vllm, alice, bob, cpu):
    fund(vllm, 10)
    bobs = instance_services.instance_launch(user=bob, size="1x", image_key="cpu", project="vllm")

    answer = browser(alice).post(f"/projects/vllm/members/{bob.pk}/remove/", follow=True)

    assert "1 of their project instance(s) stopped" in text(answer)
    assert Instance.objects.get(pk=bobs.pk).stop_reason == "removed_from_project"
    assert browser(bob).get("/projects/vllm/").status_code == 404


def test_the_last_owner_is_told_they_cannot_leave(vllm, alice):
    answer = browser(alice).post(f"/projects/vllm/members/{alice.pk}/remove/", follow=True)
    assert "The last owner cannot be removed" in text(answer)


def test_an_invitation_from_the_page_is_emailed_and_joins_the_invitee(
    vllm, alice, django_capture_on_commit_callbacks
):
    from tests.conftest import make_user

    erin = make_user("erin@example.com")
    with django_capture_on_commit_callbacks(execute=True):
        sent = browser(alice).post(
            "/projects/vllm/invite/", {"email": "erin@example.com", "role": "member"}, follow=True
        )
    assert "Invitation sent to erin@example.com" in text(sent) and "erin@example.com as member" in text(sent)
    link = re.search(r"(/projects/invitations/[^/\s]+/)", mail.outbox[0].body).group(1)

    stranger = browser(make_user("mallory@example.com")).post(link, {"decision": "accept"})
    assert stranger.status_code == 400 and "This invitation is for erin@example.com" in text(stranger)

    erins = browser(erin)
    assert "Join vLLM" in text(erins.get(link))
    joined = erins.post(link, {"decision": "accept"}, follow=True)
    assert "You joined vLLM" in text(joined)
    assert vllm.memberships.filter(user=erin, role="member").exists()


def test_the_launch_page_offers_to_pay_from_my_projects_and_launches_for_one(vllm, bob, cpu, triton):
    fund(vllm, 10)
    bobs = browser(bob)

    page = bobs.get("/instances/")
    assert "Pay from" in text(page) and "vLLM" in text(page) and "Triton" not in text(page)
    assert "10.00 GPU-hours" in text(page)

    launched = bobs.post("/instances/launch/", {"size": "1x", "image": "cpu", "project": "vllm"})
    assert launched.status_code == 302
    assert Instance.objects.get(user=bob).project == vllm


def test_the_launch_page_refuses_a_project_i_am_not_in(vllm, triton, bob, cpu):
    answer = browser(bob).post("/instances/launch/", {"size": "1x", "image": "cpu", "project": "triton"})
    assert answer.status_code == 400 and "You are not in that project" in text(answer)
    assert not Instance.objects.exists()


def test_the_launch_page_shows_no_pay_from_to_someone_in_no_project(alice, cpu):
    assert "Pay from" not in text(browser(alice).get("/instances/"))


def test_my_projects_page_lists_mine_and_creates_one(vllm, bob):
    bobs = browser(bob)
    assert "vLLM" in text(bobs.get("/projects/"))
    created = bobs.post("/projects/", {"slug": "rocm-tools", "name": "ROCm tools"}, follow=True)
    assert "Created ROCm tools" in text(created)
    assert Project.objects.get(slug="rocm-tools").memberships.get(user=bob).role == "owner"


def test_every_field_of_the_project_pages_and_pay_from_has_a_unique_id_and_a_label_for_it(vllm, alice, cpu):
    for path in ("/projects/vllm/", "/instances/", "/projects/"):
        html = browser(alice).get(path).content.decode()
        ids = re.findall(r'<(?:input|select|textarea)[^>]*\bid="([^"]+)"', html)
        assert len(ids) == len(set(ids)), path
        for field_id in ids:
            assert f'for="{field_id}"' in html, (path, field_id)
    # The owner's page has both of its forms' fields, told apart by their prefixes.
    owners_page = browser(alice).get("/projects/vllm/").content.decode()
    assert 'id="id_invite_email"' in owners_page and 'id="id_limits_max_live_instances"' in owners_page


def test_the_instance_list_says_the_projects_pool_ran_out_not_my_credit(vllm, bob, cpu):
    fund(vllm, 10)
    instance = instance_services.instance_launch(user=bob, size="1x", image_key="cpu", project="vllm")
    Instance.objects.filter(pk=instance.pk).update(state="stopped", stop_reason="credits_exhausted")

    page = text(browser(bob).get("/instances/"))

    assert "vLLM's pool ran out" in page and "your own credit was not touched" in page
    assert "Your credits ran out" not in page
