"""The CPU JupyterLab image, built for real by scripts/build-images.sh once per test session.

On a machine that has never built it, that is debootstrap plus `docker build` (about three minutes);
afterwards the hash tag exists and the script returns in about a second. Use the `cpu_image` fixture, or
`build_cpu_image()` from other session-scoped code. Test modules that need it import the fixture:

    from tests.support.images import cpu_image_fixture  # noqa: F401  (registers `cpu_image`)

and mark themselves `pytest.mark.timeout(..., func_only=True)` so a cold build during setup is not
counted against the first test's timeout.
"""

import subprocess

import pytest

from portal.instances.catalog import REPO_ROOT, image_reference

# Bounds the cold build (debootstrap + pip downloads); it takes about three minutes here.
BUILD_TIMEOUT_SECONDS = 1800

_built: dict[str, str] = {}


def build_cpu_image() -> str:
    """Runs scripts/build-images.sh cpu (once per process) and returns the tag it printed.

    Fails the test, with the script's output, when the build fails or the script and the portal
    disagree about the tag.
    """
    if "cpu" not in _built:
        result = subprocess.run(
            ["bash", "scripts/build-images.sh", "cpu"],
            check=False,
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_SECONDS,
        )
        if result.returncode != 0:
            pytest.fail(f"scripts/build-images.sh cpu failed ({result.returncode}):\n{result.stderr[-4000:]}")
        tag = result.stdout.strip().splitlines()[-1]
        expected = image_reference("cpu")
        assert tag == expected, f"build-images.sh built {tag} but the portal would launch {expected}"
        _built["cpu"] = tag
    return _built["cpu"]


@pytest.fixture(scope="session", name="cpu_image")
def cpu_image_fixture() -> str:
    """The reference of the built CPU image, e.g. "devcloud/cpu:3f2a9c1e0b7d"."""
    return build_cpu_image()
