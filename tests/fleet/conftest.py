"""The test fleet (tests/support/fleet.py): GPU hosts as dockerd engines in network namespaces, reached
over mutual TLS, and a registry. Other test packages get the same fixtures with the same import."""

from tests.support.fleet import fleet_cpu_image_fixture, fleet_fixture  # noqa: F401
