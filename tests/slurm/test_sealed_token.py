"""A Slurm cluster's JWT is stored sealed: a database dump (what `pg_dump` or a stolen backup holds)
does not carry it in the clear, and a value sealed under another key is refused, not misread."""

import pytest
from django.db import connection

from portal.lib.sealed import Unreadable, seal, unseal

TOKEN = "eyJhbGciOiJIUzI1NiJ9.eyJleHAiOjQxMDI0NDQ4MDAsInN1biI6ImRldmNsb3VkIn0.c2lnbmF0dXJl"


def test_the_stored_token_is_not_the_token(db):
    from provisioning.models import SlurmCluster

    SlurmCluster.objects.create(
        name="hpc", rest_url="http://127.0.0.1:1", rest_user="devcloud", token_sealed=seal(TOKEN),
        image_root="/i", workspace_root="/w", job_root="/j", callback_url="http://127.0.0.1:8000",
    )
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM provisioning_slurmcluster")
        dumped = repr(cursor.fetchall())

    assert TOKEN not in dumped
    assert unseal(SlurmCluster.objects.get().token_sealed) == TOKEN


def test_a_value_sealed_under_another_key_is_refused(settings):
    sealed = seal(TOKEN)
    settings.SECRET_KEY = "another-portal-entirely-0123456789abcdefghijklmnopqrstuvwxyz"

    with pytest.raises(Unreadable, match="Enter it again"):
        unseal(sealed)
