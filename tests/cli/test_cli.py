"""`devcloud` against a live portal with a real token: login, launch --wait, ls, logs, stop, keys, --json,
and the exit codes a script can tell apart."""

import json
import stat

import pytest

from portal.instances.models import Instance
from tests.conftest import give

OK, REFUSED, USAGE, AUTH, CREDIT, SERVER = 0, 1, 2, 3, 4, 5
ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl alice@laptop\n"


@pytest.fixture
def logged_in(devcloud, portal, alice_token):
    result = devcloud("login", "--url", portal, "--token", alice_token)
    assert result.returncode == OK, result.stderr
    return devcloud


def test_login_keeps_the_token_readable_by_its_owner_only(devcloud, portal, alice_token):
    result = devcloud("login", "--url", portal, input=f"{alice_token}\n")
    assert result.returncode == OK, result.stderr
    assert "as alice@example.com" in result.stdout
    path = devcloud.home / "devcloud" / "config.toml"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert alice_token in path.read_text()
    assert json.loads(devcloud("whoami", "--json").stdout)["email"] == "alice@example.com"


def test_a_bad_token_exits_with_the_authentication_code_and_is_not_saved(devcloud, portal):
    result = devcloud("login", "--url", portal, "--token", "dcp_000000000000_wrong")
    assert result.returncode == AUTH
    assert "invalid, expired or revoked" in result.stderr
    assert not (devcloud.home / "devcloud" / "config.toml").exists()


def test_not_logged_in_is_an_authentication_error(devcloud, portal):
    result = devcloud("ls")
    assert result.returncode == AUTH and "devcloud login" in result.stderr


def test_a_usage_error_exits_with_2(logged_in):
    assert logged_in("launch", "--image", "cpu").returncode == USAGE
    assert logged_in("no-such-command").returncode == USAGE


def test_launch_wait_shows_the_steps_then_ls_logs_and_stop(logged_in, alice):
    launched = logged_in("launch", "--size", "1x", "--image", "cpu", "--wait")
    assert launched.returncode == OK, launched.stderr
    assert "Waiting for JupyterLab" in launched.stderr and "Ready" in launched.stderr
    instance = Instance.objects.get(user=alice)
    assert instance.state == Instance.State.RUNNING
    assert f"Instance {instance.short_id} is running" in launched.stdout
    assert f"/instances/{instance.id}/open" in launched.stdout

    listed = json.loads(logged_in("ls", "--json").stdout)
    assert [(row["short_id"], row["state"]) for row in listed] == [(instance.short_id, "running")]
    assert instance.short_id in logged_in("ls").stdout

    assert logged_in("logs", instance.short_id).returncode == OK
    assert logged_in("open", instance.short_id).stdout.strip().endswith(f"/instances/{instance.id}/open")

    stopped = logged_in("--json", "stop", instance.short_id)
    assert stopped.returncode == OK, stopped.stderr
    assert json.loads(stopped.stdout)["state"] in ("stopping", "stopped")
    instance.refresh_from_db()
    assert instance.state in (Instance.State.STOPPING, Instance.State.STOPPED)
    again = logged_in("stop", str(instance.id))
    assert again.returncode == REFUSED and "already" in again.stderr


def test_not_enough_credit_exits_with_its_own_code(devcloud, portal, bob):
    from portal.api import services

    give(bob, 0.1)
    token = services.token_create(user=bob, name="cli", scope="launch", days=1)[1]
    devcloud("login", "--url", portal, "--token", token)
    result = devcloud("launch", "--size", "1x", "--image", "cpu")
    assert result.returncode == CREDIT
    assert "GPU-hours short" in result.stderr
    assert not Instance.objects.filter(user=bob).exists()


def test_a_read_token_cannot_launch_and_gets_the_authentication_code(devcloud, portal, alice):
    from portal.api import services

    give(alice, 25)
    token = services.token_create(user=alice, name="ro", scope="read", days=1)[1]
    devcloud("login", "--url", portal, "--token", token)
    result = devcloud("launch", "--size", "1x", "--image", "cpu", "--json")
    assert result.returncode == AUTH
    assert json.loads(result.stdout)["error"]["type"] == "urn:devcloud:problem:insufficient-scope"


def test_an_unreachable_portal_is_a_server_error(devcloud, alice_token):
    result = devcloud("whoami", env={"DEVCLOUD_URL": "http://127.0.0.1:9", "DEVCLOUD_TOKEN": alice_token})
    assert result.returncode == SERVER and "Could not reach" in result.stderr


def test_bad_input_is_refused_with_the_pages_message(logged_in):
    result = logged_in("launch", "--size", "2x", "--image", "cpu")
    assert result.returncode == REFUSED
    assert "Unknown size '2x'. Choose one of: 1x MI300X, 8x MI300X." in result.stderr


def test_keys_add_and_ls(logged_in, tmp_path, alice):
    pub = tmp_path / "id_ed25519.pub"
    pub.write_text(ED25519)
    added = logged_in("keys", "add", str(pub))
    assert added.returncode == OK, added.stderr
    assert "Added 'id_ed25519'" in added.stdout
    assert [row["name"] for row in json.loads(logged_in("keys", "ls", "--json").stdout)] == ["id_ed25519"]
    private = tmp_path / "id_ed25519"
    private.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nxx\n-----END OPENSSH PRIVATE KEY-----\n")
    refused = logged_in("keys", "add", str(private))
    assert refused.returncode == REFUSED and "This is a private key" in refused.stderr
    assert alice.ssh_keys.count() == 1


def test_balance_and_images(logged_in):
    assert "25.00 GPU-hours" in logged_in("balance").stdout
    assert json.loads(logged_in("images", "--json").stdout)[0]["key"] == "cpu"


def test_balance_shows_a_small_debt_instead_of_minus_nothing(logged_in, alice):
    # 25 GPU-hours granted, then 25 hours and 15 seconds charged: 15 GPU-seconds in debt.
    give(alice, -(25 * 3600 + 15) / 3600, reason="Usage past the balance")

    shown = logged_in("balance").stdout

    assert "-0.0042 GPU-hours" in shown, shown
    assert "-0.00 GPU-hours" not in shown
