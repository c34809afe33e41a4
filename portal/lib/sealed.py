"""Secrets kept in the database sealed (encrypted and authenticated), so a database dump does not carry
them in the clear: Fernet (AES-128-CBC with HMAC-SHA256, from `cryptography`) with a key from the
settings.

DEVCLOUD_SEALING_KEY is a comma-separated list of Fernet keys (make one: `python -c "from
cryptography.fernet import Fernet; print(Fernet.generate_key().decode())"`). The first seals; every key
in the list opens, so a key can be rotated: put the new key first and the old one after it, run
`manage.py rotate_sealing_key` (which re-seals every sealed value with the first key), then drop the old
key. Empty: one key derived from SECRET_KEY, so rotating SECRET_KEY without setting DEVCLOUD_SEALING_KEY
makes sealed values unreadable (unseal says so).
"""

import base64
import binascii

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings
from django.db import models
from django.db.models.query_utils import DeferredAttribute


class Unreadable(ValueError):
    """A sealed value that this key cannot open (another key sealed it, or it was altered)."""


class SealingKeyError(ValueError):
    """DEVCLOUD_SEALING_KEY is not a list of Fernet keys."""


def derived_key(secret_key: str) -> bytes:
    """The Fernet key derived from `secret_key`, the one used while DEVCLOUD_SEALING_KEY is empty."""
    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"devcloud sealed fields").derive(
        secret_key.encode()
    )
    return base64.urlsafe_b64encode(derived)


def configured_keys(value: str | None = None) -> list[bytes]:
    """The keys of DEVCLOUD_SEALING_KEY (or `value`), sealing key first; [] when empty.

    Raises SealingKeyError naming the entry that is not a Fernet key."""
    value = getattr(settings, "DEVCLOUD_SEALING_KEY", "") if value is None else value
    keys = [entry.strip().encode() for entry in value.split(",") if entry.strip()]
    for position, key in enumerate(keys, start=1):
        try:
            Fernet(key)
        except (ValueError, binascii.Error) as error:
            raise SealingKeyError(
                f"DEVCLOUD_SEALING_KEY entry {position} is not a Fernet key (32 url-safe base64-encoded "
                'bytes). Make one: python3 -c "from cryptography.fernet import Fernet; '
                'print(Fernet.generate_key().decode())"'
            ) from error
    return keys


def keyring(*extra_old_keys: bytes) -> MultiFernet:
    """Seals with the first configured key; opens with any configured key or `extra_old_keys`."""
    keys = configured_keys() or [derived_key(settings.SECRET_KEY)]
    return MultiFernet([Fernet(key) for key in [*keys, *extra_old_keys]])


def seal(text: str) -> str:
    """`text` sealed, as ASCII to store in a text column; "" stays ""."""
    return keyring().encrypt(text.encode()).decode() if text else ""


def unseal(token: str) -> str:
    """The text `token` sealed; "" stays "". Raises Unreadable when no configured key opens it."""
    if not token:
        return ""
    try:
        return keyring().decrypt(token.encode()).decode()
    except InvalidToken as error:
        raise Unreadable(
            "A sealed setting cannot be read with this portal's key (DEVCLOUD_SEALING_KEY or SECRET_KEY "
            "changed since it was saved; an old key belongs after the new one in DEVCLOUD_SEALING_KEY "
            "until `manage.py rotate_sealing_key` has run). Enter it again."
        ) from error


def looks_sealed(value: str) -> bool:
    """True for a Fernet token (its version byte 0x80 encodes as "gAAAAA"), False for plain text."""
    return value.startswith("gAAAAA")


class _Sealed(str):
    """The stored token of a SealedTextField, as read from the database and not yet opened."""


class _SealedAttribute(DeferredAttribute):
    # Opens the token only when the value is used, so a row whose key cannot be read still loads (a host
    # list, a health update); the code that needs the secret gets Unreadable.
    def __get__(self, instance, cls=None):
        value = super().__get__(instance, cls)
        if instance is not None and isinstance(value, _Sealed):
            return unseal(str(value))
        return value

    def __set__(self, instance, value):
        instance.__dict__[self.field.attname] = value


class SealedTextField(models.TextField):
    """A text column stored sealed: the model attribute is the plain text; the column, and what dumpdata
    writes, is the Fernet token (seal/unseal above). Lookups other than = "" cannot match: each seal of
    the same text differs."""

    descriptor_class = _SealedAttribute

    def from_db_value(self, value, expression, connection):
        return value if not value else _Sealed(value)

    def pre_save(self, model_instance, add):
        # The stored token as it was read, so saving a row whose key cannot be opened keeps it unchanged.
        return model_instance.__dict__.get(self.attname, "")

    def get_prep_value(self, value):
        value = super().get_prep_value(value)
        if not value or isinstance(value, _Sealed):
            return str(value) if value else value
        return seal(value)

    def value_from_object(self, obj):
        # A form shows "" for a value no configured key opens (ModelForm builds its initial data from it).
        try:
            return super().value_from_object(obj)
        except Unreadable:
            return ""

    def value_to_string(self, obj):
        return self.get_prep_value(obj.__dict__.get(self.attname, ""))
