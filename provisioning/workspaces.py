"""Workspaces that follow their owner from host to host.

A person's /workspace is a volume on one host's engine (provisioning.drivers.docker_engine.volume_name), and
Workspace records which host. Placement prefers that host (provisioning/scheduler.py). When a launch
lands elsewhere, the instance lifecycle calls workspace_prepare as a step of its own before the driver
starts the container, and the volume is moved:

  1. on the source engine, a helper container (never started) mounts the volume read-only, and the
     engine's archive API streams /workspace as tar;
  2. on the destination engine, the volume is made, a second helper mounts it, and the same chunks are
     fed to its archive API as they arrive (a pipe: the tar is never held whole in memory);
  3. both sides count files and bytes and digest names, modes, owners and contents inside short-lived
     helpers (find | sort | sha256sum; the source's digest runs on its host while the bytes stream);
     only when the two agree does Workspace point at the new host and the old volume go. On a mismatch
     the launch fails with the reason, the source volume is kept, the half-made copy removed, and
     nothing is charged (an instance that never turned ready is never metered).

Helpers are hardened: no network, read-only root filesystem, all capabilities dropped (reading uses
only DAC_READ_SEARCH, so files uid 1000 made unreadable still count), no-new-privileges, small memory and
pids limits. They run the instance's own image, which the destination has; on the source, that image if
it is there, otherwise any catalogue image (labelled devcloud.image) the source holds.

When the workspace cannot be moved now (its host is down or does not answer, or another live instance
of the same person uses it there) the launch goes on with the destination's own volume (empty the first
time) and the timeline says why; Workspace keeps pointing at the files, and a later launch brings them
(placement prefers their host). If that later move lands on a volume that has files of its own, those
are set aside inside it in a folder named after the date first (kept-<yyyymmdd-hhmmss>), never
overwritten. docs/architecture.md, "Workspaces", has the rules.

Deleting an account removes its workspace volumes on every host: workspaces_remove_all records one
WorkspaceRemoval per host, the task provisioning.remove_workspaces works through them, and the same task
on beat retries the hosts that did not answer.
"""

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone as dt_timezone

import docker
import docker.errors
import requests.exceptions
from django.db import transaction
from docker.types import Mount

from portal.audit.services import audit_record
from portal.lib.tasks import publish

from .drivers.base import DriverError
from .identity import install_id
from .models import GpuHost, Workspace, WorkspaceRemoval

logger = logging.getLogger(__name__)

MB = 1024 * 1024
WORKSPACE = "/workspace"
# Bytes the engine's archive stream hands over at a time; the most a move holds in memory.
CHUNK_BYTES = 1 * MB
# Seconds between two progress reports while a workspace streams (each becomes a timeline line).
PROGRESS_EVERY_SECONDS = 2.0
# Seconds a helper may take to count and digest a workspace (reads every byte once).
HELPER_TIMEOUT = 3600
HELPER_LABEL = "devcloud.helper"

# What a tally runs, for ./ minus the top-level folder EXCLUDE. _COUNT prints files, bytes, entries and a
# tar size estimate (a header per entry, contents in 512-byte blocks; it only scales the progress shown);
# _DIGEST prints a digest of names, types, modes, owners and link targets, then one of the contents.
_FIND = r"""
set -eu
cd /workspace
skip() { if [ -n "$EXCLUDE" ]; then find . -path "./$EXCLUDE" -prune -o "$@"; else find . "$@"; fi; }
"""
_COUNT = r"""
skip -printf '%y %s\n' | awk '{e++; t+=512; if ($1=="f") {n++; b+=$2; t+=int(($2+511)/512)*512}}
  END {printf "%d %d %d %d\n", n, b, e, t+1024}'
"""
_DIGEST = r"""
skip -printf '%y %m %U:%G %l %p\n' | LC_ALL=C sort | sha256sum | cut -d' ' -f1
skip -type f -print0 | LC_ALL=C sort -z | xargs -0r sha256sum | sha256sum | cut -d' ' -f1
"""

# Moves whatever the destination volume already holds into one folder, so nothing there is overwritten.
_SET_ASIDE = r"""
set -eu
cd /workspace
mkdir "$ASIDE"
for entry in .[!.]* ..?* *; do
  if [ -e "$entry" ] || [ -L "$entry" ]; then
    [ "$entry" = "$ASIDE" ] || mv -- "$entry" "$ASIDE/"
  fi
done
"""


