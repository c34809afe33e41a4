"""A developer's whole journey, with nothing stood in: launch from the page, a real worker provisions on
the real Docker engine, JupyterLab runs code through the gateway, the ledger charges GPUs × ready
seconds, stop tears it down, and the next launch finds the workspace file again."""

import pytest
from django.urls import reverse
from django.utils import timezone

from portal.credits.selectors import balance_for
from portal.instances import lifecycle
from portal.instances.models import Instance
from tests.conftest import give
from tests.gateway.helpers import browser, session_cookie_for

from .helpers import (
    containers_of,
    gateway_status,
    live_minors,
    register_host,
    run_in_kernel,
    usage_charged,
    wait_for,
    wait_until_ready_for,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(120, func_only=True),
]


def seconds(delta) -> int:
    return int(delta.total_seconds())


def launch_from_the_page(client) -> str:
    response = client.post(reverse("instances:launch"), {"size": "1x", "image": "cpu"})
    assert response.status_code == 302, response.content.decode()[:2000]
    return response.url.rstrip("/").rsplit("/", 1)[-1]


def wait_for_page_state(client, instance_id, state: str, timeout: float = 90) -> dict:
    """Polls the status JSON the instance page polls, until it shows `state`; returns it."""
    url = reverse("instances:status", args=[instance_id])
    seen = {}

    def reached():
        seen.update(client.get(url).json())
        if seen["is_final"] and seen["state"] != state:
            raise AssertionError(f"the launch ended {seen['state']}: {seen['failure_reason']}")
        return seen["state"] == state

    try:
        wait_for(reached, timeout=timeout, what=f"the page to say {state}", interval=0.1)
    except AssertionError as error:
        raise AssertionError(
            f"{error}; last seen {seen.get('state')}/{seen.get('step')}: {seen.get('events')}"
        )
    return dict(seen)


def test_it_launches_runs_code_through_the_gateway_charges_stops_and_keeps_the_workspace(
    client, alice, e2e_cloud, e2e_dev_root, e2e_images, e2e_gateway
):
    register_host("gpu-e2e-01", e2e_dev_root.path)
    give(alice, 25)
    balance_before = balance_for(alice)
    session_key = session_cookie_for(client, alice)

    with e2e_cloud.worker() as worker:
        instance_id = launch_from_the_page(client)
        status = wait_for_page_state(client, instance_id, "running")

        # "Open JupyterLab" goes through the gateway, which sends the owner on to the lab.
        with browser(e2e_gateway, session_key) as owner:
            opened = owner.get(status["lab_url"])
        assert opened.status_code in (302, 303), opened.text[:500]
        assert opened.headers["location"].endswith(f"/instances/{instance_id}/lab/")
        assert {step["status"] for step in status["steps"]} == {"done"}
        assert [event["step"] for event in status["events"]] == [
            "queued",
            "allocating",
            "starting",
            "waiting",
            "ready",
        ]
        assert gateway_status(e2e_gateway, session_key, instance_id).status_code == 200
        outputs = run_in_kernel(
            e2e_gateway,
            session_key,
            instance_id,
            "open('/workspace/hello.txt', 'w').write('hi')",
            "print(6*7)",
        )
        assert outputs == ["", "42\n"]
        # A beat tick while it runs: the stop must charge only what the tick did not.
        wait_until_ready_for(Instance.objects.get(pk=instance_id), 1.5)
        assert lifecycle.meter_tick().instances_charged == 1
        minors = live_minors(instance_id)
        assert len(minors) == 1 and len(containers_of(instance_id)) == 1

        before_stop = timezone.now()
        response = client.post(reverse("instances:stop", args=[instance_id]))
        after_stop = timezone.now()
        assert response.status_code == 302
        wait_for_page_state(client, instance_id, "stopped", timeout=60)

        assert containers_of(instance_id) == []
        assert live_minors(instance_id) == []
        stopped = Instance.objects.get(pk=instance_id)
        charged = usage_charged(instance_id)
        # 1 GPU × the whole seconds from ready to the stop request: the tick and the stop split it exactly.
        assert charged == stopped.charged_gpu_seconds > 0
        assert seconds(before_stop - stopped.ready_at) <= charged <= seconds(after_stop - stopped.ready_at)
        assert balance_for(alice) == balance_before - charged
        # Its JupyterLab is gone: 409 "not running", or 502 while the gateway still remembers (for up
        # to its decision cache's few seconds) that the owner was let in.
        assert gateway_status(e2e_gateway, session_key, instance_id).status_code in (409, 502)

        relaunched_id = launch_from_the_page(client)
        wait_for_page_state(client, relaunched_id, "running")
        [kept] = run_in_kernel(
            e2e_gateway, session_key, relaunched_id, "print(open('/workspace/hello.txt').read())"
        )

        assert kept == "hi\n"
        assert "provisioning.provision_instance" in worker.log()
