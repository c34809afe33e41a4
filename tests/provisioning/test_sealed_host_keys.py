"""An engine's TLS client key is root on its host: the database holds it sealed (portal/lib/sealed.py), so
what a dump, a backup or a read-only SQL session carries does not open the engine. The key can be
rotated, and a portal with the wrong key says so instead of sending garbage to the engine."""

import importlib
import subprocess

import pytest
from cryptography.fernet import Fernet
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from portal.lib.sealed import SealingKeyError, Unreadable, seal, unseal
from provisioning import services
from provisioning.drivers.base import DriverError
from provisioning.drivers.docker_engine import DockerEngine
from provisioning.models import GpuHost, SlurmCluster

KEY_PEM = (
    "-----BEGIN PRIVATE KEY-----\n"
    "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKjMzEfYyjiWA4R4/M2bS1GB4t7NXp98C3SC6dV\n"
    "-----END PRIVATE KEY-----\n"
)
SECRET_PART = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKjMzEfYyjiWA4R4"
OLD_KEY = Fernet.generate_key().decode()
NEW_KEY = Fernet.generate_key().decode()


def make_host(name="gpu-01"):
    return GpuHost.objects.create(
        name=name,
        docker_url="tcp://gpu-01.internal:2376",
        private_address="10.0.0.5",
        tls_ca_cert="-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n",
        tls_client_cert="-----BEGIN CERTIFICATE-----\nCLIENT\n-----END CERTIFICATE-----\n",
        tls_client_key=KEY_PEM,
    )


def raw_column(host_id):
    with connection.cursor() as cursor:
        cursor.execute("SELECT tls_client_key FROM provisioning_gpuhost WHERE id = %s", [host_id])
        return cursor.fetchone()[0]


def test_it_stores_the_client_key_sealed_and_reads_it_back(db):
    host = make_host()
    host.name = "gpu-01-renamed"
    host.save()

    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM provisioning_gpuhost")
        everything = repr(cursor.fetchall())
    assert SECRET_PART not in everything
    assert "PRIVATE KEY" not in everything
    assert GpuHost.objects.get(pk=host.pk).tls_client_key == KEY_PEM


