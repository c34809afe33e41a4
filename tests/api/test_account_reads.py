"""/api/v1/me, /ledger, /sizes, /images and /ssh: what a script reads about its account."""

import subprocess

import pytest
from django.utils import timezone

from tests.conftest import give

from .conftest import token_for

pytestmark = pytest.mark.django_db


def test_me_shows_balance_entitlements_and_limits(alice, settings):
    settings.MAX_LIVE_INSTANCES_PER_USER = 4
    give(alice, 25)
    me = token_for(alice, scope="read")[1].get("/api/v1/me").json()
    assert me["email"] == "alice@example.com" and me["email_verified"] is True
    assert me["balance_gpu_seconds"] == 25 * 3600 and me["balance_gpu_hours"] == "25.00"
    assert me["entitlements"] == {"tier": "free", "sizes": ["1x"]}
    assert me["limits"]["live_instances"] == 0 and me["limits"]["max_live_instances"] >= 1
    assert me["suspended"] is False and me["suspension"] == ""
    assert me["ssh"]["proxy_jump"] == f"{settings.SSH_GATEWAY_HOST}:{settings.SSH_GATEWAY_PORT}"


def test_the_ledger_is_paginated_newest_first(alice):
    for hours in (1, 2, 3):
        give(alice, hours)
    api = token_for(alice, scope="read")[1]
    first = api.get("/api/v1/ledger", {"page_size": 2}).json()
    assert first["count"] == 3 and [row["gpu_hours"] for row in first["results"]] == ["3.00", "2.00"]
    second = api.get(first["next"]).json()
    assert [row["gpu_hours"] for row in second["results"]] == ["1.00"]
    assert api.get("/api/v1/ledger", {"page": 9}).status_code == 404


def test_sizes_say_which_the_account_may_launch_and_why_not(alice, cpu):
    give(alice, 25)
    sizes = {row["key"]: row for row in token_for(alice, scope="read")[1].get("/api/v1/sizes").json()}
    assert sizes["1x"]["can_launch"] is True and sizes["1x"]["refusal"] == ""
    assert (
        sizes["8x"]["can_launch"] is False
        and "8x MI300X opens once an operator approves" in sizes["8x"]["refusal"]
    )


def test_sizes_of_a_suspended_account_carry_the_suspension(alice, cpu):
    give(alice, 25)
    type(alice).objects.filter(pk=alice.pk).update(suspended_at=timezone.now(), suspended_reason="abuse")
    sizes = token_for(alice, scope="read")[1].get("/api/v1/sizes").json()
    assert {row["refusal"] for row in sizes} == {
        "Your account is suspended: abuse. Contact support to lift it."
    }


def test_images_list_the_enabled_catalogue(alice, cpu):
    from provisioning.drivers import fake

    fake.make_image("jax", enabled=False)
    images = token_for(alice, scope="read")[1].get("/api/v1/images").json()
    assert [row["key"] for row in images] == ["cpu"]
    assert images[0]["sizes"] == ["1x", "8x"] and images[0]["launchable"] is True


def test_ssh_tells_where_the_gateway_is(alice, settings):
    settings.SSH_GATEWAY_HOST, settings.SSH_GATEWAY_PORT = "ssh.devcloud.example", 2200
    body = token_for(alice, scope="read")[1].get("/api/v1/ssh").json()
    assert body["proxy_jump"] == "ssh.devcloud.example:2200" and body["user"] == "developer"
    assert body["example"] == "ssh -J ssh.devcloud.example:2200 developer@<instance short id>"


@pytest.fixture
def gateway_key(tmp_path, settings):
    """The gateway's host key as the gateway makes it at its first start (with its .pub beside it)."""
    from portal.sshgateway.server import load_host_key

    path = tmp_path / "gateway_host_key"
    load_host_key(str(path))
    settings.SSH_GATEWAY_HOST_KEY = str(path)
    settings.SSH_GATEWAY_HOST, settings.SSH_GATEWAY_PORT = "ssh.devcloud.example", 2200
    return path


def _ssh_keygen_fingerprint(path) -> str:
    return subprocess.run(["ssh-keygen", "-lf", str(path)], capture_output=True, text=True, check=True).stdout.split()[1]


def test_ssh_publishes_the_gateway_host_key_as_a_known_hosts_line_and_its_fingerprint(alice, gateway_key):
    body = token_for(alice, scope="read")[1].get("/api/v1/ssh").json()
    key_type, blob = gateway_key.with_name("gateway_host_key.pub").read_text().split()[:2]
    assert body["host_key"] == f"[ssh.devcloud.example]:2200 {key_type} {blob}" and key_type == "ssh-ed25519"
    assert body["host_key_fingerprint"] == _ssh_keygen_fingerprint(gateway_key)
    assert body["host_key_note"] == ""


def test_ssh_reads_the_public_file_so_the_web_process_needs_no_private_key(alice, gateway_key):
    expected = _ssh_keygen_fingerprint(gateway_key)
    gateway_key.unlink()
    body = token_for(alice, scope="read")[1].get("/api/v1/ssh").json()
    assert body["host_key_fingerprint"] == expected and body["host_key"].startswith("[ssh.devcloud.example]:2200 ")


def test_ssh_derives_the_public_key_from_the_private_one_without_a_public_file(alice, gateway_key):
    expected = _ssh_keygen_fingerprint(gateway_key)
    gateway_key.with_name("gateway_host_key.pub").unlink()
    body = token_for(alice, scope="read")[1].get("/api/v1/ssh").json()
    assert body["host_key_fingerprint"] == expected and body["host_key"].startswith("[ssh.devcloud.example]:2200 ")


def test_ssh_names_a_gateway_on_port_22_by_its_bare_host(alice, gateway_key, settings):
    settings.SSH_GATEWAY_PORT = 22
    body = token_for(alice, scope="read")[1].get("/api/v1/ssh").json()
    assert body["host_key"].startswith("ssh.devcloud.example ssh-ed25519 ")


def test_ssh_says_so_when_the_gateway_never_started_and_has_no_key(alice, settings, tmp_path):
    settings.SSH_GATEWAY_HOST_KEY = str(tmp_path / "never-made")
    body = token_for(alice, scope="read")[1].get("/api/v1/ssh").json()
    assert body["host_key"] is None and body["host_key_fingerprint"] is None
    assert "the operator has not started it" in body["host_key_note"]
    me = token_for(alice, scope="read")[1].get("/api/v1/me").json()
    assert me["ssh"]["host_key"] is None
