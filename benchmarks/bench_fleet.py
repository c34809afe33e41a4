"""The fleet: a launch on a remote host, and how long it takes to notice a host is down.

Runs on the test fleet (tests/support/fleet.py): a dockerd in a network namespace, reached over mutual TLS
on its private address, registered through provisioning.services.host_register. Needs root and the
fleet's tools; prints why and returns nothing otherwise.

1. Launch on the remote host. The portal's path in this process: `services.instance_launch`, whose
   provision task runs inline here (allocation, the container made over TLS, the wait for JupyterLab's
   first 200), timed from the call to the instance running; no queue or worker hop. Against it, in the
   same run and alternating: a plain container on that same engine, made through the same TLS API with
   the hardening copied from the portal's own container (user, dropped capabilities, no-new-privileges,
   limits, devices, groups, ports on the private address), a network and a workspace volume of its own,
   timed to its first 200. Median of LAUNCHES each, after one warm-up each.
2. Noticing a host is down. Beat's heartbeat (lifecycle.hosts_heartbeat) runs every
   HOST_HEARTBEAT_SECONDS; the host's dockerd is killed at a random moment between two beats, and the
   time from the kill to the host being marked down is measured. Median over KILLS kills, with the
   shipped defaults and with the tests' small period, each beside its bound (period x
   HOST_DOWN_AFTER_MISSED_BEATS, counted from the last answer, which came up to a beat before the kill;
   so from the kill it takes at most the bound plus one beat, and often less than the bound).

    python -m benchmarks fleet        (BENCH_FLEET_LAUNCHES, BENCH_FLEET_KILLS change the counts)
"""

import os
import random
import secrets
import statistics
import time
import uuid

import httpx

LAUNCHES = int(os.environ.get("BENCH_FLEET_LAUNCHES", "3"))
KILLS = int(os.environ.get("BENCH_FLEET_KILLS", "3"))
# (label, HOST_HEARTBEAT_SECONDS, HOST_DOWN_AFTER_MISSED_BEATS)
PERIODS = [("tests' small period", 1, 2), ("shipped defaults", None, None)]


def _median(values) -> float:
    return statistics.median(values) if values else float("nan")


def _list(seconds) -> str:
    return ", ".join(f"{value:.2f}" for value in seconds)


def _answers(url: str, token: str) -> bool:
    try:
        answer = httpx.get(url, headers={"Authorization": f"token {token}"}, timeout=2, trust_env=False)
        return answer.status_code == 200
    except httpx.HTTPError:
        return False


class PlainRun:
    """A hardened container by hand on the fleet host's engine, with the options of a portal container."""

    def __init__(self, client, reference: str, portal_container, private_address: str):
        portal_container.reload()
        self.client = client
        self.reference = reference
        self.address = private_address
        self.config = portal_container.attrs["Config"]
        self.host_config = portal_container.attrs["HostConfig"]
        self.label = f"bench-fleet-plain-{uuid.uuid4().hex[:8]}"

    def run_and_time(self) -> float:
        api = self.client.api
        token, instance_id = secrets.token_hex(24), uuid.uuid4()
        base = f"/instances/{instance_id}/lab/"
        name = f"{self.label}-{instance_id.hex[:6]}"
        environment = {
            **dict(entry.split("=", 1) for entry in self.config.get("Env") or [] if "=" in entry),
            "JUPYTER_TOKEN": token,
            "JUPYTER_BASE_URL": base,
            "DEVCLOUD_INSTANCE_ID": str(instance_id),
        }
        host_config = {
            **self.host_config,
            "NetworkMode": f"{name}-net",
            "Mounts": [{"Type": "volume", "Source": f"{name}-ws", "Target": "/workspace"}],
            "Binds": None,
        }
        started = time.perf_counter()
        api.create_network(f"{name}-net", driver="bridge", labels={self.label: "1"})
        api.create_volume(f"{name}-ws", labels={self.label: "1"})
        container = api.create_container(
            self.reference,
            name=name,
            user=self.config.get("User") or None,
            environment=environment,
            labels={self.label: "1"},
            ports=[int(port.split("/")[0]) for port in (self.host_config.get("PortBindings") or {})],
            host_config=host_config,
        )
        api.start(container["Id"])
        port = api.inspect_container(container["Id"])["NetworkSettings"]["Ports"]["8888/tcp"][0]["HostPort"]
        url = f"http://{self.address}:{port}{base}api/status"
        while not _answers(url, token):
            if time.perf_counter() - started > 180:
                raise RuntimeError("the plain container never answered")
            time.sleep(0.05)
        return time.perf_counter() - started

    def remove_all(self) -> None:
        for container in self.client.containers.list(
            all=True, ignore_removed=True, filters={"label": self.label}
        ):
            container.remove(force=True)
        for network in self.client.networks.list(filters={"label": self.label}):
            network.remove()
        for volume in self.client.volumes.list(filters={"label": self.label}):
            volume.remove(force=True)


def _register(fleet_host):
    from django.conf import settings

    from provisioning import services as hosts
    from provisioning.models import GpuHost

    settings.DEVCLOUD_DRIVER = "docker"
    host = hosts.host_register(
        name=fleet_host.name,
        docker_url=fleet_host.docker_url,
        private_address=fleet_host.private_address,
        tls_ca_cert=fleet_host.tls_ca_cert,
        tls_client_cert=fleet_host.tls_client_cert,
        tls_client_key=fleet_host.tls_client_key,
        sysfs_root=fleet_host.sysfs_root,
        dev_root=fleet_host.dev_root,
    )
    GpuHost.objects.filter(pk=host.pk).update(cpus_per_gpu=0.5, memory_mb_per_gpu=1024)
    return host


