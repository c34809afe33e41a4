"""The test fleet (tests/support/fleet.py): GPU hosts as dockerd engines in network namespaces, reached
over mutual TLS, and a registry. Other test packages get the same fixtures with the same import."""

import pytest

from tests.support.fleet import fleet_cpu_image_fixture, fleet_fixture  # noqa: F401


@pytest.fixture(scope="module")
def image(fleet, fleet_cpu_image):
    """The fleet's CPU image, pulled on every host: containers run it, and discovery runs its helper in it."""
    fleet.pull_on_all(fleet_cpu_image)
    return fleet_cpu_image
