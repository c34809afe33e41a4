"""deploy/gpu-host-firewall.sh, run for real in a network namespace standing in for a GPU host: a tenant
on an instance bridge (dc-*) reaches a service on the host before it and not after, and a second run
adds nothing."""

import os
import shutil
import subprocess
import sys
import uuid

import pytest

from .kit import DEPLOY

SCRIPT = DEPLOY / "gpu-host-firewall.sh"
CONNECT = """
import socket, sys
try:
    socket.create_connection(("10.251.0.1", 2376), timeout=1).close()
except OSError as error:
    sys.exit(f"refused: {error}")
"""
LISTEN = """
import socket
server = socket.create_server(("10.251.0.1", 2376))
print("listening", flush=True)
while True:
    server.accept()[0].close()
"""


def run(*command, check=True):
    return subprocess.run(command, check=check, capture_output=True, text=True, timeout=30)


@pytest.fixture
def gpu_host():
    """Namespaces `host` (a bridge dc-<hex> at 10.251.0.1 and the chains dockerd makes) and `tenant`
    (10.251.0.2 on that bridge), with a TCP service listening on the host's bridge address."""
    if os.geteuid() != 0 or not shutil.which("iptables") or not shutil.which("ip"):
        pytest.skip("needs root, iptables and ip to build network namespaces")
    suffix = uuid.uuid4().hex[:6]
    host, tenant, bridge = f"dcfw-h-{suffix}", f"dcfw-t-{suffix}", f"dc-{suffix}"
    run("ip", "netns", "add", host)
    run("ip", "netns", "add", tenant)
    listener = None
    try:
        in_host = ("ip", "netns", "exec", host)
        run(*in_host, "ip", "link", "set", "lo", "up")
        run(*in_host, "ip", "link", "add", bridge, "type", "bridge")
        run(*in_host, "ip", "addr", "add", "10.251.0.1/24", "dev", bridge)
        run(*in_host, "ip", "link", "set", bridge, "up")
        run(*in_host, "ip", "link", "add", "veth0", "type", "veth", "peer", "name", "eth0", "netns", tenant)
        run(*in_host, "ip", "link", "set", "veth0", "master", bridge, "up")
        run("ip", "-n", tenant, "addr", "add", "10.251.0.2/24", "dev", "eth0")
        run("ip", "-n", tenant, "link", "set", "eth0", "up")
        # What dockerd sets up: the DOCKER-USER chain, jumped to first from FORWARD.
        run(*in_host, "iptables", "-N", "DOCKER-USER")
        run(*in_host, "iptables", "-I", "FORWARD", "-j", "DOCKER-USER")
        listener = subprocess.Popen([*in_host, sys.executable, "-c", LISTEN], stdout=subprocess.PIPE, text=True)
        assert listener.stdout.readline().strip() == "listening"
        yield host, tenant
    finally:
        if listener is not None:
            listener.kill()
            listener.wait()
        run("ip", "netns", "del", tenant, check=False)
        run("ip", "netns", "del", host, check=False)


def tenant_connects(tenant) -> bool:
    return run("ip", "netns", "exec", tenant, sys.executable, "-c", CONNECT, check=False).returncode == 0


def test_a_tenant_on_an_instance_bridge_cannot_open_a_connection_to_its_host_once_the_script_ran(gpu_host):
    host, tenant = gpu_host
    assert tenant_connects(tenant), "the stand-in host is unreachable even without the firewall"

    installed = run("ip", "netns", "exec", host, "sh", str(SCRIPT))

    assert "added   INPUT -i dc-+" in installed.stdout
    assert not tenant_connects(tenant)


def test_running_it_again_adds_no_second_copy_of_the_rules(gpu_host):
    host, _ = gpu_host
    run("ip", "netns", "exec", host, "sh", str(SCRIPT))
    again = run("ip", "netns", "exec", host, "sh", str(SCRIPT))
    rules = run("ip", "netns", "exec", host, "iptables", "-S").stdout

    assert "added" not in again.stdout
    assert rules.count("-A INPUT -i dc-+ -m conntrack --ctstate NEW -j DROP") == 1
    for network in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"):
        assert rules.count(f"-A DOCKER-USER -d {network} -i dc-+ -m conntrack --ctstate NEW -j DROP") == 1


def test_it_refuses_to_run_before_docker_made_its_chain(gpu_host):
    host, _ = gpu_host
    run("ip", "netns", "exec", host, "iptables", "-D", "FORWARD", "-j", "DOCKER-USER")
    run("ip", "netns", "exec", host, "iptables", "-X", "DOCKER-USER")

    refused = run("ip", "netns", "exec", host, "sh", str(SCRIPT), check=False)

    assert refused.returncode == 1
    assert "start Docker first" in refused.stderr
