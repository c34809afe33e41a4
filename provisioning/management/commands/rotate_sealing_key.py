"""Re-seal every value stored sealed (portal/lib/sealed.py) with the first key of DEVCLOUD_SEALING_KEY.

Rotating the key (deploy/README.md, "Rotating the sealing key"):
  1. DEVCLOUD_SEALING_KEY=<new key>,<old key> in /etc/devcloud/devcloud.env; restart DevCloud.
  2. manage.py rotate_sealing_key
  3. DEVCLOUD_SEALING_KEY=<new key>; restart. The old key then opens nothing.
Moving from the key derived from SECRET_KEY to one of your own: set DEVCLOUD_SEALING_KEY=<new key> and run
`manage.py rotate_sealing_key --from-secret-key` before restarting.

Safe to re-run: a value already sealed with the new key is sealed with it again.
"""

from cryptography.fernet import InvalidToken
from django.apps import apps
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connection, transaction

from portal.lib.sealed import SealedTextField, SealingKeyError, configured_keys, derived_key, keyring, looks_sealed

# Columns sealed by hand rather than through SealedTextField: (app label, model, field).
HAND_SEALED = [("provisioning", "SlurmCluster", "token_sealed")]


def sealed_columns() -> list[tuple[type, str]]:
    """Every (model, column) that holds sealed values."""
    columns = [(apps.get_model(app, model), field) for app, model, field in HAND_SEALED]
    for model in apps.get_models():
        columns += [(model, f.column) for f in model._meta.concrete_fields if isinstance(f, SealedTextField)]
    return columns


class Command(BaseCommand):
    help = "Re-seal every sealed value in the database with the first key of DEVCLOUD_SEALING_KEY."

    def add_arguments(self, parser):
        parser.add_argument(
            "--from-secret-key",
            action="store_true",
            help="Also open values sealed with the key derived from SECRET_KEY (used while "
            "DEVCLOUD_SEALING_KEY was empty).",
        )

    def handle(self, *args, from_secret_key=False, **options):
        try:
            keys = configured_keys()
        except SealingKeyError as error:
            raise CommandError(str(error)) from error
        if not keys:
            raise CommandError(
                "DEVCLOUD_SEALING_KEY is empty, so there is no key to rotate to. Set it to the new key "
                "(followed by the old one, comma-separated), then run this again; add --from-secret-key "
                "when the values were sealed while it was empty."
            )
        ring = keyring(*([derived_key(settings.SECRET_KEY)] if from_secret_key else []))
        resealed, unreadable = 0, []
        for model, column in sealed_columns():
            table = connection.ops.quote_name(model._meta.db_table)
            quoted = connection.ops.quote_name(column)
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(f"SELECT id, {quoted} FROM {table} WHERE {quoted} <> '' FOR UPDATE")  # noqa: S608
                for row_id, value in cursor.fetchall():
                    try:
                        if looks_sealed(value):
                            new = ring.rotate(value.encode()).decode()
                        else:  # stored before the column was sealed
                            new = ring.encrypt(value.encode()).decode()
                    except InvalidToken:
                        unreadable.append(f"{model._meta.label} id {row_id} ({column})")
                        continue
                    cursor.execute(f"UPDATE {table} SET {quoted} = %s WHERE id = %s", [new, row_id])  # noqa: S608
                    resealed += 1
        self.stdout.write(f"Re-sealed {resealed} value(s) with the first key of DEVCLOUD_SEALING_KEY.")
        if unreadable:
            raise CommandError(
                f"{len(unreadable)} value(s) open with none of the keys given: {', '.join(unreadable)}. Add the "
                "key they were sealed with after the new one in DEVCLOUD_SEALING_KEY (or pass --from-secret-key "
                "if they were sealed while it was empty) and run this again, or enter them again."
            )
