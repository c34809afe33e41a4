from django.contrib.auth.hashers import Argon2PasswordHasher
from django.utils.module_loading import import_string

from portal.settings import base


def test_it_hashes_passwords_with_argon2_in_production_settings():
    assert issubclass(import_string(base.PASSWORD_HASHERS[0]), Argon2PasswordHasher)
    assert import_string(base.PASSWORD_HASHERS[0]).time_cost >= 2


def test_it_stores_an_argon2_hash_never_the_password(alice):
    from tests.conftest import PASSWORD

    assert alice.password.startswith("argon2$argon2id$")
    assert PASSWORD not in alice.password
    assert alice.check_password(PASSWORD)
