"""Instances as hardened containers on a host's Docker engine (local socket, or TCP with TLS).

Per instance the driver makes, all named and labelled after the instance so a retry finds them:
  container  devcloud-<instance uuid>      JupyterLab; /dev/kfd and only its own GPUs' render nodes
  network    devcloud-net-<instance uuid>  a bridge of its own, so tenants cannot reach each other
and mounts the owner's workspace volume (StartSpec.workspace) at /workspace, kept when the instance
stops. The lifecycle brings that volume here before start (provisioning/workspaces.py); the driver only
mounts it, creating it empty when the person never had one. The volume is made with the size's workspace
limit and the container with its writable-layer limit (StartSpec.workspace_limit_bytes, disk_limit_bytes),
which the engine enforces; docs/architecture.md, "Disk limits", says what happens where it cannot.

Everything the reconciler needs is in the labels: devcloud.managed, devcloud.portal (portals sharing an
engine never touch each other's), devcloud.instance, devcloud.user, devcloud.gpus.

The engine's connection and housekeeping (images, volumes) are provisioning/drivers/docker_engine.py.
"""

import io
import logging
import os
import tarfile
import threading
import time

import docker
import docker.errors
from docker.types import Mount

from ..start_slots import Cancelled, Line, slots_for
from .base import Driver, DriverError, InstanceRef, PollResult, StartResult, StartSpec, hide_token
from .docker_engine import (
    DockerEngine,
    cannot_limit,
    engine_cpu_count,
    on_a_registry,
    portal_id,
    unlimited_disk,
    volume_create,
    volume_labels,
    volume_refusal,
)

logger = logging.getLogger(__name__)

JUPYTER_PORT = 8888
# sshd inside (containers/entrypoint/start-jupyter.sh runs it as uid 1000); published like JupyterLab's port.
SSH_PORT = 2222
# Where the owner's public keys go: sshd's AuthorizedKeysFile (containers/entrypoint/devcloud-ssh/
# sshd_config), in a root-owned directory of the image, so the tenant (uid 1000) cannot add a key of their own.
AUTHORIZED_KEYS_DIR = "/etc/devcloud/ssh/keys"
CONTAINER_USER = "1000:1000"
WORKSPACE = "/workspace"
# Seconds `docker stop` waits for JupyterLab to exit on SIGTERM before SIGKILL; it needs about one.
STOP_TIMEOUT = 5
# Seconds to wait for the network or container a concurrent start of the same instance is making.
RACE_WAIT_SECONDS = 5


def container_name(instance_id) -> str:
    return f"devcloud-{instance_id}"


def network_name(instance_id) -> str:
    return f"devcloud-net-{instance_id}"


def instance_labels(instance_id, owner_id, gpus=()) -> dict[str, str]:
    return {
        "devcloud.managed": "true",
        "devcloud.portal": portal_id(),
        "devcloud.instance": str(instance_id),
        "devcloud.user": str(owner_id),
        "devcloud.gpus": ",".join(str(gpu.render_minor) for gpu in gpus),
    }


