"""tests/support/skips.py, run on a small suite of its own in a separate pytest: a skipped test fails the
run unless DEVCLOUD_ALLOW_SKIPS says why, which the run then prints, and CI accepts no reason."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

SUITE = """
import shutil
import pytest

def test_runs():
    pass

@pytest.mark.skipif(shutil.which("no-such-tool") is None, reason="no-such-tool is not installed")
def test_needs_a_tool():
    pass

@pytest.mark.xfail(reason="a known bug, not a missing part")
def test_known_bug():
    assert False
"""


@pytest.fixture
def run_suite(tmp_path):
    (tmp_path / "test_suite.py").write_text(SUITE)

    def run(suite=None, other=None, **env):
        if suite is not None:
            (tmp_path / "test_suite.py").write_text(suite)
        if other is not None:
            (tmp_path / "test_other.py").write_text(other)
        environment = {k: v for k, v in os.environ.items() if k not in ("CI", "DEVCLOUD_ALLOW_SKIPS")}
        environment.update(env, PYTHONPATH=str(REPO))
        command = [sys.executable, "-m", "pytest", "-p", "tests.support.skips", "-p", "no:django"]
        command += ["-p", "no:randomly", "-p", "no:cacheprovider", "-q", "."]
        return subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=60)

    return run


def test_a_run_with_a_skipped_test_fails_and_names_what_was_missing(run_suite):
    result = run_suite()

    assert result.returncode == 1, result.stdout
    assert "1 passed, 1 skipped, 1 xfailed" in result.stdout
    assert "skipped tests fail this run" in result.stdout
    assert "no-such-tool is not installed" in result.stdout
    assert 'DEVCLOUD_ALLOW_SKIPS="<why this run may skip>"' in result.stdout


def test_a_run_that_gives_its_reason_passes_and_prints_the_reason(run_suite):
    result = run_suite(DEVCLOUD_ALLOW_SKIPS="laptop without nginx")

    assert result.returncode == 0, result.stdout
    assert "skips allowed" in result.stdout
    assert "DEVCLOUD_ALLOW_SKIPS='laptop without nginx'" in result.stdout
    assert "no-such-tool is not installed" in result.stdout


def test_ci_accepts_no_reason(run_suite):
    result = run_suite(CI="true", DEVCLOUD_ALLOW_SKIPS="laptop without nginx")

    assert result.returncode == 1, result.stdout
    assert "Under CI (CI=true) every part must be there" in result.stdout


def test_a_module_skipped_at_import_counts_too(run_suite):
    result = run_suite(
        "def test_runs():\n    pass\n",
        other="import pytest\npytest.importorskip('no_such_module_here')\n\ndef test_x():\n    pass\n",
    )

    assert result.returncode == 1, result.stdout
    assert "no_such_module_here" in result.stdout


def test_a_run_without_skips_passes_as_before(run_suite):
    result = run_suite("def test_runs():\n    pass\n")

    assert result.returncode == 0, result.stdout
    assert "skip" not in result.stdout
