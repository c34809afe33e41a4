"""`manage.py backup` and `manage.py restore`, as an operator runs them, against a real PostgreSQL database of
the test's own and this machine's Docker engine: what was backed up survives the loss of the database and
of the workspace volume, byte for byte (balances, ledger rows, a file in /workspace with its owner and mode);
restore refuses to overwrite a database that has tables unless told, and then copes with the ledger's
append-only triggers."""

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import docker
import pytest
from docker.types import Mount

from tests.support.images import build_cpu_image

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900, func_only=True)]

ROOT = Path(__file__).resolve().parents[2]
SERVER = "postgres://postgres@127.0.0.1:5432"


def psql(sql: str, database: str = "postgres") -> str:
    result = subprocess.run(
        ["psql", f"{SERVER}/{database}", "-tAc", sql], capture_output=True, text=True, check=True
    )
    return result.stdout.strip()


@pytest.fixture
def site(tmp_path):
    """A portal of its own: a migrated database, a portal id, environment for manage.py; removed after."""
    name = f"test_backup_{uuid.uuid4().hex[:8]}"
    portal_id = f"test-bk-{uuid.uuid4().hex[:8]}"
    psql(f"CREATE DATABASE {name}")
    environ = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "portal.settings.test",
        "DATABASE_URL": f"{SERVER}/{name}",
        "DEVCLOUD_PORTAL_ID": portal_id,
    }
    site = {"name": name, "portal_id": portal_id, "env": environ, "dir": tmp_path}
    manage(site, "migrate", "--no-input")
    yield site
    psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    client = docker.from_env()
    for volume in client.volumes.list(filters={"label": f"devcloud.portal={portal_id}"}):
        volume.remove(force=True)


def manage(site, *args, check=True) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=site["env"], capture_output=True, text=True
    )
    if check:
        assert result.returncode == 0, result.stdout + result.stderr
    return result


SEED = """
import uuid
from portal.accounts.models import User
from portal.credits import services
from provisioning.drivers.docker_engine import volume_labels, volume_name
from provisioning.models import GpuHost
host = GpuHost.objects.create(name="local-bk", docker_url="unix:///var/run/docker.sock")
for n, email in enumerate(["alice@example.com", "bob@example.com"]):
    user = User.objects.create(email=email)
    for k in range(3):
        services.credits_adjust(user=user, gpu_seconds=3600 * (n + k + 1), reason=f"grant {k}", actor=None,
                                idempotency_key=str(uuid.uuid4()))
    services.credits_adjust(user=user, gpu_seconds=-60, reason="correction", actor=None,
                            idempotency_key=str(uuid.uuid4()))
import docker
key = user.workspace_key.hex
docker.from_env().volumes.create(volume_name(key), labels=volume_labels(user.id, key))
print(user.id, volume_name(key))
"""

STATE = """
import json
from portal.credits.models import CreditAccount, LedgerEntry
print(json.dumps({
    "balances": sorted(CreditAccount.objects.values_list("user__email", "balance_gpu_seconds")),
    "ledger": [list(map(str, row)) for row in LedgerEntry.objects.order_by("id").values_list(
        "id", "account_id", "kind", "gpu_seconds", "balance_after", "idempotency_key", "reason", "created_at")],
}))
"""

# Writes 3 MB of random bytes, owned by the instance user, mode 0640, in a folder; prints their sha256.
WRITE = (
    "import hashlib, os; os.makedirs('/workspace/data', exist_ok=True); b = os.urandom(3 << 20); "
    "open('/workspace/data/model.bin', 'wb').write(b); os.chmod('/workspace/data/model.bin', 0o640); "
    "print(hashlib.sha256(b).hexdigest())"
)
READ = (
    "import hashlib, os; s = os.stat('/workspace/data/model.bin'); "
    "print(hashlib.sha256(open('/workspace/data/model.bin', 'rb').read()).hexdigest(), s.st_uid, oct(s.st_mode))"
)


def in_volume(volume: str, code: str) -> str:
    output = docker.from_env().containers.run(
        build_cpu_image(),
        entrypoint=["python3", "-c", code],
        user="1000:1000",
        network_mode="none",
        mounts=[Mount(target="/workspace", source=volume, type="volume")],
        remove=True,
    )
    return output.decode().strip()


def state(site) -> dict:
    return json.loads(manage(site, "shell", "-c", STATE).stdout.strip().splitlines()[-1])


def test_a_restored_backup_brings_back_balances_ledger_and_workspace_files_byte_for_byte(site):
    build_cpu_image()
    user_id, volume = manage(site, "shell", "-c", SEED).stdout.strip().splitlines()[-1].split()
    assert volume.startswith(f"{site['portal_id']}-ws-")
    written = in_volume(volume, WRITE)
    before = state(site)
    target = site["dir"] / "backup"

    made = manage(site, "backup", str(target))

    assert f"volume 1/1 {volume}" in made.stdout
    assert "Backed up the database and 1 workspaces" in made.stdout
    manifest = json.loads((target / "manifest.json").read_text())
    assert manifest["database"] == "postgresql" and manifest["problems"] == []

    # Into the database it came from: refused, nothing changed.
    refused = manage(site, "restore", str(target), check=False)
    assert refused.returncode != 0
    assert "--replace-database" in refused.stderr and "already has" in refused.stderr

    # The disaster: the database and the volume are gone.
    psql(f"DROP DATABASE {site['name']} WITH (FORCE)")
    psql(f"CREATE DATABASE {site['name']}")
    docker.from_env().volumes.get(volume).remove(force=True)

    restored = manage(site, "restore", str(target))

    assert "Restored the database and 1 workspaces" in restored.stdout
    assert state(site) == before
    assert in_volume(volume, READ) == f"{written} 1000 0o100640"
    assert docker.from_env().volumes.get(volume).attrs["Labels"]["devcloud.user"] == user_id


def test_restore_replaces_a_database_with_an_append_only_ledger_only_when_told(site):
    manage(site, "shell", "-c", SEED)
    before = state(site)
    target = site["dir"] / "backup"
    manage(site, "backup", str(target))
    # Something happened after the backup: a new ledger row, which the ledger's triggers never let go.
    manage(site, "shell", "-c", "from portal.accounts.models import User; from portal.credits import services; "
           "services.credits_adjust(user=User.objects.first(), gpu_seconds=7, reason='late', actor=None, "
           "idempotency_key='late')")
    assert state(site) != before

    manage(site, "restore", str(target), "--replace-database")

    assert state(site) == before
    # The restored ledger is append-only again.
    trigger = subprocess.run(
        ["psql", f"{SERVER}/{site['name']}", "-tAc", "DELETE FROM credits_ledgerentry"],
        capture_output=True, text=True,
    )
    assert "append-only" in trigger.stderr
