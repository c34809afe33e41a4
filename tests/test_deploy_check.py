"""Production settings: `manage.py check --deploy` is clean with the environment the README documents, and
the portal refuses to start with a missing or insecure SECRET_KEY.

Each check runs in a fresh interpreter, because settings are read once per process and these tests need
portal.settings.production, not the test settings this process runs under.
"""

import os
import secrets
import string
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# What an operator sets in production, as in the README's configuration table.
DOCUMENTED_ENV = {
    "DJANGO_SETTINGS_MODULE": "portal.settings.production",
    "ALLOWED_HOSTS": "devcloud.example.com",
    "CSRF_TRUSTED_ORIGINS": "https://devcloud.example.com",
    "SITE_URL": "https://devcloud.example.com",
    "DATABASE_URL": "postgres://devcloud:db-password@db.internal:5432/devcloud",
    "REDIS_URL": "redis://redis.internal:6379/0",
    "EMAIL_HOST": "smtp.example.com",
    "EMAIL_PORT": "587",
    "EMAIL_HOST_USER": "devcloud",
    "EMAIL_HOST_PASSWORD": "smtp-password",
    "EMAIL_USE_TLS": "true",
    "DEFAULT_FROM_EMAIL": "DevCloud <noreply@devcloud.example.com>",
    "GITHUB_CLIENT_ID": "Iv1.0123456789abcdef",
    "GITHUB_CLIENT_SECRET": "0123456789abcdef0123456789abcdef01234567",
    "TRUSTED_PROXY_COUNT": "1",
    "GATEWAY_LAB_URL": "https://{instance_id}.lab.devcloud.example.com",
    "GATEWAY_AUTH_SECRET": "k3J9vQ2xL8mN4pR7sT1wY6zA0bC5dE9fG2hJ",
}


def random_secret_key(length=60):
    alphabet = string.ascii_letters + string.digits + "!@#%^*(-_=+)"
    return "".join(secrets.choice(alphabet) for _ in range(length))


def manage(*args, **env_overrides):
    """Run manage.py in a clean environment (nothing leaks from the test run). Returns CompletedProcess."""
    return run([sys.executable, str(ROOT / "manage.py"), *args], **env_overrides)


def run(argv, **env_overrides):
    """Run `argv` in a clean environment with DOCUMENTED_ENV and the overrides. Returns CompletedProcess."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "HOME": os.environ.get("HOME", "/"),
    }
    env.update(DOCUMENTED_ENV)
    for name, value in env_overrides.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return subprocess.run(
        argv,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_it_passes_the_deploy_check_with_no_warnings():
    result = manage("check", "--deploy", "--fail-level", "WARNING", SECRET_KEY=random_secret_key())

    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    # The one silenced check is axes.W002, which looks for axes' middleware by its dotted path; the
    # portal runs a subclass of it (test_the_silenced_axes_check_is_only_a_name_mismatch).
    assert "System check identified no issues (1 silenced)." in output
    assert "WARNINGS" not in output


def test_the_silenced_axes_check_is_only_a_name_mismatch():
    import axes.middleware
    from django.conf import settings
    from django.utils.module_loading import import_string

    assert settings.SILENCED_SYSTEM_CHECKS == ["axes.W002"]
    assert settings.MIDDLEWARE[-1] == "portal.accounts.middleware.AxesMiddleware"
    assert issubclass(import_string(settings.MIDDLEWARE[-1]), axes.middleware.AxesMiddleware)


def test_it_fails_the_deploy_check_when_https_is_turned_off():
    # Proves the check above can fail: plain HTTP in production is a warning, and warnings fail the check.
    result = manage(
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        SECRET_KEY=random_secret_key(),
        SECURE_SSL_REDIRECT="false",
    )

    assert result.returncode != 0
    assert "security.W008" in result.stdout + result.stderr


@pytest.mark.parametrize(
    "secret_key",
    [
        pytest.param(None, id="unset (the built-in insecure default)"),
        pytest.param("insecure-dev-key-change-me", id="the dev default"),
        pytest.param("too-short-0123456789", id="shorter than 50 characters"),
    ],
)
def test_it_refuses_to_start_with_an_insecure_secret_key(secret_key):
    result = manage("check", SECRET_KEY=secret_key)

    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert "SECRET_KEY is unset or insecure" in result.stderr


@pytest.mark.parametrize(
    ("override", "named", "fix"),
    [
        pytest.param({"GATEWAY_LAB_URL": ""}, "GATEWAY_LAB_URL is empty", "https://{instance_id}.lab.", id="path-mode labs"),
        pytest.param(
            {"GATEWAY_LAB_URL": "http://{instance_id}.lab.example.com"}, "GATEWAY_LAB_URL is http://", "https://",
            id="labs over http",
        ),
        pytest.param({"DEBUG": "true"}, "DEBUG is on", "Set DEBUG=false", id="debug on"),
        pytest.param({"SITE_URL": "http://devcloud.example.com"}, "SITE_URL is http://", "https://", id="http site"),
        pytest.param({"GATEWAY_AUTH_SECRET": None}, "GATEWAY_AUTH_SECRET is missing", "token_urlsafe", id="no gateway secret"),
        pytest.param({"GATEWAY_AUTH_SECRET": "short"}, "GATEWAY_AUTH_SECRET is missing or shorter", "32", id="short gateway secret"),
        pytest.param({"ALLOWED_HOSTS": None}, "ALLOWED_HOSTS is localhost", "host name", id="default allowed hosts"),
        pytest.param({"ALLOWED_HOSTS": "*"}, "ALLOWED_HOSTS is *", "no *", id="any host"),
        pytest.param({"DEVCLOUD_SEALING_KEY": "CHANGE-ME"}, "DEVCLOUD_SEALING_KEY entry 1 is not a Fernet key", "generate_key", id="bad sealing key"),
        pytest.param({"EMAIL_HOST_PASSWORD": "CHANGE-ME"}, "EMAIL_HOST_PASSWORD still hold CHANGE-ME", "fill them in", id="unfilled template"),
    ],
)
@pytest.mark.parametrize(
    "argv",
    [
        pytest.param([sys.executable, str(ROOT / "manage.py"), "check", "--deploy"], id="check --deploy"),
        # What uvicorn does first in the web unit (deploy/systemd/devcloud-web.service).
        pytest.param([sys.executable, "-c", "import portal.asgi; print('started')"], id="web"),
    ],
)
def test_it_refuses_to_start_with_an_unsafe_setting_naming_it_and_its_fix(override, named, fix, argv):
    result = run(argv, SECRET_KEY=random_secret_key(), **override)

    assert result.returncode != 0
    assert "started" not in result.stdout
    assert "Refusing to start with unsafe production settings" in result.stderr
    assert named in result.stderr
    assert fix in result.stderr


def test_the_workers_refuse_to_start_with_path_mode_labs():
    from tests.deploy.kit import exec_start

    for unit in ("devcloud-worker.service", "devcloud-provisioning.service", "devcloud-beat.service"):
        result = run(exec_start(unit), SECRET_KEY=random_secret_key(), GATEWAY_LAB_URL="")

        assert result.returncode != 0, unit
        assert "GATEWAY_LAB_URL is empty" in result.stderr, unit


def test_it_names_every_unsafe_setting_at_once():
    result = manage("check", SECRET_KEY=None, DEBUG="true", GATEWAY_LAB_URL="", SITE_URL="http://x.example.com")

    for named in ("SECRET_KEY", "DEBUG is on", "GATEWAY_LAB_URL is empty", "SITE_URL is http://"):
        assert named in result.stderr
