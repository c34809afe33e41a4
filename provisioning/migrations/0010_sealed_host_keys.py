"""Engines' TLS client keys (root on their hosts) are stored sealed (portal/lib/sealed.py): seal the rows
that hold one in the clear. Raw SQL, so the field's own sealing does not run twice; a row already sealed
is left alone, so the migration is safe to re-run."""

from django.db import migrations

import portal.lib.sealed


def seal_plain_keys(apps, schema_editor):
    from portal.lib.sealed import looks_sealed, seal

    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT id, tls_client_key FROM provisioning_gpuhost WHERE tls_client_key <> ''")
        for host_id, key in cursor.fetchall():
            if not looks_sealed(key):
                cursor.execute(
                    "UPDATE provisioning_gpuhost SET tls_client_key = %s WHERE id = %s", [seal(key), host_id]
                )


def unseal_keys(apps, schema_editor):
    from portal.lib.sealed import looks_sealed, unseal

    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT id, tls_client_key FROM provisioning_gpuhost WHERE tls_client_key <> ''")
        for host_id, key in cursor.fetchall():
            if looks_sealed(key):
                cursor.execute(
                    "UPDATE provisioning_gpuhost SET tls_client_key = %s WHERE id = %s", [unseal(key), host_id]
                )


class Migration(migrations.Migration):
    dependencies = [
        ("provisioning", "0009_gpu_health"),
    ]

    operations = [
        migrations.AlterField(
            model_name="gpuhost",
            name="tls_client_key",
            field=portal.lib.sealed.SealedTextField(blank=True, default=""),
        ),
        migrations.RunPython(seal_plain_keys, unseal_keys),
    ]
