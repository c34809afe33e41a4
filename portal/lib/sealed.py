"""Secrets kept in the database sealed (encrypted and authenticated), so a database dump does not carry
them in the clear: Fernet (AES-128-CBC with HMAC-SHA256, from `cryptography`) with a key from the
settings.

The key is DEVCLOUD_SEALING_KEY when set (a Fernet key: `python -c "from cryptography.fernet import
Fernet; print(Fernet.generate_key().decode())"`), otherwise one derived from SECRET_KEY, so rotating
SECRET_KEY without setting DEVCLOUD_SEALING_KEY makes sealed values unreadable (unseal says so).
"""

import base64

from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings


class Unreadable(ValueError):
    """A sealed value that this key cannot open (another key sealed it, or it was altered)."""


def _fernet() -> Fernet:
    configured = getattr(settings, "DEVCLOUD_SEALING_KEY", "")
    if configured:
        return Fernet(configured.encode())
    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"devcloud sealed fields").derive(
        settings.SECRET_KEY.encode()
    )
    return Fernet(base64.urlsafe_b64encode(derived))


def seal(text: str) -> str:
    """`text` sealed, as ASCII to store in a text column; "" stays ""."""
    return _fernet().encrypt(text.encode()).decode() if text else ""


def unseal(token: str) -> str:
    """The text `token` sealed; "" stays "". Raises Unreadable when this key cannot open it."""
    if not token:
        return ""
    try:
        return _fernet().decrypt(token.encode()).decode()
    except InvalidToken as error:
        raise Unreadable(
            "A sealed setting cannot be read with this portal's key (DEVCLOUD_SEALING_KEY or SECRET_KEY "
            "changed since it was saved). Enter it again."
        ) from error
