"""`manage.py restore SOURCE_DIR`: loads a backup made by `manage.py backup` (portal/console/backup.py)."""

import sys

from django.core.management.base import BaseCommand, CommandError

from portal.console.backup import BackupError, backup_restore


class Command(BaseCommand):
    help = (
        "Load the database and every workspace from a backup directory. Refuses a database that already "
        "has tables unless --replace-database, and leaves workspaces that already hold files alone unless "
        "--replace-workspaces. Exits 1 when a workspace could not be restored (the rest is)."
    )

    def add_arguments(self, parser):
        parser.add_argument("source_dir")
        parser.add_argument(
            "--replace-database", action="store_true", help="Drop every table of the database first."
        )
        parser.add_argument(
            "--replace-workspaces", action="store_true", help="Replace volumes and directories that hold files."
        )

    def handle(self, *args, source_dir, replace_database, replace_workspaces, **options):
        try:
            problems = backup_restore(
                source_dir,
                replace_database=replace_database,
                replace_workspaces=replace_workspaces,
                say=self.stdout.write,
            )
        except BackupError as error:
            raise CommandError(str(error)) from error
        if problems:
            sys.exit(1)
