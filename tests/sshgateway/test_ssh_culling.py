"""An open SSH session is use: idle culling leaves the instance alone while someone is connected, and
its idle clock starts when they disconnect."""

import subprocess
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from portal.instances.culling import cull_idle
from portal.instances.models import Instance, LaunchPolicy
from portal.notifications.models import Kind, Notification
from portal.sshgateway.models import SshSession
from tests.support.docker_instances import wait_for_jupyter

from .conftest import add_key

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.timeout(300, func_only=True)]


def wait_for_session(instance, *, ended: bool, timeout: float = 20) -> SshSession:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        session = SshSession.objects.filter(instance=instance, ended_at__isnull=not ended).first()
        if session:
            return session
        time.sleep(0.1)
    raise AssertionError(f"no {'ended' if ended else 'open'} SSH session of {instance.short_id}")


def test_an_open_ssh_session_keeps_an_idle_instance_from_being_culled(alice, keygen, ssh_as, launch):
    LaunchPolicy.current()
    LaunchPolicy.objects.update(idle_minutes={"1x": 30, "8x": 30}, idle_grace_minutes=10)
    key = keygen("alice-laptop")
    add_key(alice, key, "laptop")
    instance = launch(alice)
    wait_for_jupyter(instance.driver_state["endpoint"], instance)
    # Ready three hours ago, and nobody has touched JupyterLab since it started.
    Instance.objects.filter(pk=instance.pk).update(ready_at=timezone.now() - timedelta(hours=3))
    three_hours_on = timezone.now() + timedelta(hours=3)
    working = subprocess.Popen(
        [*ssh_as(key).args(), f"developer@{instance.short_id}", "sleep 120"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_session(instance, ended=False)
        while_connected = cull_idle(now=three_hours_on)
        warned_while_connected = Notification.objects.filter(kind=Kind.INSTANCE_IDLE_WARNING).count()
    finally:
        working.terminate()
        working.wait(timeout=10)
    wait_for_session(instance, ended=True)

    after_disconnecting = cull_idle(now=three_hours_on)

    assert (while_connected.busy, while_connected.warned) == (1, 0)
    assert warned_while_connected == 0
    # Once the session is over, nothing keeps the instance: three hours later it is idle and warned.
    assert after_disconnecting.warned == 1
    assert Instance.objects.get(pk=instance.pk).state == Instance.State.RUNNING