# What asking the source engine can raise when it is down, unreachable or refuses.
UNREADABLE = (DriverError, LookupError, docker.errors.DockerException, requests.exceptions.RequestException)


class WorkspaceMismatch(Exception):
    """The copy did not arrive whole: what differs, in words."""


class SourceUnavailable(Exception):
    """The source engine could not be asked for the workspace (down, unreachable, refused)."""


@dataclass(frozen=True)
class Tally:
    """What a helper counted in a workspace."""

    files: int
    bytes: int
    entries: int
    tar_estimate: int
    metadata_digest: str
    content_digest: str


@dataclass(frozen=True)
class MoveResult:
    files: int
    bytes: int
    seconds: float
    # Name of the folder inside the destination volume its earlier files were set aside into, or "".
    set_aside: str = ""


def size_text(n_bytes: int) -> str:
    """"312 MB", or with one decimal below 10 MB ("0.4 MB")."""
    value = n_bytes / MB
    return f"{value:.0f} MB" if value >= 10 else f"{value:.1f} MB"


# --- Engine level: helpers, tallies and the stream -------------------------------------------------


def _helper(client, image: str, volume: str, *, writable: bool, script="", environment=None, user="0:0"):
    """A created (not started) hardened container mounting `volume` at /workspace; `script` runs with sh."""
    return client.containers.create(
        image,
        entrypoint=["sh", "-c", script] if script else ["true"],
        command=[],
        user=user,
        environment=environment or {},
        # Not devcloud.managed: the reconciler's instance containers are something else.
        labels={HELPER_LABEL: "workspace", "devcloud.portal": install_id()},
        network_mode="none",
        read_only=True,
        cap_drop=["ALL"],
        cap_add=[] if writable else ["DAC_READ_SEARCH"],
        security_opt=["no-new-privileges:true"],
        mem_limit=256 * MB,
        pids_limit=64,
        mounts=[Mount(target=WORKSPACE, source=volume, type="volume", read_only=not writable)],
        detach=True,
    )


def _run_helper(client, image, volume, script, *, writable=False, environment=None, user="0:0"):
    """Runs `script` in a helper and returns its output. Raises RuntimeError with its output on failure."""
    container = _helper(
        client, image, volume, writable=writable, script=script, environment=environment, user=user
    )
    try:
        container.start()
        status = container.wait(timeout=HELPER_TIMEOUT)["StatusCode"]
        output = container.logs(stdout=True, stderr=False).decode(errors="replace")
        if status != 0:
            errors = container.logs(stdout=False, stderr=True).decode(errors="replace")
            raise RuntimeError(f"the helper exited with {status}: {errors.strip()[-500:]}")
        return output
    finally:
        container.remove(force=True)


def tally(client, image: str, volume: str, *, exclude: str = "") -> Tally:
    """Counts and digests the files in `volume` (minus the top-level folder `exclude`), inside a helper."""
    output = _run_helper(client, image, volume, _FIND + _COUNT + _DIGEST, environment={"EXCLUDE": exclude})
    files, n_bytes, entries, estimate, metadata, content = output.split()
    return Tally(int(files), int(n_bytes), int(entries), int(estimate), metadata, content)


def _count(client, image: str, volume: str) -> list[int]:
    output = _run_helper(client, image, volume, _FIND + _COUNT, environment={"EXCLUDE": ""})
    return [int(n) for n in output.split()]


def _digests(client, image: str, volume: str) -> list[str]:
    return _run_helper(client, image, volume, _FIND + _DIGEST, environment={"EXCLUDE": ""}).split()


def volume_exists(client, volume: str) -> bool:
    try:
        client.volumes.get(volume)
        return True
    except docker.errors.NotFound:
        return False


