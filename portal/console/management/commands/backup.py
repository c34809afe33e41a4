"""`manage.py backup TARGET_DIR`: the database and every workspace into a new directory (portal/console/backup.py)."""

import sys

from django.core.management.base import BaseCommand, CommandError

from portal.console.backup import BackupError, backup_make


class Command(BaseCommand):
    help = (
        "Write the database (pg_dump, or a consistent SQLite copy) and every workspace (one tar each, "
        "through each host's engine) to TARGET_DIR, which must be new or empty. Exits 1 when a host's "
        "workspaces could not be read (the rest is backed up)."
    )

    def add_arguments(self, parser):
        parser.add_argument("target_dir")

    def handle(self, *args, target_dir, **options):
        try:
            manifest = backup_make(target_dir, say=self.stdout.write)
        except BackupError as error:
            raise CommandError(str(error)) from error
        if manifest["problems"]:
            sys.exit(1)
