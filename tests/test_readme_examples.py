"""The README's API and CLI examples, run as written against `make run` (scripts/run.py): the blocks
marked `<!-- run by tests/test_readme_examples.py -->` are taken from README.md itself, so an example that
drifts from what `make run` can do fails here. Only the port differs (each run takes a free one)."""

import json
import os
import re
import signal
import subprocess
import uuid

import httpx
import pytest

from tests.test_make_run import ROOT, portal_factory  # noqa: F401  (fixture, used by name)

pytestmark = pytest.mark.slow
MARKER = "<!-- run by tests/test_readme_examples.py -->"
README_URL = "http://127.0.0.1:8000"

MAKE_TOKEN = """
import uuid
from django.utils import timezone
from portal.accounts.models import User
from portal.api import services
from portal.credits import services as credits
user = User.objects.create_user(
    "ada@devcloud.localhost", "correct horse battery staple", email_verified_at=timezone.now()
)
credits.credits_adjust(user=user, gpu_seconds=25 * 3600, reason="README example", actor=None,
                       idempotency_key=str(uuid.uuid4()))
print(services.token_create(user=user, name="readme", scope="launch", days=1)[1])
"""


def readme_examples() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(re.escape(MARKER) + r"\n```sh\n(.*?)```", text, flags=re.DOTALL)


def test_the_readme_marks_its_api_and_cli_examples_for_this_test():
    blocks = readme_examples()

    assert len(blocks) == 2, "README.md should mark its curl and its devcloud example"
    assert "curl" in blocks[0] and "/api/v1/instances" in blocks[0]
    assert "devcloud launch" in blocks[1]
    for block in blocks:
        assert "uuidgen" not in block, "Debian does not install uuidgen"
        assert README_URL in block


def test_the_readme_api_and_cli_examples_run_as_written_under_make_run(portal_factory, tmp_path, monkeypatch):  # noqa: F811
    # Containers this portal makes carry its own id, so its reconciler leaves everyone else's alone.
    monkeypatch.setenv("DEVCLOUD_PORTAL_ID", f"readme-{uuid.uuid4().hex[:8]}")
    portal = portal_factory()
    portal.wait_for(r"DevCloud is running at")
    portal.wait_for(r"\w+@\S+ ready\.")
    url = f"http://127.0.0.1:{portal.port}"
    django_env = {
        **{k: v for k, v in os.environ.items() if k not in ("DATABASE_URL",)},
        "DJANGO_SETTINGS_MODULE": "portal.settings.dev",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'var' / 'devcloud.sqlite3'}",
    }
    made = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "python"), "manage.py", "shell", "-c", MAKE_TOKEN],
        cwd=ROOT, env=django_env, capture_output=True, text=True, timeout=120,
    )
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip().splitlines()[-1]
    # A shell as the newcomer has it: the repository as the working directory, no .venv on the PATH.
    shell_env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(tmp_path),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "TOKEN": token,
    }
    try:
        curl_block, cli_block = readme_examples()
        launched = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", curl_block.replace(README_URL, url)],
            cwd=ROOT, env=shell_env, capture_output=True, text=True, timeout=120,
        )
        assert launched.returncode == 0, launched.stderr
        instance = json.loads(launched.stdout)
        assert instance["image"] == "cpu" and instance["size"] == "1x", instance

        cli = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", cli_block.replace(README_URL, url)],
            cwd=ROOT, env=shell_env, capture_output=True, text=True, timeout=600,
        )
        assert cli.returncode == 0, cli.stdout + cli.stderr + portal.output[-3000:]
        assert f"Logged in to {url} as ada@devcloud.localhost" in cli.stdout
        assert "Billing has stopped." in cli.stdout
        assert (tmp_path / "config" / "devcloud" / "config.toml").stat().st_mode & 0o777 == 0o600
    finally:
        # Stop what the examples launched before make run goes, so no container outlives the test.
        headers = {"Authorization": f"Bearer {token}"}
        try:
            listed = httpx.get(f"{url}/api/v1/instances", headers=headers, timeout=30).json()
            rows = listed["results"] if isinstance(listed, dict) else listed
            for row in rows:
                if row["state"] not in ("stopped", "failed", "stopping"):
                    httpx.post(f"{url}/api/v1/instances/{row['id']}/stop", headers=headers, timeout=60)
        except httpx.HTTPError as error:
            # make run is gone already: say what it printed, and let the failure above be the one reported.
            print(f"could not stop the examples' instances ({error}); make run printed:\n{portal.output[-3000:]}")
        portal.proc.send_signal(signal.SIGINT)
        portal.proc.wait(timeout=120)
