"""Killing a fleet host's dockerd takes its engine off the network; restarting it brings it back."""

import pytest
import requests.exceptions

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120, func_only=True)]


def test_it_stops_answering_when_the_hosts_dockerd_is_killed_and_answers_after_restart(fleet):
    down, other = fleet.hosts[-1], fleet.hosts[0]
    client = down.client(timeout=5)
    root_dir = client.info()["DockerRootDir"]

    down.kill()
    try:
        with pytest.raises(requests.exceptions.ConnectionError):
            client.ping()
        # The other host is a separate machine: it does not notice.
        assert other.client(timeout=5).ping() is True
    finally:
        down.restart()

    assert client.ping() is True
    assert client.info()["DockerRootDir"] == root_dir


def test_it_stops_answering_while_the_host_is_cut_off_the_network(fleet):
    cut = fleet.hosts[-1]
    client = cut.client(timeout=3)

    cut.disconnect()
    try:
        with pytest.raises(requests.exceptions.ConnectionError):
            client.ping()
    finally:
        cut.reconnect()

    assert client.ping() is True
