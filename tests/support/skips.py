"""A skipped test proved nothing, so a run with skips fails unless it says why it accepts them.

Every skip in this suite is a test that needs a real part this machine lacks: root (network namespaces,
device nodes), Docker, Chromium, nginx, promtool, a Slurm cluster or the test fleet. `make test` installs
and starts all of them, so a skip there means something is broken. Set DEVCLOUD_ALLOW_SKIPS to the
reason (e.g. "laptop without root") to let such a run pass; the reason and the skipped tests are printed
at the end. Under CI (CI=true) no reason is accepted. An expected failure (xfail) is not a skip.
"""

import os

import pytest

ALLOW = "DEVCLOUD_ALLOW_SKIPS"


def _under_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1", "yes")


class SkipGuard:
    def __init__(self):
        self.skipped: list[tuple[str, str]] = []

    def _note(self, report):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        self.skipped.append((report.nodeid, reason.removeprefix("Skipped: ")))

    def pytest_collectreport(self, report):
        if report.skipped:
            self._note(report)

    def pytest_runtest_logreport(self, report):
        if report.skipped and not hasattr(report, "wasxfail"):
            self._note(report)

    @property
    def allowed_because(self) -> str:
        return "" if _under_ci() else os.environ.get(ALLOW, "").strip()

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus):
        if self.skipped and not self.allowed_because and exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter):
        if not self.skipped:
            return
        write = terminalreporter.write_line
        reasons = sorted({reason for _, reason in self.skipped})
        if self.allowed_because:
            terminalreporter.section("skips allowed", sep="-", yellow=True)
            write(f"{len(self.skipped)} tests that need a real part did not run; {ALLOW}={self.allowed_because!r}")
        else:
            terminalreporter.section("skipped tests fail this run", sep="-", red=True)
            write(f"{len(self.skipped)} tests that need a real part did not run, so this run fails.")
            if _under_ci():
                write("Under CI (CI=true) every part must be there: install what is missing (make services).")
            else:
                write(f"Install what is missing (make services), or set {ALLOW}=\"<why this run may skip>\".")
        for reason in reasons:
            write(f"  {reason}")


def pytest_configure(config):
    config.pluginmanager.register(SkipGuard(), "devcloud-skip-guard")
