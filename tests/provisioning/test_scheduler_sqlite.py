"""Placement on make run's embedded SQLite database, which has no GPU count triggers: the migrations apply,
and allocate() counts GPU rows there and keeps the same rules."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent

PLACEMENTS = """
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)

from portal.accounts.models import User
from portal.instances.models import Image, Instance
from provisioning.models import Gpu, GpuHost
from provisioning.scheduler import allocate, release

user = User.objects.create(email="alice@example.com")
image = Image.objects.create(key="cpu", name="CPU", sizes=["1x", "8x"], reference="devcloud/cpu:test")
for name in ("gpu-a", "gpu-b"):
    host = GpuHost.objects.create(name=name)
    Gpu.objects.bulk_create(
        Gpu(host=host, node_id=n + 1, gpu_id=n, render_minor=128 + 8 * n) for n in range(8)
    )

def launch(size):
    instance = Instance.objects.create(user=user, size=size, image=image, state=Instance.State.QUEUED)
    allocations = allocate(instance_id=instance.pk) or []
    print(size, sorted({allocation.gpu.host.name for allocation in allocations}), len(allocations))
    return instance

ones = [launch("1x"), launch("1x")]
launch("8x")
launch("8x")
for instance in ones:
    release(instance_id=instance.pk)
launch("8x")
"""


def on_embedded_sqlite(tmp_path, script: str) -> list[str]:
    """The lines `script` prints, run in a fresh interpreter on a new SQLite database (make run's)."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "portal.settings.base",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'devcloud.sqlite3'}",
    }
    run = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout.splitlines()


def test_it_places_on_the_embedded_sqlite_database_by_counting_gpu_rows(tmp_path):
    assert on_embedded_sqlite(tmp_path, PLACEMENTS) == [
        "1x ['gpu-a'] 1",
        "1x ['gpu-a'] 1",  # packs onto the host already in use
        "8x ['gpu-b'] 8",  # the whole free one
        "8x [] 0",  # no whole host left: it waits
        "8x ['gpu-a'] 8",  # the 1x launches gave theirs back
    ]


DRAINED_PLACEMENTS = """
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)

from portal.accounts.models import User
from portal.instances.models import Image, Instance
from provisioning.models import Gpu, GpuHost
from provisioning.scheduler import allocate

user = User.objects.create(email="alice@example.com")
image = Image.objects.create(key="cpu", name="CPU", sizes=["1x", "8x"], reference="devcloud/cpu:test")
host = GpuHost.objects.create(name="gpu-a")
Gpu.objects.bulk_create(Gpu(host=host, node_id=n + 1, gpu_id=n, render_minor=128 + 8 * n) for n in range(8))
Gpu.objects.filter(render_minor=128).update(is_drained=True, drained_reason="test")

for size in ("8x", "1x"):
    instance = Instance.objects.create(user=user, size=size, image=image, state=Instance.State.QUEUED)
    allocations = allocate(instance_id=instance.pk) or []
    print(size, sorted(allocation.gpu.render_minor for allocation in allocations))
"""


def test_it_skips_a_drained_gpu_on_the_embedded_sqlite_database(tmp_path):
    assert on_embedded_sqlite(tmp_path, DRAINED_PLACEMENTS) == [
        "8x []",  # seven GPUs in service: an 8x waits
        "1x [136]",  # renderD128, the lowest node, is drained
    ]
