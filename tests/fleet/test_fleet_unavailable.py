"""Where a fleet cannot run, the fleet tests skip and say what is missing, and nothing is started."""

import os

import pytest

from tests.support import fleet as fleet_module
from tests.support.fleet import Fleet, FleetUnavailable


def test_it_names_the_package_to_install_for_each_missing_tool(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")

    with pytest.raises(FleetUnavailable) as refused:
        Fleet.start(hosts=2)

    needed = [("ip", "iproute2"), ("nsenter", "util-linux"), ("docker-registry", "docker-registry")]
    for tool, package in needed:
        assert f"{tool} (Debian package {package})" in str(refused.value)
    assert "scripts/test-services.sh" in str(refused.value)


def test_it_refuses_to_start_without_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)

    with pytest.raises(FleetUnavailable, match="needs root"):
        Fleet.start(hosts=2)


def test_it_skips_the_test_that_asks_for_the_fleet(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(fleet_module, "_fleet", None)
    monkeypatch.setattr(fleet_module, "_unavailable", None)

    with pytest.raises(pytest.skip.Exception, match="no test fleet on this machine: .*needs root"):
        fleet_module.fleet_get()