def volume_copy(
    *,
    source_client,
    source_volume: str,
    source_image: str,
    dest_client,
    dest_volume: str,
    dest_image: str,
    dest_labels=None,
    dest_create=None,
    progress=None,
    before_verify=None,
) -> MoveResult:
    """Streams `source_volume` into `dest_volume` on another engine and checks it arrived whole.

    The destination volume is made when missing (with `dest_labels`, or by `dest_create()`, which makes
    it with its size limit); files it already has are set aside
    into a kept-<date> folder inside it first. `progress(moved_bytes, total_bytes)` is called as chunks
    pass (the first call with 0). `before_verify(dest_client, dest_volume)` runs between the copy and the
    check (tests tamper there). Returns a MoveResult.

    Raises SourceUnavailable when the source could not be read before anything was copied,
    WorkspaceMismatch when the check fails, docker/requests errors from either engine otherwise.
    The source volume is never changed.
    """
    began = time.monotonic()
    report = progress or (lambda moved, total: None)
    try:
        counted = _count(source_client, source_image, source_volume)
        source_helper = _helper(source_client, source_image, source_volume, writable=False)
    except (docker.errors.DockerException, requests.exceptions.RequestException, RuntimeError) as error:
        raise SourceUnavailable(str(getattr(error, "explanation", None) or error)) from error
    # The source's digests are read on the source host while the bytes stream, off the move's critical
    # path: nothing writes to the volume meanwhile (workspace_prepare moves only a volume nobody mounts).
    pool = ThreadPoolExecutor(max_workers=1)
    source_digests = pool.submit(_digests, source_client, source_image, source_volume)
    expected = Tally(*counted, "", "")
    try:
        set_aside = ""
        if not volume_exists(dest_client, dest_volume):
            if dest_create is not None:
                dest_create()
            else:
                dest_client.volumes.create(dest_volume, labels=dest_labels or {})
        elif tally(dest_client, dest_image, dest_volume).entries > 1:
            set_aside = "kept-" + datetime.now(dt_timezone.utc).strftime("%Y%m%d-%H%M%S")
            _run_helper(
                dest_client, dest_image, dest_volume, _SET_ASIDE, writable=True,
                environment={"ASIDE": set_aside}, user="1000:1000",
            )  # fmt: skip
        dest_helper = _helper(dest_client, dest_image, dest_volume, writable=True)
        try:
            stream, _ = source_helper.get_archive(f"{WORKSPACE}/.", chunk_size=CHUNK_BYTES)
            dest_helper.put_archive(WORKSPACE, _counted(stream, expected, report))
        finally:
            dest_helper.remove(force=True)
    finally:
        source_helper.remove(force=True)
        pool.shutdown(wait=True)
    expected = Tally(*counted, *source_digests.result())
    if before_verify is not None:
        before_verify(dest_client, dest_volume)
    arrived = tally(dest_client, dest_image, dest_volume, exclude=set_aside)
    differences = _differences(expected, arrived)
    if differences:
        raise WorkspaceMismatch("; ".join(differences))
    return MoveResult(
        files=arrived.files, bytes=arrived.bytes, seconds=time.monotonic() - began, set_aside=set_aside
    )


def _counted(stream, expected: Tally, report):
    """Yields the archive's chunks unchanged, reporting file bytes moved (scaled from tar bytes)."""
    report(0, expected.bytes)
    moved = 0
    last = time.monotonic()
    for chunk in stream:
        moved += len(chunk)
        yield chunk
        if time.monotonic() - last >= PROGRESS_EVERY_SECONDS:
            last = time.monotonic()
            scaled = moved * expected.bytes // max(expected.tar_estimate, 1)
            report(min(expected.bytes, scaled), expected.bytes)
    report(expected.bytes, expected.bytes)


def _differences(expected: Tally, arrived: Tally) -> list[str]:
    differences = []
    if arrived.files != expected.files:
        differences.append(f"{arrived.files} of {expected.files} files arrived")
    if arrived.bytes != expected.bytes:
        differences.append(f"{arrived.bytes} bytes arrived instead of {expected.bytes}")
    if arrived.metadata_digest != expected.metadata_digest:
        differences.append("names, modes or owners differ")
    if arrived.content_digest != expected.content_digest:
        differences.append("file contents differ")
    return differences


def helper_image(client, preferred: str) -> str:
    """`preferred` when the engine has it, else the discovery helpers' image (provisioning/hostfs.py),
    else any catalogue image (labelled devcloud.image) it has.

    Raises LookupError when it has none of them.
    """
    from .hostfs import helper_image as discovery_helper_image

    for reference in (preferred, discovery_helper_image()):
        try:
            client.images.get(reference)
            return reference
        except docker.errors.ImageNotFound:
            pass
    for image in client.images.list(filters={"label": "devcloud.image"}):
        if image.tags:
            return image.tags[0]
    raise LookupError("no DevCloud image to run a helper with")