def _portal_launch(image_key: str) -> tuple[float, object]:
    from portal.credits import services as credits
    from portal.instances import services
    from portal.instances.models import Instance
    from tests.conftest import make_user

    # A new person each time: their workspace volume is made by the launch, as the plain side makes one.
    user = make_user(f"bench-{uuid.uuid4().hex[:10]}@example.com")
    credits.credits_adjust(
        user=user, gpu_seconds=3600, reason="Bench", actor=None, idempotency_key=str(uuid.uuid4())
    )
    started = time.perf_counter()
    instance = services.instance_launch(user=user, size="1x", image_key=image_key)
    elapsed = time.perf_counter() - started
    instance.refresh_from_db()
    if instance.state != Instance.State.RUNNING:
        raise RuntimeError(f"the portal's launch ended {instance.state}: {instance.failure_reason}")
    return elapsed, instance


def _portal_stop(instance) -> None:
    from portal.instances import lifecycle, services

    services.instance_stop(user=instance.user, instance_id=instance.id)
    lifecycle.instance_teardown(instance_id=instance.id)


def bench_launch(fleet, fleet_host, reference: str) -> dict:
    from provisioning.drivers.docker import container_name
    from tests.support.docker_instances import make_image

    registry_reference = fleet.registry.reference(reference)
    fleet.pull(fleet_host, reference)
    client = fleet_host.client()
    image = make_image(reference, key="cpu-bench-fleet")
    # Warm-up: one launch of each, so neither side pays for a cold page cache.
    _, warm = _portal_launch(image.key)
    portal_container = client.containers.get(container_name(warm.id))
    plain = PlainRun(client, reference, portal_container, fleet_host.private_address)
    _portal_stop(warm)
    portal_times, plain_times = [], []
    try:
        plain.run_and_time()
        for _ in range(LAUNCHES):
            elapsed, instance = _portal_launch(image.key)
            portal_times.append(elapsed)
            _portal_stop(instance)
            plain_times.append(plain.run_and_time())
    finally:
        plain.remove_all()
    portal_median, plain_median = _median(portal_times), _median(plain_times)
    print(f"launch on remote host {fleet_host.name} ({fleet_host.docker_url}, mutual TLS)")
    print(f"  image {reference}, pulled from {registry_reference}")
    print(f"  portal launch to running:  median {portal_median:.2f} s  ({_list(portal_times)})")
    print(f"  plain hardened run to 200: median {plain_median:.2f} s  ({_list(plain_times)})")
    print(f"  ratio portal / plain: {portal_median / plain_median:.2f}x")
    return {
        "remote_launch_portal_s": round(portal_median, 2),
        "remote_launch_plain_s": round(plain_median, 2),
        "remote_launch_ratio": round(portal_median / plain_median, 2),
    }


def _time_to_down(fleet_host, host, period: float) -> float:
    """Kill the host's dockerd at a random moment between beats; return seconds until it is marked down."""
    from portal.instances import lifecycle
    from provisioning.models import GpuHost

    lifecycle.hosts_heartbeat()  # a beat that hears it, as the last one before the kill
    next_beat = time.monotonic() + period
    time.sleep(random.uniform(0, period))
    fleet_host.kill()
    killed = time.monotonic()
    try:
        while True:
            time.sleep(max(next_beat - time.monotonic(), 0))
            next_beat += period
            lifecycle.hosts_heartbeat()
            if GpuHost.objects.filter(pk=host.pk, state=GpuHost.State.DOWN).exists():
                return time.monotonic() - killed
    finally:
        fleet_host.restart()
        lifecycle.hosts_heartbeat()


def bench_down(fleet_host, host) -> dict:
    from django.conf import settings

    figures = {}
    defaults = (settings.HOST_HEARTBEAT_SECONDS, settings.HOST_DOWN_AFTER_MISSED_BEATS)
    for label, period, beats in PERIODS:
        period, beats = period or defaults[0], beats or defaults[1]
        settings.HOST_HEARTBEAT_SECONDS, settings.HOST_DOWN_AFTER_MISSED_BEATS = period, beats
        times = [_time_to_down(fleet_host, host, period) for _ in range(KILLS)]
        bound = period * beats
        print(
            f"noticing a host is down, {label} (HOST_HEARTBEAT_SECONDS={period} x "
            f"HOST_DOWN_AFTER_MISSED_BEATS={beats} = bound {bound} s): median {_median(times):.2f} s over "
            f"{KILLS} kills ({_list(times)}); at most bound + one beat = {bound + period} s"
        )
        key = "tests" if period == 1 else "defaults"
        figures[f"down_notice_{key}_s"] = round(_median(times), 2)
        figures[f"down_bound_{key}_s"] = bound
    settings.HOST_HEARTBEAT_SECONDS, settings.HOST_DOWN_AFTER_MISSED_BEATS = defaults
    return figures


def main() -> dict:
    from benchmarks import scratch_database
    from tests.support.fleet import Fleet, FleetUnavailable
    from tests.support.images import build_cpu_image

    try:
        fleet = Fleet.start(hosts=1)
    except FleetUnavailable as error:
        print(f"skipped: no test fleet on this machine: {error}")
        return {}
    from django.conf import settings

    settings.DEVCLOUD_PORTAL_ID = f"bench-fleet-{uuid.uuid4().hex[:8]}"
    settings.READY_TIMEOUT_SECONDS = 180
    figures = {}
    try:
        reference = build_cpu_image()
        fleet.push(reference)
        fleet_host = fleet.hosts[0]
        with scratch_database("bench_fleet"):
            fleet.pull(fleet_host, reference)  # discovery's helper runs in it
            host = _register(fleet_host)
            figures.update(bench_launch(fleet, fleet_host, reference))
            figures.update(bench_down(fleet_host, host))
    finally:
        fleet.stop()
    return figures
