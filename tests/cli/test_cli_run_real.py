"""`devcloud run` for real, as a CI job runs it: a fresh process with no TTY, against the live portal,
which launches a real container of the CPU image on the local engine; the command runs through the real
SSH gateway with the real OpenSSH client.

It proves that the command's exit code is the run's, that the instance is stopped afterwards whatever
happened (the command ended, SIGTERM, the time limit), and that a retried CI step launches nothing new.
"""

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from portal.accounts import services as accounts
from portal.accounts.models import SshKey
from portal.api import services
from portal.instances import services as instance_services
from portal.instances.models import Instance
from tests.conftest import give

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(300, func_only=True),
]


class Job:
    """A CI job's environment: an empty HOME, no known_hosts, no terminal, no SSH key (`devcloud run`
    makes one for the run), the portal's URL and token, and nothing from this process's environment but
    PATH."""

    def __init__(self, home, env: dict):
        self.home = home
        self.env = env

    def start(self, *args: str, env: dict | None = None) -> subprocess.Popen:
        return subprocess.Popen(
            [str(Path(sys.executable).with_name("devcloud")), *args],
            cwd=self.home,
            env={**self.env, **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # no controlling terminal, as on a CI runner
        )

    def run(self, *args: str, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
        process = self.start(*args, env=env)
        out, err = process.communicate(timeout=timeout)
        return subprocess.CompletedProcess(process.args, process.returncode, out, err)


@pytest.fixture
def job(alice, portal_with_gateway, settings, host, image, docker_portal, tmp_path):
    settings.DEVCLOUD_DRIVER = "docker"
    give(alice, 25)
    token = services.token_create(user=alice, name="ci", scope="launch", days=1)[1]
    home = tmp_path / "ci-home"
    home.mkdir()
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "DEVCLOUD_URL": portal_with_gateway,
        "DEVCLOUD_TOKEN": token,
    }
    return Job(home, env)


def the_only_instance(user) -> Instance:
    [instance] = Instance.objects.filter(user=user)
    return instance


@pytest.mark.parametrize("code", [0, 1, 137])
def test_the_runs_exit_code_is_the_commands_and_the_instance_is_stopped_afterwards(job, alice, image, code):
    command = {0: "python3 -c 'print(6 * 7)'", 1: "echo failing >&2; exit 1", 137: "kill -9 $$"}[code]

    result = job.run("run", "--size", "1x", "--image", image.key, "--", command)

    assert result.returncode == code, result.stderr
    if code == 0:
        assert result.stdout.strip() == "42"
    if code == 1:
        assert "failing" in result.stderr
    instance = the_only_instance(alice)
    assert instance.state in (Instance.State.STOPPING, Instance.State.STOPPED)
    assert instance.stop_reason == "user"
    assert f"{instance.short_id} is stop" in result.stderr  # it says so
    assert "\r" not in result.stderr  # no progress animation in a CI log


def test_a_retried_step_of_the_same_ci_attempt_launches_nothing_new(job, alice, image):
    ci = {"GITHUB_RUN_ID": "4242", "GITHUB_RUN_ATTEMPT": "1", "GITHUB_JOB": "gpu", "GITHUB_REPOSITORY": "o/p"}
    first = job.run("run", "--size", "1x", "--image", image.key, "--", "true", env=ci)
    again = job.run("run", "--size", "1x", "--image", image.key, "--", "true", env=ci)
    next_attempt = job.run(
        "run", "--size", "1x", "--image", image.key, "--", "true", env={**ci, "GITHUB_RUN_ATTEMPT": "2"}
    )

    assert first.returncode == 0, first.stderr
    assert again.returncode == 1
    assert "already launched" in again.stderr and "nothing was launched" in again.stderr
    assert next_attempt.returncode == 0, next_attempt.stderr
    assert Instance.objects.filter(user=alice).count() == 2


def test_sigterm_stops_the_instance(job, alice, image):
    process = job.start("run", "--size", "1x", "--image", image.key, "--", "echo started; sleep 600")
    # Wait until the command runs in the instance, then cancel the job as a CI runner does.
    assert process.stdout.readline().strip() == "started"
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)

    assert process.returncode == 128 + signal.SIGTERM
    assert "SIGTERM: stopping" in err
    instance = the_only_instance(alice)
    assert instance.state in (Instance.State.STOPPING, Instance.State.STOPPED)


def test_a_run_killed_outright_leaves_no_key_trusted_past_its_time_limit(job, alice, image):
    process = job.start(
        "run", "--size", "1x", "--image", image.key, "--timeout", "2m", "--", "echo started; sleep 600"
    )
    assert process.stdout.readline().strip() == "started"
    os.killpg(process.pid, signal.SIGKILL)  # the runner's hard kill: no clean-up runs
    process.communicate(timeout=30)
    killed_at = timezone.now()

    [key] = SshKey.objects.filter(user=alice)
    instance = the_only_instance(alice)
    try:
        # Trusted no longer than the run's own limit and the portal's grace (2 min + 60 s), to the minute.
        assert key.expires_at is not None
        assert key.expires_at - killed_at <= timedelta(minutes=4)
        assert instance.deadline_at is not None and key.expires_at >= instance.deadline_at
        assert accounts.sshkeys_prune_expired(now=key.expires_at) == 1
        assert not SshKey.objects.filter(user=alice).exists()
    finally:
        instance_services.instance_stop(user=alice, instance_id=instance.id)


def test_a_run_past_its_timeout_is_stopped_and_says_so(job, alice, image):
    started = time.monotonic()
    result = job.run("run", "--size", "1x", "--image", image.key, "--timeout", "40s", "--", "sleep 600")

    assert result.returncode == 124
    assert "passed its time limit of 40s" in result.stderr
    assert time.monotonic() - started < 90
    instance = the_only_instance(alice)
    assert instance.state in (Instance.State.STOPPING, Instance.State.STOPPED)
    # The portal holds the same limit, a minute's grace later, for a run whose CLI was killed.
    assert 90 <= (instance.deadline_at - instance.created_at).total_seconds() <= 110


def test_sync_sends_the_directory_without_git_and_runs_the_command_in_it(job, image, tmp_path):
    source = tmp_path / "project"
    (source / ".git").mkdir(parents=True)
    (source / ".git" / "config").write_text("secret")
    (source / "tests").mkdir()
    (source / "tests" / "check.py").write_text("print('checked', 6 * 7)\n")

    result = job.run(
        "run",
        "--size",
        "1x",
        "--image",
        image.key,
        "--sync",
        str(source),
        "--",
        "python3 tests/check.py; ls -a",
    )

    assert result.returncode == 0, result.stderr
    lines = result.stdout.split()
    assert lines[:2] == ["checked", "42"]
    assert "tests" in lines and ".git" not in lines