# --- Launch path: the instance lifecycle calls these --------------------------------------------------


def owner_key(user_id) -> str:
    """The person's never-reused workspace key (accounts.User.workspace_key, as hex).

    Read through AUTH_USER_MODEL, as provisioning's own foreign keys are: no import of the accounts app.
    Raises LookupError for an unknown user id.
    """
    from django.contrib.auth import get_user_model

    key = get_user_model().objects.filter(pk=user_id).values_list("workspace_key", flat=True).first()
    if key is None:
        raise LookupError(f"no user {user_id}")
    return key.hex


def workspace_name(user_id) -> str:
    """The name of a person's workspace: their volume on a Docker host, their directory elsewhere.

    The name their Workspace row records when they have one (a volume made before owner keys keeps its
    name, so nobody loses files on upgrade), else <install id>-ws-<owner key>.
    """
    from .drivers.docker_engine import volume_name

    recorded = Workspace.objects.filter(user_id=user_id).values_list("volume_name", flat=True).first()
    return recorded or volume_name(owner_key(user_id))


def workspace_refused(*, host_name: str, volume: str, owner_id, why: str) -> DriverError:
    """Tells the operators (audit log and the worker's log) that `volume` on `host_name` was not mounted
    for `owner_id` because of `why`, and returns the DriverError the launch fails with. The volume is left
    as it is: it may hold another person's files, which only an operator can sort out."""
    from django.contrib.auth import get_user_model

    logger.error("Refused to mount workspace %s on %s for user %s: %s", volume, host_name, owner_id, why)
    audit_record(
        actor=None,
        action="workspace.mount_refused",
        target=get_user_model().objects.filter(pk=owner_id).first(),
        reason=f"The volume {volume} on {host_name} was not mounted: {why}. It was left untouched.",
        details={"volume": volume, "host": host_name, "why": why},
    )
    return DriverError(
        f"Your workspace could not be mounted on {host_name}: the volume with its name is not yours ({why}). "
        "Nothing in it was touched or shown to you. The operators have been told; launch again after they "
        "have sorted it out.",
        permanent=True,
    )