def test_a_pg_dump_of_the_database_carries_no_client_key(transactional_db):
    make_host()
    database = connection.settings_dict
    dump = subprocess.run(
        [
            "pg_dump",
            "--data-only",
            "--table=provisioning_gpuhost",
            f"--host={database['HOST'] or '127.0.0.1'}",
            f"--port={database['PORT'] or 5432}",
            f"--username={database['USER']}",
            database["NAME"],
        ],
        env={"PGPASSWORD": database["PASSWORD"] or "", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout

    assert "gpu-01" in dump  # the row is in the dump...
    assert SECRET_PART not in dump  # ...its key is not
    assert "PRIVATE KEY" not in dump


def test_dumpdata_carries_no_client_key(db):
    make_host()
    from io import StringIO

    out = StringIO()
    call_command("dumpdata", "provisioning.GpuHost", stdout=out)

    assert "gpu-01" in out.getvalue()
    assert SECRET_PART not in out.getvalue()


def test_the_migration_seals_keys_stored_in_the_clear_and_is_safe_to_rerun(db):
    host = make_host()
    with connection.cursor() as cursor:
        cursor.execute("UPDATE provisioning_gpuhost SET tls_client_key = %s WHERE id = %s", [KEY_PEM, host.pk])
    migration = importlib.import_module("provisioning.migrations.0010_sealed_host_keys")
    schema_editor = type("Editor", (), {"connection": connection})()

    migration.seal_plain_keys(None, schema_editor)
    sealed_once = raw_column(host.pk)
    migration.seal_plain_keys(None, schema_editor)

    assert SECRET_PART not in sealed_once
    assert raw_column(host.pk) == sealed_once
    assert GpuHost.objects.get(pk=host.pk).tls_client_key == KEY_PEM


def test_rotating_the_key_reseals_everything_and_the_old_key_then_opens_nothing(db, settings):
    settings.DEVCLOUD_SEALING_KEY = OLD_KEY
    host = make_host()
    cluster = SlurmCluster.objects.create(
        name="hpc", rest_url="http://127.0.0.1:1", rest_user="devcloud", token_sealed=seal("jwt-token"),
        image_root="/i", workspace_root="/w", job_root="/j", callback_url="http://127.0.0.1:8000",
    )

    settings.DEVCLOUD_SEALING_KEY = f"{NEW_KEY},{OLD_KEY}"
    call_command("rotate_sealing_key", stdout=open("/dev/null", "w"))
    call_command("rotate_sealing_key", stdout=open("/dev/null", "w"))  # a second run changes nothing readable

    settings.DEVCLOUD_SEALING_KEY = NEW_KEY
    assert GpuHost.objects.get(pk=host.pk).tls_client_key == KEY_PEM
    assert unseal(SlurmCluster.objects.get(pk=cluster.pk).token_sealed) == "jwt-token"
    settings.DEVCLOUD_SEALING_KEY = OLD_KEY
    with pytest.raises(Unreadable):
        GpuHost.objects.get(pk=host.pk).tls_client_key
    with pytest.raises(Unreadable):
        unseal(SlurmCluster.objects.get(pk=cluster.pk).token_sealed)


def test_rotation_moves_values_sealed_under_the_secret_key_to_a_key_of_ones_own(db, settings):
    settings.DEVCLOUD_SEALING_KEY = ""
    host = make_host()
    settings.DEVCLOUD_SEALING_KEY = NEW_KEY

    with pytest.raises(CommandError, match="GpuHost id"):
        call_command("rotate_sealing_key", stdout=open("/dev/null", "w"))
    call_command("rotate_sealing_key", "--from-secret-key", stdout=open("/dev/null", "w"))

    settings.SECRET_KEY = "another-secret-key-entirely-0123456789abcdefghijklmnopqrstuvwxyz"
    assert GpuHost.objects.get(pk=host.pk).tls_client_key == KEY_PEM


def test_rotation_refuses_without_a_key_to_rotate_to(db, settings):
    settings.DEVCLOUD_SEALING_KEY = ""

    with pytest.raises(CommandError, match="DEVCLOUD_SEALING_KEY is empty"):
        call_command("rotate_sealing_key")


def test_a_sealing_key_that_is_not_a_fernet_key_is_named(db, settings):
    settings.DEVCLOUD_SEALING_KEY = f"{NEW_KEY},not-a-key"

    with pytest.raises(SealingKeyError, match="DEVCLOUD_SEALING_KEY entry 2 is not a Fernet key"):
        seal("x")
    with pytest.raises(CommandError, match="entry 2 is not a Fernet key"):
        call_command("rotate_sealing_key")


def test_a_portal_with_the_wrong_key_says_so_instead_of_driving_the_engine(db, settings):
    settings.DEVCLOUD_SEALING_KEY = OLD_KEY
    host = make_host()
    settings.DEVCLOUD_SEALING_KEY = NEW_KEY
    host = GpuHost.objects.get(pk=host.pk)

    with pytest.raises(DriverError, match="TLS client key of host gpu-01 cannot be read") as raised:
        DockerEngine(host).client()
    assert raised.value.permanent
    with pytest.raises(services.HostError, match="paste the client key again"):
        services.host_check(host_id=host.pk)
    assert "cannot be read" in GpuHost.objects.get(pk=host.pk).last_error


def test_a_host_whose_key_cannot_be_read_still_loads_and_saves(db, settings):
    settings.DEVCLOUD_SEALING_KEY = OLD_KEY
    host = make_host()
    stored = raw_column(host.pk)
    settings.DEVCLOUD_SEALING_KEY = NEW_KEY

    host = GpuHost.objects.get(pk=host.pk)
    host.state = GpuHost.State.DRAINING
    host.save()

    assert raw_column(host.pk) == stored
