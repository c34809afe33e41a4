"""A fleet leaves the machine as it found it, and a new fleet removes what a crashed one left behind."""

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support.fleet import CERTS_D, FLEET_ROOT, Fleet, _cmdline, _run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180, func_only=True)]

CRASHING_FLEET = """
import os, sys, time, django
django.setup()
from tests.support.fleet import Fleet
fleet = Fleet.start(hosts=1)
print(fleet.slot, fleet.hosts[0].pid, flush=True)
time.sleep(600)
"""


def traces_of(slot: int) -> list[str]:
    """Everything of `slot` still on the machine: links, addresses, routes, namespaces, processes,
    mounts, the certs.d entry, root-namespace firewall rules, the slot's directory."""
    subnets = tuple(f"10.231.{slot * 32 + n}." for n in range(32))
    names = (f"dcf{slot}h", f"dcf{slot}reg", f"dcfleet-s{slot}-")
    directory = str(FLEET_ROOT / f"slot-{slot}")
    lines = []
    for command in (["ip", "-o", "link"], ["ip", "-o", "addr"], ["ip", "route"], ["ip", "netns", "list"]):
        lines += _run(*command).stdout.splitlines()
    lines += _run("iptables-save").stdout.splitlines()
    lines += open("/proc/self/mountinfo").read().splitlines()
    lines += [f"process {pid}: {_cmdline(int(pid))}" for pid in os.listdir("/proc") if pid.isdigit()]
    found = [line for line in lines if any(name in line for name in names + subnets + (directory,))]
    found += [str(path) for path in CERTS_D.glob("10.231.*") if path.name.startswith(subnets)]
    if os.path.exists(directory):
        found.append(directory)
    return found


def test_it_leaves_nothing_of_a_stopped_fleet_on_the_machine(fleet):
    with Fleet.start(hosts=2) as other:
        slot = other.slot
        assert traces_of(slot), "the check below must see a running fleet"

    assert traces_of(slot) == []


def test_it_removes_what_a_crashed_fleet_left_in_its_slot(fleet):
    crashing = subprocess.Popen(
        [sys.executable, "-c", CRASHING_FLEET],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "portal.settings.test", "PYTHONPATH": os.getcwd()},
    )
    slot, dockerd_pid = (int(word) for word in crashing.stdout.readline().split())
    crashing.send_signal(signal.SIGKILL)
    crashing.wait()
    # What a crash leaves: its engine still runs, its namespace and links are still there.
    assert os.path.exists(f"/proc/{dockerd_pid}")
    assert traces_of(slot)

    with Fleet.start(hosts=1, slot=slot) as again:
        assert len(again.hosts) == 1
        assert again.hosts[0].pid != dockerd_pid

    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{dockerd_pid}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{dockerd_pid}")
    assert traces_of(slot) == []