class DockerDriver(Driver):
    """Runs instances on `host`'s Docker engine. See base.Driver for the contract of each method."""

    name = "docker"
    isolates_gpus = True
    watches_output = True
    workspace_moves = True

    def __init__(self, host):
        super().__init__(host)
        self.engine = DockerEngine(host)

    def client(self, *, timeout: int | None = None) -> docker.DockerClient:
        return self.engine.client(timeout=timeout)

    def _api_error(self, error, doing: str) -> DriverError:
        return self.engine.api_error(error, doing)

    # --- The contract -----------------------------------------------------------------------------

    def start(self, spec: StartSpec, progress=None, turn=None) -> StartResult:
        """Starts the instance's container with exactly `spec.gpus` and returns its endpoint and state.

        Idempotent: an existing container for the instance is started if needed and reused (or replaced,
        when it was made for other GPUs). Raises DriverError(permanent=True) for a missing image or
        device, DriverError(permanent=False) when the engine cannot be reached or times out.
        """
        gpus = sorted(spec.gpus, key=lambda gpu: gpu.render_minor)
        client = self.client()
        name = container_name(spec.instance_id)
        wanted_gpus = instance_labels(spec.instance_id, spec.owner_id, gpus)["devcloud.gpus"]
        try:
            container = self._find_container(client, name)
            if container is not None and container.labels.get("devcloud.gpus") != wanted_gpus:
                # Made by an earlier attempt with another allocation: never hand it GPUs it no longer holds.
                container.remove(force=True)
                container = None
            network = self._ensure_network(client, spec)
            unlimited = []
            volume = self._ensure_volume(client, spec, unlimited)
            if container is None:
                container = self._create_container(client, spec, gpus, network.name, volume.name, unlimited)
                # Before the first start, so sshd trusts the owner's keys from its first connection.
                self._put_authorized_keys(container, spec.authorized_keys)
            if container.status != "running":
                # The network, workspace and container are made before the instance's turn, so that
                # once its start slot frees only the start itself is left.
                if turn is not None:
                    turn()
                container.start()
            container.reload()
            endpoint, host_port = self._endpoint(container)
            ssh_port = self._published_port(container, SSH_PORT)
            address = self._ports_address(container, network.name)
        except DriverError as error:
            if error.permanent:
                self._discard(client, spec.instance_id)
            raise
        except Cancelled:
            raise  # called off while waiting its turn: the caller removes what was made
        except Exception as error:
            driver_error = self._api_error(error, f"starting {name}")
            if driver_error.permanent:
                self._discard(client, spec.instance_id)
            raise driver_error from error
        return StartResult(
            endpoint=endpoint,
            state={
                "container_id": container.id,
                "container_name": name,
                "network": network.name,
                "volume": volume.name,
                "host_port": host_port,
                # sshd's port on the same address as the endpoint; None for an image from before SSH.
                "ssh_port": ssh_port,
                # Where the portal reaches the instance's other ports (ones its owner exposes): its
                # address on its own network. Only this machine routes to that network, so only
                # instances on the portal's own engine have one.
                **({"address": address} if address else {}),
                "image": spec.image_reference,
                "gpus": [gpu.render_minor for gpu in gpus],
                # What the engine could not limit ("workspace", "disk"), started so under
                # DEVCLOUD_DISK_LIMITS=warn; the instance's page says so.
                **({"disk_limits_unenforced": unlimited} if unlimited else {}),
            },
        )

    def stop(self, ref: InstanceRef) -> None:
        """Stops and removes the container and its network; keeps the workspace volume. Missing is fine.

        Raises DriverError(permanent=False) when the engine cannot be reached.
        """
        client = self.client()
        name = container_name(ref.id)
        try:
            container = self._find_container(client, name)
            if container is not None:
                if container.status == "running":
                    container.stop(timeout=STOP_TIMEOUT)
                container.remove(force=True, v=False)
            self._remove_networks(client, ref.id)
        except docker.errors.NotFound:
            # Removed by someone else between our look and our remove: already stopped.
            self._remove_networks(client, ref.id)
        except Exception as error:
            raise self._api_error(error, f"stopping {name}") from error

    def poll(self, ref: InstanceRef) -> PollResult:
        """What the engine shows of the instance: running, exited (with its exit code) or missing."""
        client = self.client()
        try:
            container = self._find_container(client, container_name(ref.id))
        except Exception as error:
            raise self._api_error(error, "looking at the container") from error
        if container is None:
            return PollResult(status="missing")
        state = container.attrs.get("State", {})
        if container.status in ("running", "restarting", "paused"):
            return PollResult(status="running", detail=container.status)
        detail = state.get("Error") or ""
        if state.get("OOMKilled"):
            detail = "killed for running out of memory"
        elif container.status == "created":
            detail = "created but never started"
        return PollResult(status="exited", exit_code=state.get("ExitCode"), detail=detail)

    def managed_instance_ids(self) -> set[str]:
        """Instance ids of every container this portal manages on the host, running or not."""
        client = self.client()
        try:
            containers = client.containers.list(
                all=True, sparse=True, filters={"label": self._portal_filter()}
            )
        except Exception as error:
            raise self._api_error(error, "listing containers") from error
        return {c.attrs.get("Labels", {}).get("devcloud.instance") for c in containers} - {None}

    def remove_workspace(self, owner_id) -> None:
        """Removes the owner's workspace volume on this host. Missing is fine; a volume another container
        still mounts is left for provisioning.workspaces' removal rows to retry. Raises
        DriverError(permanent=False) when the engine cannot be reached."""
        from ..workspaces import workspace_name

        if not self.engine.remove_volume(workspace_name(owner_id)):
            logger.info("Workspace of user %s on %s is still in use", owner_id, self.host.name)

    def logs(self, ref: InstanceRef, tail: int = 100) -> str:
        """The last `tail` lines of the container's output (stdout and stderr), for the operator console.

        The instance's Jupyter token is blanked out wherever JupyterLab printed it (its startup banner
        prints URLs with the token): operators do not get a way into a user's JupyterLab. Returns ""
        when the container does not exist (never started, or removed at stop). Raises
        DriverError(permanent=False) when the engine cannot be reached.
        """
        try:
            container = self._find_container(self.client(), container_name(ref.id))
            if container is None:
                return ""
            text = container.logs(stdout=True, stderr=True, tail=tail).decode("utf-8", errors="replace")
        except docker.errors.NotFound:
            return ""  # removed between the look and the read
        except Exception as error:
            raise self._api_error(error, "reading the container's log") from error
        return hide_token(text, ref.jupyter_token)

    def start_line(self):
        """One line per engine address, with as many start slots as its CPUs allow (start_slots.slots_for)."""
        client = self.client()
        try:
            cpus = engine_cpu_count(client)
        except Exception as error:
            raise self._api_error(error, "reading the engine's CPU count") from error
        return Line(engine=client.api.base_url, limit=slots_for(cpus))

    def wait_for_output(self, ref: InstanceRef, text: str, deadline: float, cancelled) -> bool:
        """Follows the container's output (the engine's log stream: no polling) until a line contains
        `text`; see Driver. The stream is closed from a helper thread at the deadline or on `cancelled`."""
        try:
            container = self._find_container(self.client(), container_name(ref.id))
            if container is None:
                return False
            stream = container.logs(stdout=True, stderr=True, stream=True, follow=True)
        except docker.errors.NotFound:
            return False
        except Exception as error:
            raise self._api_error(error, "following the container's output") from error
        finished = threading.Event()

        def close_when_due():
            while not finished.wait(0.5):
                if cancelled.is_set() or time.monotonic() >= deadline:
                    break
            stream.close()

        threading.Thread(target=close_when_due, name="output-deadline", daemon=True).start()
        needle, tail = text.encode(), b""
        try:
            for chunk in stream:
                seen = tail + chunk
                if needle in seen:
                    return True
                tail = seen[-len(needle) :]
        except Exception:
            # Closed at the deadline, or the engine went away: the caller's poll says which.
            return False
        finally:
            finished.set()
        return False

    # --- Pieces -----------------------------------------------------------------------------------

    def _portal_filter(self) -> list[str]:
        return ["devcloud.managed=true", f"devcloud.portal={portal_id()}"]

    @staticmethod
    def _find_container(client, name):
        try:
            return client.containers.get(name)
        except docker.errors.NotFound:
            return None

    def _ensure_network(self, client, spec: StartSpec):
        name = network_name(spec.instance_id)
        try:
            return client.networks.get(name)
        except docker.errors.NotFound:
            pass
        try:
            # The low-level call: the SDK's networks.create inspects the new network again, one more
            # engine call per launch that tells nothing the caller uses (it needs the name and id).
            made = client.api.create_network(
                name,
                driver="bridge",
                check_duplicate=True,
                labels=instance_labels(spec.instance_id, spec.owner_id),
                options={
                    # A recognisable interface name ("dc-" + the start of the uuid, within Linux's 15
                    # characters), so a host firewall can match every instance bridge with `-i dc-+`.
                    "com.docker.network.bridge.name": f"dc-{spec.instance_id.hex[:12]}",
                },
            )
            return client.networks.prepare_model({"Id": made["Id"], "Name": name})
        except docker.errors.APIError as error:
            # A concurrent attempt (a redelivered task, or the reconciler's resume) made it first. The
            # engine's name check is not atomic: a racer that got past it is refused for the bridge
            # name instead (403).
            if error.status_code != 409 and "same bridge name" not in str(error.explanation or ""):
                raise
        return self._made_by_other_attempt(client.networks.get, name)

    def _remove_networks(self, client, instance_id):
        # By label as well as name: an engine that ignored check_duplicate may hold two of them.
        networks = client.networks.list(
            filters={"label": [f"devcloud.instance={instance_id}", f"devcloud.portal={portal_id()}"]}
        )
        for network in networks:
            try:
                network.remove()
            except docker.errors.NotFound:
                pass

    def _ensure_volume(self, client, spec: StartSpec, unlimited: list):
        """The owner's workspace volume, made when missing with its size limit. One that exists is mounted
        only when its labels name this install and this owner; otherwise the launch is refused and the volume
        left untouched."""
        from ..workspaces import owner_key, workspace_refused

        name = spec.workspace
        key = spec.owner_key or owner_key(spec.owner_id)
        try:
            volume = client.volumes.get(name)
        except docker.errors.NotFound:
            # Creating an existing volume returns it, so a concurrent create is harmless (and checked below).
            # Its size limit is set now, once: an existing volume keeps the one it was made with.
            volume = volume_create(
                client, name, labels=volume_labels(spec.owner_id, key), limit_bytes=spec.workspace_limit_bytes,
                host_name=self.host.name, unlimited=lambda: unlimited.append("workspace"),
            )  # fmt: skip
        why = volume_refusal(
            volume.attrs.get("Labels"),
            install=spec.install_id or portal_id(),
            owner_id=spec.owner_id,
            owner_key=key,
        )
        if why:
            raise workspace_refused(host_name=self.host.name, volume=name, owner_id=spec.owner_id, why=why)
        return volume

    def _device_paths(self, gpus) -> list[tuple[str, str]]:
        """(host path, container path) of /dev/kfd and each GPU's render node; empty without GPUs."""
        if not gpus:
            return []
        root = self.host.dev_root or "/"
        pairs = [(os.path.join(root, "dev/kfd"), "/dev/kfd")]
        pairs += [
            (os.path.join(root, f"dev/dri/renderD{gpu.render_minor}"), f"/dev/dri/renderD{gpu.render_minor}")
            for gpu in gpus
        ]
        return pairs

    def _device_groups(self, device_paths, gpus) -> list[str]:
        """Group ids that own the device nodes, so uid 1000 may open them (never group 0, root's).

        This machine's engine: read from the nodes now (a missing node fails the start for good). Any
        other host: the gids discovery read on that host through its engine (GpuHost.kfd_gid,
        Gpu.render_gid), since its /dev cannot be looked at from here. Raises DriverError(permanent=True)
        when a node is missing, or when a remote host's gids were never discovered (the container could
        not open its GPU).
        """
        if not device_paths:
            return []
        if not self.engine.is_local_engine:
            gids = {self.host.kfd_gid, *(gpu.render_gid for gpu in gpus)}
            if None in gids:
                raise DriverError(
                    f"The group ids of host {self.host.name}'s GPU device nodes are not known, so uid 1000 "
                    "could not open its GPU. An operator should run Discover GPUs on the host.",
                    permanent=True,
                )
            return [str(gid) for gid in sorted(gids - {0})]
        gids = set()
        for host_path, _ in device_paths:
            try:
                gids.add(os.stat(host_path).st_gid)
            except FileNotFoundError:
                raise DriverError(
                    f"GPU device {host_path} does not exist on host {self.host.name}. An operator should "
                    "rediscover the host's GPUs (or drain the host) before it takes more instances.",
                    permanent=True,
                ) from None
        return [str(gid) for gid in sorted(gids - {0})]

    def _create_container(self, client, spec: StartSpec, gpus, network, volume, unlimited=None, limited=True):
        device_paths = self._device_paths(gpus)
        group_add = self._device_groups(device_paths, gpus)
        # A container cannot be given more CPUs than the engine has; a host configured with a generous
        # CPU share still runs its 8x instances, on every CPU it has.
        nano_cpus = int(min(spec.cpus, engine_cpu_count(client)) * 1e9)
        publish_ip = self.engine.publish_address()
        try:
            return client.containers.create(
                spec.image_reference,
                name=container_name(spec.instance_id),
                hostname=f"devcloud-{spec.short_id}",
                labels=instance_labels(spec.instance_id, spec.owner_id, gpus),
                user=CONTAINER_USER,
                environment={
                    "JUPYTER_TOKEN": spec.jupyter_token,
                    "JUPYTER_BASE_URL": spec.lab_base_path,
                    # Only a convenience: inside the container its GPUs are 0..n-1. Isolation comes
                    # from the container having no other render nodes.
                    "HIP_VISIBLE_DEVICES": ",".join(str(index) for index in range(len(gpus))),
                    "DEVCLOUD_INSTANCE_ID": str(spec.instance_id),
                    "DEVCLOUD_GPU_COUNT": str(len(gpus)),
                    "DEVCLOUD_SSH_PORT": str(SSH_PORT),
                },
                devices=[f"{host_path}:{container_path}:rwm" for host_path, container_path in device_paths],
                group_add=group_add,
                privileged=False,
                cap_drop=["ALL"],
                security_opt=["no-new-privileges:true"],
                mem_limit=spec.memory_bytes,
                memswap_limit=spec.memory_bytes,
                nano_cpus=nano_cpus,
                pids_limit=spec.pids_limit,
                shm_size=spec.shm_bytes,
                ipc_mode="private",
                network=network,
                ports={f"{JUPYTER_PORT}/tcp": (publish_ip, None), f"{SSH_PORT}/tcp": (publish_ip, None)},
                mounts=[Mount(target=WORKSPACE, source=volume, type="volume")],
                log_config={"type": "json-file", "config": {"max-size": "10m", "max-file": "2"}},
                restart_policy={"Name": "no"},
                # What it may write outside /workspace: the engine's quota on its writable layer (ENOSPC
                # or EDQUOT past it), so no instance fills the host's disk.
                **self._disk_limit(spec, limited),
                detach=True,
            )
        except docker.errors.ImageNotFound as error:
            # Placement sends a launch to a host without its image only while a pull of it is under way
            # there (or the host's images were never looked at): wait for the image rather than fail.
            if on_a_registry(spec.image_reference):
                try:
                    self.engine.pull(spec.image_reference, lambda line: None)
                except DriverError:
                    pass
                else:
                    return self._create_container(client, spec, gpus, network, volume, unlimited, limited)
            raise DriverError(
                f"The image {spec.image_reference} ({spec.image_name}) is not on host "
                f"{self.host.name}. An operator can build or pre-pull it from the admin console "
                "(or run scripts/build-images.sh there).",
                permanent=True,
            ) from error
        except docker.errors.APIError as error:
            if limited and spec.disk_limit_bytes and cannot_limit(error):
                unlimited_disk(self.host.name, "the instance's disk outside /workspace", error)
                if unlimited is not None:
                    unlimited.append("disk")
                return self._create_container(client, spec, gpus, network, volume, unlimited, limited=False)
            if error.status_code != 409:
                raise
        # A concurrent attempt created it first.
        return self._made_by_other_attempt(client.containers.get, container_name(spec.instance_id))

    @staticmethod
    def _disk_limit(spec: StartSpec, limited: bool) -> dict:
        if not (limited and spec.disk_limit_bytes):
            return {}
        return {"storage_opt": {"size": str(spec.disk_limit_bytes)}}

    def _made_by_other_attempt(self, get, name: str):
        """Returns what a concurrent start of the same instance is making, once the engine shows it.

        The engine reserves a name before the thing can be looked up by it, so the loser of a race sees
        the conflict a moment before it can find the winner's. Giving up (or treating the conflict as a
        failure) would make the loser discard the winner's container and network and fail the launch.
        Raises DriverError(permanent=False) if it does not appear within RACE_WAIT_SECONDS.
        """
        deadline = time.monotonic() + RACE_WAIT_SECONDS
        while True:
            try:
                return get(name)
            except docker.errors.NotFound:
                if time.monotonic() > deadline:
                    raise DriverError(
                        f"{name} is being made by another attempt on host {self.host.name}.", permanent=False
                    ) from None
                time.sleep(0.05)

    @staticmethod
    def _published_port(container, port: int) -> int | None:
        """The host port the engine published the container's `port` on, or None when it is not published."""
        bindings = (container.attrs.get("NetworkSettings", {}).get("Ports") or {}).get(f"{port}/tcp") or []
        return int(bindings[0]["HostPort"]) if bindings else None

    def authorized_keys_set(self, ref: InstanceRef, text: str) -> bool:
        """Makes `text` the instance's /etc/devcloud/ssh/keys/authorized_keys (root, mode 0644), the keys its
        sshd trusts.

        Returns False when the instance has no container (never started, or removed) or its image has no
        /etc/devcloud/ssh/keys (made before it). Raises DriverError(permanent=False) when the engine cannot
        be reached.
        """
        try:
            container = self._find_container(self.client(), container_name(ref.id))
            return container is not None and self._put_authorized_keys(container, text)
        except docker.errors.NotFound:
            return False
        except Exception as error:
            raise self._api_error(error, "updating the SSH keys") from error

    @staticmethod
    def _put_authorized_keys(container, text: str) -> bool:
        """Writes the file; False when the image has no /etc/devcloud/ssh/keys (an image from before it)."""
        # The engine writes the file into the container's filesystem itself (running or not), as root and
        # as the tar says: owner root, mode 0644. Nothing runs inside, so a tenant's process cannot
        # interfere, and the tenant cannot write there afterwards.
        try:
            return bool(container.put_archive(AUTHORIZED_KEYS_DIR, authorized_keys_archive(text)))
        except docker.errors.NotFound:
            return False

    def _ports_address(self, container, network: str) -> str | None:
        """The container's IP address on its own network when the portal can reach it there (this
        machine's engine), else None."""
        if not self.engine.is_local_engine:
            return None
        networks = container.attrs.get("NetworkSettings", {}).get("Networks") or {}
        return (networks.get(network) or {}).get("IPAddress") or None

    def _endpoint(self, container) -> tuple[str, int]:
        bindings = (container.attrs.get("NetworkSettings", {}).get("Ports") or {}).get(
            f"{JUPYTER_PORT}/tcp"
        ) or []
        if not bindings:
            state = container.attrs.get("State", {})
            raise DriverError(
                f"Container {container.name} is {container.status} with no published port"
                + (f": {state['Error']}" if state.get("Error") else "")
                + f" (exit code {state.get('ExitCode')}).",
                permanent=False,
            )
        port = int(bindings[0]["HostPort"])
        address = self.engine.publish_address()
        host_part = f"[{address}]" if ":" in address else address
        return f"http://{host_part}:{port}", port

    def _discard(self, client, instance_id):
        """Best-effort removal of a half-made instance after a permanent failure, so a retry starts clean."""
        try:
            container = self._find_container(client, container_name(instance_id))
            if container is not None:
                container.remove(force=True)
            self._remove_networks(client, instance_id)
        except Exception:  # the failure being reported matters more than this cleanup's
            logger.warning("could not clean up after a failed start of %s", instance_id, exc_info=True)


def authorized_keys_archive(text: str) -> bytes:
    """A tar holding `text` as authorized_keys, owned by root and mode 0644 (readable by sshd running as
    uid 1000, writable by nobody else; StrictModes accepts a root-owned file), for the engine's archive
    API."""
    data = text.encode()
    member = tarfile.TarInfo("authorized_keys")
    member.size = len(data)
    member.mode = 0o644
    member.uid = member.gid = 0
    member.uname = member.gname = "root"
    member.mtime = int(time.time())
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        archive.addfile(member, io.BytesIO(data))
    return buffer.getvalue()