def workspace_prepare(*, host, owner_id, image_reference: str, progress=None, limit_bytes: int = 0) -> str:
    """Brings the person's workspace to `host` (a Docker host) before their instance's container is made.

    Returns what happened: "here" (no workspace yet, or already on this host), "moved" (verified; the
    Workspace row now points here and the old volume is removed) or "left" (its host is down, does not
    answer, or another live instance uses it there: the instance starts with this host's own volume and
    `progress` is told why). `progress(message)` gets lines for the instance's timeline. A volume made
    here holds at most `limit_bytes` (0: no limit; docker_engine.volume_create).

    Raises DriverError(permanent=True) when the copy did not arrive whole (the source is kept, the
    half-made copy removed), DriverError(permanent=False) when this host's engine fails meanwhile.
    """
    from .drivers.docker_engine import DockerEngine, volume_create, volume_labels, volume_refusal

    say = progress or (lambda message: None)
    workspace = Workspace.objects.select_related("host").filter(user_id=owner_id).first()
    if workspace is None or workspace.host_id == host.pk:
        return "here"
    source = workspace.host
    volume = workspace.volume_name
    dest_engine = DockerEngine(host)
    dest_client = dest_engine.client()
    source_engine = DockerEngine(source)
    left = (
        f"Your workspace is on {source.name}, which {{why}}, so this instance starts with the /workspace "
        f"kept on {host.name} (empty if you never worked there). Your files on {source.name} are kept and "
        "come with your next launch once it can be moved; anything this /workspace already holds then is "
        "set aside in a kept-<date> folder, never overwritten."
    )
    if source.state == GpuHost.State.DOWN:
        say(left.format(why="is down"))
        return "left"
    try:
        source_client = source_engine.client()
        if _same_engine(source_client, dest_client):
            # Two host rows for one engine: the volume is already here.
            _point(workspace, host=host, n_bytes=workspace.bytes)
            return "here"
        in_use = source_client.containers.list(all=True, sparse=True, filters={"volume": volume})
        source_image = helper_image(source_client, image_reference)
    except UNREADABLE as error:
        logger.warning("Workspace of user %s on %s cannot be read: %s", owner_id, source.name, error)
        say(left.format(why="does not answer"))
        return "left"
    if in_use:
        say(left.format(why="another of your instances is using"))
        return "left"
    try:
        dest_image = helper_image(dest_client, image_reference)
    except LookupError:
        # Placed here while a pull of its image is under way, and nothing else to run a helper with.
        dest_engine.pull(image_reference, lambda line: None)
        dest_image = image_reference
    # The name stays the recorded one wherever the files go (the launch's StartSpec already carries it).
    target = volume
    key = owner_key(owner_id)
    created = not volume_exists(dest_client, target)
    if not created:
        why = volume_refusal(
            dest_client.volumes.get(target).attrs.get("Labels"), install=install_id(), owner_id=owner_id,
            owner_key=key,
        )
        if why:
            raise workspace_refused(host_name=host.name, volume=target, owner_id=owner_id, why=why)
    say(f"Moving your workspace from {source.name} to {host.name}.")
    try:
        result = volume_copy(
            source_client=source_client,
            source_volume=volume,
            source_image=source_image,
            dest_client=dest_client,
            dest_volume=target,
            dest_image=dest_image,
            dest_labels=volume_labels(owner_id, key),
            # Made with its size limit before the copy: files past it fail the move, never fill the host.
            dest_create=lambda: volume_create(
                dest_client, target, labels=volume_labels(owner_id, key), limit_bytes=limit_bytes,
                host_name=host.name,
            ),
            progress=lambda moved, total: say(
                f"Moving your workspace from {source.name}: {size_text(moved)[:-3]} of {size_text(total)}"
            ),
            before_verify=before_verify_hook,
        )
    except SourceUnavailable as error:
        logger.warning("Workspace of user %s on %s cannot be read: %s", owner_id, source.name, error)
        if created:
            _remove_quietly(dest_client, target)
        say(left.format(why="does not answer"))
        return "left"
    except WorkspaceMismatch as error:
        if created:
            _remove_quietly(dest_client, target)
        raise DriverError(
            f"Your workspace did not arrive whole on {host.name} ({error}), so the launch was stopped. Your "
            f"files are untouched on {source.name}. Launch again; if it happens again, tell the operators.",
            permanent=True,
        ) from error
    except Exception as error:
        if created:
            _remove_quietly(dest_client, target)
        if isinstance(error, RuntimeError):
            # A helper failed (a disk filled up, the source went away mid-move): worth another try.
            message = f"Moving the workspace to {host.name} failed: {error}"
            raise DriverError(message, permanent=False) from error
        raise dest_engine.api_error(error, "moving the workspace") from error
    _point(workspace, host=host, n_bytes=result.bytes, volume=target)
    kept = f" Files this host already had are in /workspace/{result.set_aside}." if result.set_aside else ""
    say(
        f"Your workspace arrived whole on {host.name}: {result.files} files, {size_text(result.bytes)}, "
        f"checked.{kept}"
    )
    try:
        source_client.volumes.get(volume).remove()
    except Exception as error:  # noqa: BLE001 -- the move stands; the old copy is only space
        logger.warning("Could not remove the old workspace %s on %s: %s", volume, source.name, error)
    return "moved"


# Called between a move's copy and its check; None in production. Tests set it to tamper with the copy.
before_verify_hook = None


def _same_engine(one, other) -> bool:
    # Engines on one machine may share an ID (it lives in /etc/docker), never a data root as well.
    def identity(client):
        info = client.info()
        return info.get("ID"), info.get("Name"), info.get("DockerRootDir")

    return identity(one) == identity(other)


def _point(workspace: Workspace, *, host, n_bytes: int, volume: str | None = None) -> None:
    workspace.host = host
    workspace.bytes = n_bytes
    if volume:
        workspace.volume_name = volume
    workspace.save(update_fields=["host", "bytes", "volume_name", "updated_at"])


def _remove_quietly(client, volume: str) -> None:
    try:
        client.volumes.get(volume).remove(force=True)
    except Exception as error:  # noqa: BLE001 -- the failure being reported matters more
        logger.warning("Could not remove the half-made workspace %s: %s", volume, error)


