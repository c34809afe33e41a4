"""A workspace streams from one volume to another through the engines' archive API and is checked on
arrival, on the local engine: files, nested folders, modes and owner uid 1000 arrive intact, progress is
reported, and a copy changed on the way is refused while the source stays as it was."""

import pytest

from provisioning.workspaces import WorkspaceMismatch, tally, volume_copy
from tests.support.docker_instances import docker_client, docker_portal_fixture  # noqa: F401
from tests.support.images import cpu_image_fixture  # noqa: F401  (registers cpu_image)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300, func_only=True)]

MB = 1024 * 1024

# Runs as uid 1000, as the instance's user writes its files.
FILL = """
set -e
cd /workspace
mkdir -p notebooks/2024/runs data
head -c 52428800 /dev/urandom > data/weights.bin
echo 'print("hello")' > notebooks/2024/runs/train.py
chmod 750 notebooks/2024/runs/train.py
echo secret > notebooks/.env
chmod 600 notebooks/.env
ln -s ../data/weights.bin notebooks/weights
"""

LIST = (
    "cd /workspace && find . -printf '%y %m %U:%G %s %p %l\\n' | LC_ALL=C sort && sha256sum data/weights.bin"
)


@pytest.fixture
def engine(docker_portal):
    return docker_client()


def make_volume(engine, portal_id, name):
    return engine.volumes.create(f"{portal_id}-{name}", labels={"devcloud.portal": portal_id}).name


def run(engine, image, volume, script, user="1000:1000"):
    return engine.containers.run(
        image,
        entrypoint=["sh", "-c", script],
        user=user,
        network_mode="none",
        mounts=[{"Target": "/workspace", "Source": volume, "Type": "volume"}],
        remove=True,
    ).decode()


@pytest.fixture
def source(engine, docker_portal, cpu_image):
    volume = make_volume(engine, docker_portal, "source")
    run(engine, cpu_image, volume, FILL)
    return volume


def copy(engine, image, source, dest, **extra):
    return volume_copy(
        source_client=engine, source_volume=source, source_image=image,
        dest_client=engine, dest_volume=dest, dest_image=image, **extra,
    )  # fmt: skip


def test_it_moves_files_folders_modes_and_owner_intact(engine, docker_portal, cpu_image, source):
    dest = f"{docker_portal}-dest"

    result = copy(engine, cpu_image, source, dest, dest_labels={"devcloud.portal": docker_portal})

    listing = run(engine, cpu_image, dest, LIST)
    assert listing == run(engine, cpu_image, source, LIST)
    assert "f 600 1000:1000 7 ./notebooks/.env" in listing
    assert "f 750 1000:1000 15 ./notebooks/2024/runs/train.py" in listing
    assert f"f 644 1000:1000 {50 * MB} ./data/weights.bin" in listing
    assert "l 777 1000:1000" in listing and "../data/weights.bin" in listing
    assert (result.files, result.bytes) == (3, 50 * MB + 7 + 15)
    assert engine.volumes.get(dest).attrs["Labels"]["devcloud.portal"] == docker_portal


def test_it_reports_progress_from_nothing_to_everything(
    engine, docker_portal, cpu_image, source, monkeypatch
):
    monkeypatch.setattr("provisioning.workspaces.PROGRESS_EVERY_SECONDS", 0.0)
    reports = []

    copy(
        engine, cpu_image, source, f"{docker_portal}-dest",
        progress=lambda moved, total: reports.append((moved, total)),
    )  # fmt: skip

    total = 50 * MB + 7 + 15
    assert reports[0] == (0, total)
    assert reports[-1] == (total, total)
    assert any(0 < moved < total for moved, _ in reports), "no report while the bytes were moving"
    assert [moved for moved, _ in reports] == sorted(moved for moved, _ in reports)


def test_it_refuses_a_copy_changed_before_the_check_and_keeps_the_source(
    engine, docker_portal, cpu_image, source
):
    before = tally(engine, cpu_image, source)

    def tamper(client, volume):
        run(client, cpu_image, volume, "echo tampered >> /workspace/notebooks/2024/runs/train.py")

    with pytest.raises(WorkspaceMismatch) as refused:
        copy(engine, cpu_image, source, f"{docker_portal}-dest", before_verify=tamper)

    assert "file contents differ" in str(refused.value)
    assert f"bytes arrived instead of {before.bytes}" in str(refused.value)
    assert tally(engine, cpu_image, source) == before


def test_it_refuses_a_copy_missing_a_file(engine, docker_portal, cpu_image, source):
    def lose(client, volume):
        run(client, cpu_image, volume, "rm /workspace/notebooks/.env")

    with pytest.raises(WorkspaceMismatch, match="2 of 3 files arrived"):
        copy(engine, cpu_image, source, f"{docker_portal}-dest", before_verify=lose)


def test_it_sets_aside_what_the_destination_already_held(engine, docker_portal, cpu_image, source):
    dest = make_volume(engine, docker_portal, "dest")
    run(engine, cpu_image, dest, "echo mine > /workspace/draft.txt && mkdir /workspace/old")

    result = copy(engine, cpu_image, source, dest)

    assert result.set_aside.startswith("kept-")
    listing = run(engine, cpu_image, dest, "cd /workspace && find . | LC_ALL=C sort")
    assert f"./{result.set_aside}/draft.txt" in listing.split()
    assert f"./{result.set_aside}/old" in listing.split()
    assert "./draft.txt" not in listing.split()
    assert "./data/weights.bin" in listing.split()
