"""The repository's GitHub Actions workflow (examples/ci/github-actions.yml), run as a runner runs it.

Its `run:` steps go in order through `bash --noprofile --norc -eo pipefail`, as GitHub's runner runs
them, in a checkout of a small project with GPU tests, with the job's `env:` over a clean environment:
PATH, an empty HOME, no terminal, no known_hosts, no SSH key and no DevCloud token, only the variables
GitHub gives a run attempt (GITHUB_*) and, for `permissions: id-token: write`, the id-token request
variables, answered by the tests' local OpenID Connect issuer. Against it: the live portal, real
containers of the CPU image on the local engine, the real SSH gateway and OpenSSH.

Two steps are the runner's own and stand in here: `actions/checkout` (the test writes the checkout) and
the CLI's `pip install` (the repository's virtualenv, on PATH, already has it).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from portal.credits.models import CreditAccount, LedgerEntry
from portal.credits.services import ledger_post
from portal.instances.models import Instance
from portal.projects import services as projects
from portal.projects import trust
from portal.projects.models import ProjectMembership
from tests.conftest import give
from tests.support.oidc_issuer import (
    DEFAULT_REPOSITORY,
    oidc_issuer_fixture,  # noqa: F401  (registers oidc_issuer)
)

from .conftest import REPO

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(300, func_only=True),
]

WORKFLOW = REPO / "examples" / "ci" / "github-actions.yml"
HOUR = 3600
PASSING = "import unittest\n\nclass Gpu(unittest.TestCase):\n    def test_sum(self):\n        self.assertEqual(6 * 7, 42)\n"
FAILING = PASSING.replace("42)", "41)")


def the_job() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())["jobs"]["gpu-tests"]


class Runner:
    """One run attempt of the workflow's job, on a runner with nothing of this machine's but PATH."""

    def __init__(self, workspace: Path, home: Path, env: dict, overrides: dict):
        self.workspace, self.home, self.env = workspace, home, env
        # What this test's job `env:` says in place of the example's values (the portal, project, image).
        self.overrides = overrides

    def run_steps(self) -> list[subprocess.CompletedProcess]:
        """Each `run:` step in order, stopping at the first that fails, as the runner does."""
        job = the_job()
        env = {**self.env, **{name: str(value) for name, value in job["env"].items()}, **self.overrides}
        done = []
        for step in job["steps"]:
            if "uses" in step:
                assert step["uses"].startswith("actions/checkout@"), step  # the test wrote the checkout
                continue
            if step["run"].startswith("pip install"):
                continue  # the CLI is installed: this virtualenv's bin is on PATH
            assert "${{" not in step["run"], f"a step the test cannot run as written: {step['run']}"
            result = subprocess.run(
                ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]],
                cwd=self.workspace,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=240,
                start_new_session=True,  # no controlling terminal
                check=False,
            )
            done.append(result)
            if result.returncode != 0:
                break
        return done


@pytest.fixture
def project(alice, bob, settings, oidc_issuer, portal_with_gateway, host, image, docker_portal):
    """alice's project, with bob a member, 10 GPU-hours in its pool, trusting CI runs of the default
    repository; the portal launches on the local engine and trusts the local issuer as "github"."""
    settings.DEVCLOUD_DRIVER = "docker"
    settings.OIDC_PROVIDERS = {"github": oidc_issuer.url}
    settings.OIDC_AUDIENCE = portal_with_gateway
    give(alice, 25)
    give(bob, 25)
    made = projects.project_create(user=alice, slug="gpu-project", name="GPU project")
    ProjectMembership.objects.create(project=made, user=bob)
    ledger_post(
        account=CreditAccount.objects.get(project=made),
        kind=LedgerEntry.Kind.GRANT,
        gpu_seconds=10 * HOUR,
        idempotency_key="test-ci-grant",
        reason="Open-source CI grant",
    )
    trust.trusted_publisher_add(user=alice, slug=made.slug, provider="github", repository=DEFAULT_REPOSITORY)
    return made


def runner_for(
    tmp_path: Path, oidc_issuer, portal_url: str, image_key: str, *, tests: str, attempt: str = "1"
) -> Runner:
    workspace = tmp_path / f"checkout-{attempt}-{len(tests)}"
    (workspace / "tests" / "gpu").mkdir(parents=True)
    (workspace / "tests" / "gpu" / "test_gpu.py").write_text(tests)
    (workspace / ".git").mkdir()
    home = tmp_path / "runner-home"
    home.mkdir(exist_ok=True)
    run = {"GITHUB_RUN_ID": "7000000001", "GITHUB_RUN_ATTEMPT": attempt, "run_id": "7000000001"}
    env = {
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "HOME": str(home),
        "CI": "true",
        "GITHUB_ACTIONS": "true",
        "GITHUB_REPOSITORY": DEFAULT_REPOSITORY,
        "GITHUB_RUN_ID": run["GITHUB_RUN_ID"],
        "GITHUB_RUN_ATTEMPT": attempt,
        "GITHUB_JOB": "gpu-tests",
        **oidc_issuer.actions_environment(run_id=run["run_id"], run_attempt=attempt),
    }
    overrides = {"DEVCLOUD_URL": portal_url, "DEVCLOUD_PROJECT": "gpu-project", "DEVCLOUD_IMAGE": image_key}
    return Runner(workspace, home, env, overrides)


def personal_usage(*users) -> int:
    return LedgerEntry.objects.filter(account__user__in=users, kind=LedgerEntry.Kind.USAGE).count()


def test_the_workflow_runs_the_tests_on_an_instance_paid_by_the_pool_and_stops_it(
    project, alice, bob, oidc_issuer, portal_with_gateway, image, tmp_path
):
    pool_before = CreditAccount.objects.get(project=project).balance_gpu_seconds
    runner = runner_for(tmp_path, oidc_issuer, portal_with_gateway, image.key, tests=PASSING)

    [step] = runner.run_steps()

    assert step.returncode == 0, step.stderr
    assert "test_sum" in step.stderr and "OK" in step.stderr  # unittest reports on stderr
    assert "Signed in to" in step.stderr and "for project gpu-project" in step.stderr
    [instance] = Instance.objects.filter(project=project)
    assert instance.state in (Instance.State.STOPPING, Instance.State.STOPPED)
    assert instance.user.project_bot
    assert CreditAccount.objects.get(project=project).balance_gpu_seconds < pool_before
    assert personal_usage(alice, bob) == 0
    # The run's one-off SSH key is gone from the account again.
    assert not instance.user.ssh_keys.exists()

    # The step retried within the same run attempt: nothing new is launched.
    [again] = runner.run_steps()
    assert again.returncode == 1
    assert "nothing was launched" in again.stderr
    assert Instance.objects.filter(project=project).count() == 1


def test_the_steps_exit_code_is_the_tests_and_the_instance_is_stopped_when_they_fail(
    project, oidc_issuer, portal_with_gateway, image, tmp_path
):
    runner = runner_for(tmp_path, oidc_issuer, portal_with_gateway, image.key, tests=FAILING, attempt="2")

    [step] = runner.run_steps()

    assert step.returncode == 1, step.stderr
    assert "FAILED (failures=1)" in step.stderr
    [instance] = Instance.objects.filter(project=project)
    assert instance.state in (Instance.State.STOPPING, Instance.State.STOPPED)


def test_a_run_of_another_repository_gets_nothing(project, oidc_issuer, portal_with_gateway, image, tmp_path):
    runner = runner_for(tmp_path, oidc_issuer, portal_with_gateway, image.key, tests=PASSING, attempt="3")
    runner.env.update(oidc_issuer.actions_environment(repository="mallory/fork"))

    [step] = runner.run_steps()

    assert step.returncode == 3  # authentication
    assert "mallory/fork" in step.stderr
    assert not Instance.objects.filter(project=project).exists()