def workspace_created(*, user_id, host, volume: str) -> Workspace:
    """Records that a container was made with `volume` on `host`, when the person had no workspace yet.

    An existing row is left alone: it points at their files, which only a verified move changes.
    Returns the row.
    """
    workspace, _ = Workspace.objects.get_or_create(
        user_id=user_id, defaults={"host": host, "volume_name": volume}
    )
    return workspace


# --- Account deletion ------------------------------------------------------------------------------


def workspaces_remove_all(*, user_id) -> int:
    """Removes a deleted account's workspaces on every host: records a WorkspaceRemoval per host that is
    not retired, drops the Workspace row, and (after the caller's transaction commits) asks the
    provisioning.remove_workspaces task to do it. Call it after the account's instances were stopped.

    Returns how many hosts are to be cleared. Beat runs the task again for hosts that did not answer.
    """
    from . import tasks

    hosts = list(GpuHost.objects.exclude(state=GpuHost.State.RETIRED).values_list("pk", flat=True))
    with transaction.atomic():
        WorkspaceRemoval.objects.bulk_create(
            [WorkspaceRemoval(user_id=user_id, host_id=host_id) for host_id in hosts], ignore_conflicts=True
        )
        Workspace.objects.filter(user_id=user_id).delete()
        transaction.on_commit(lambda: publish(tasks.remove_workspaces, kwargs={"user_id": user_id}))
    return len(hosts)


def workspace_removals_run(*, user_id=None) -> dict:
    """Removes the volumes each pending WorkspaceRemoval names (all of them, or `user_id`'s).

    A host whose engine shows none of the account's volumes any more loses its row; one that does not
    answer, or whose volume is still mounted by a container being stopped, keeps it with the error, for
    the next run. When the last row of an account goes, the removal is audited as
    "account.workspaces_removed". Returns {"removed": volumes removed, "left": hosts still pending}.
    """
    from .drivers.docker_engine import DockerEngine, portal_id

    keys: dict[int, str] = {}
    pending = WorkspaceRemoval.objects.select_related("host", "user").order_by("id")
    if user_id is not None:
        pending = pending.filter(user_id=user_id)
    removed = left = 0
    done_by_user: dict[int, list[str]] = {}
    for removal in pending:
        names = []
        if removal.host.is_slurm:
            # A directory on the cluster's shared storage, which the partition's driver removes.
            from .drivers import driver_for

            driver = driver_for(removal.host)
            driver.remove_workspace(removal.user_id)
            removal.delete()
            done_by_user.setdefault(removal.user_id, []).append(
                f"{driver.workspace_dir(workspace_name(removal.user_id))} on {removal.host.name}"
            )
            continue
        try:
            client = DockerEngine(removal.host).client()
            key = keys.setdefault(removal.user_id, owner_key(removal.user_id))
            # Theirs by owner key; and, made before owner keys, by their numeric id with no owner key.
            by_key = client.volumes.list(filters={"label": [f"devcloud.owner={key}", f"devcloud.portal={portal_id()}"]})
            by_id = client.volumes.list(
                filters={"label": [f"devcloud.user={removal.user_id}", f"devcloud.portal={portal_id()}"]}
            )
            volumes = by_key + [v for v in by_id if not (v.attrs.get("Labels") or {}).get("devcloud.owner")]
            for volume in volumes:
                volume.remove()
                names.append(volume.name)
        except Exception as error:  # noqa: BLE001 -- kept for the next run, with the reason
            WorkspaceRemoval.objects.filter(pk=removal.pk).update(
                attempts=removal.attempts + 1, last_error=str(getattr(error, "message", error))[:1000]
            )
            removed += len(names)
            left += 1
            continue
        removed += len(names)
        removal.delete()
        done = done_by_user.setdefault(removal.user_id, [])
        done.extend(f"{name} on {removal.host.name}" for name in names)
    for done_user_id, volumes in done_by_user.items():
        if not WorkspaceRemoval.objects.filter(user_id=done_user_id).exists():
            from django.contrib.auth import get_user_model

            audit_record(
                actor=None,
                action="account.workspaces_removed",
                target=get_user_model().objects.filter(pk=done_user_id).first(),
                reason="The account was deleted.",
                details={"volumes": volumes},
            )
    return {"removed": removed, "left": left}

