"""Workspace move rate: a 1 GiB workspace streamed between two GPU hosts' engines and checked on arrival.

The hosts are a test fleet (tests/support/fleet.py: two dockerd in network namespaces, mutual TLS), as
the portal reaches remote hosts. When this machine cannot run a fleet (not root, a tool missing) both
ends are the local engine, and the output says so.

Measured, median of RUNS each, in the same run on the same engines:
- move: provisioning.workspaces.volume_copy, what a launch does (tally and digest on the source, the
  archive piped from the source's helper into the destination's, tally and digest on the destination);
- baseline: a `docker cp`-style raw copy through the same engines (get_archive piped into put_archive,
  nothing checked).
The workspace: WORKSPACE_FILES files of random bytes totalling WORKSPACE_BYTES, plus small files in
nested folders, written as uid 1000.
"""

import statistics
import time

MB = 1024 * 1024
WORKSPACE_BYTES = 1024 * MB
WORKSPACE_FILES = 8
RUNS = 3
SOURCE = "devcloud-bench-ws-source"
DEST = "devcloud-bench-ws-dest"
LABELS = {"devcloud.portal": "devcloud-bench"}


def _engines():
    """(source client, destination client, description, stop callable)."""
    from tests.support.fleet import Fleet, FleetUnavailable
    from tests.support.images import build_cpu_image

    reference = build_cpu_image()
    try:
        fleet = Fleet.start(hosts=2)
    except FleetUnavailable as error:
        import docker

        client = docker.DockerClient(base_url="unix:///var/run/docker.sock", timeout=600)
        where = f"the local engine at both ends (no test fleet: {error})"
        return client, client, reference, where, client.close
    for host in fleet.hosts:
        fleet.pull(host, reference)
    source, dest = (host.client(timeout=600) for host in fleet.hosts)
    first, second = fleet.hosts
    where = f"fleet hosts {first.name} -> {second.name} (dockerd in network namespaces, mutual TLS)"
    return source, dest, reference, where, fleet.stop


def _fill(client, image):
    each = WORKSPACE_BYTES // WORKSPACE_FILES
    script = (
        "set -e; cd /workspace; mkdir -p data notes/a/b; "
        f"for n in $(seq 1 {WORKSPACE_FILES}); do head -c {each} /dev/urandom > data/part-$n.bin; done; "
        "for n in $(seq 1 200); do echo note $n > notes/a/b/note-$n.txt; done"
    )
    client.volumes.create(SOURCE, labels=LABELS)
    client.containers.run(
        image,
        entrypoint=["sh", "-c", script],
        user="1000:1000",
        network_mode="none",
        mounts=[{"Target": "/workspace", "Source": SOURCE, "Type": "volume"}],
        remove=True,
    )


def _remove_volume(client, name):
    import docker.errors

    try:
        client.volumes.get(name).remove(force=True)
    except docker.errors.NotFound:
        pass


def _raw_copy(source, dest, image) -> float:
    """Seconds for get_archive -> put_archive between two never-started helpers, nothing checked."""
    from provisioning.workspaces import CHUNK_BYTES, _helper

    dest.volumes.create(DEST, labels=LABELS)
    reader = _helper(source, image, SOURCE, writable=False)
    writer = _helper(dest, image, DEST, writable=True)
    try:
        began = time.perf_counter()
        stream, _ = reader.get_archive("/workspace/.", chunk_size=CHUNK_BYTES)
        writer.put_archive("/workspace", stream)
        return time.perf_counter() - began
    finally:
        reader.remove(force=True)
        writer.remove(force=True)


def _move(source, dest, image) -> tuple[float, int]:
    from provisioning.workspaces import volume_copy

    began = time.perf_counter()
    result = volume_copy(
        source_client=source, source_volume=SOURCE, source_image=image,
        dest_client=dest, dest_volume=DEST, dest_image=image, dest_labels=LABELS,
    )  # fmt: skip
    return time.perf_counter() - began, result.bytes


def main() -> dict:
    source, dest, image, where, stop = _engines()
    print(f"engines: {where}")
    try:
        for client in {id(source): source, id(dest): dest}.values():
            _remove_volume(client, SOURCE)
            _remove_volume(client, DEST)
        began = time.perf_counter()
        _fill(source, image)
        print(f"workspace: {WORKSPACE_BYTES // MB} MB in {WORKSPACE_FILES} files + 200 notes, "
              f"written in {time.perf_counter() - began:.1f} s")  # fmt: skip
        moves, raws = [], []
        moved_bytes = 0
        for _ in range(RUNS):
            seconds, moved_bytes = _move(source, dest, image)
            moves.append(seconds)
            _remove_volume(dest, DEST)
            raws.append(_raw_copy(source, dest, image))
            _remove_volume(dest, DEST)
        move_rate = moved_bytes / MB / statistics.median(moves)
        raw_rate = moved_bytes / MB / statistics.median(raws)
        print(
            f"workspace move (stream + count + digest both sides): median {statistics.median(moves):.2f} s "
            f"= {move_rate:.0f} MB/s over {RUNS} runs ({', '.join(f'{s:.2f}' for s in moves)} s)"
        )
        print(
            f"baseline raw copy (docker cp style, unchecked):      median {statistics.median(raws):.2f} s "
            f"= {raw_rate:.0f} MB/s over {RUNS} runs ({', '.join(f'{s:.2f}' for s in raws)} s)"
        )
        print(f"move / raw copy rate: {move_rate / raw_rate:.2f}")
    finally:
        for client in {id(source): source, id(dest): dest}.values():
            _remove_volume(client, SOURCE)
            _remove_volume(client, DEST)
        stop()
    return {
        "workspace_move_mb_per_s": round(move_rate, 1),
        "raw_copy_mb_per_s": round(raw_rate, 1),
        "move_over_raw": round(move_rate / raw_rate, 2),
        "on_fleet": where.startswith("fleet"),
    }


if __name__ == "__main__":
    from benchmarks import setup_django

    setup_django()
    main()
