"""`manage.py sync_images`: load containers/catalog.toml into the Image table and say what changed."""

from django.core.management.base import BaseCommand, CommandError

from portal.instances.catalog import CATALOG_PATH, CatalogError, catalog_sync


class Command(BaseCommand):
    help = "Load the image catalogue (containers/catalog.toml) into the Image table: create, update, disable."

    def add_arguments(self, parser):
        parser.add_argument(
            "--catalog", default=str(CATALOG_PATH), help="Catalogue file (default: %(default)s)."
        )

    def handle(self, *args, catalog, **options):
        try:
            report = catalog_sync(path=catalog)
        except CatalogError as error:
            raise CommandError(str(error)) from error
        for line in report.lines():
            self.stdout.write(line)
