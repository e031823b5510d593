"""Secrets at rest (webhook signing secrets): sealed with Fernet (AES-128-CBC + HMAC-SHA256, from `cryptography`)
under SCHEDULER_ENCRYPTION_KEYS, so a copy of the database or a backup holds no usable secret.

The first key seals; every key unseals, so keys rotate by putting a new one first and keeping the old one until
`manage.py reseal_secrets` has rewritten every row (docs/API.md, "Configuration"). Without the setting the key is
derived from SECRET_KEY (HKDF-SHA256): a working default for a single machine, refused by `check --deploy`.
"""

from __future__ import annotations

import base64
from functools import cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings


class SealBroken(Exception):
    """A sealed value no configured key opens (the key that sealed it was removed, or the row was altered)."""


def derived_key(secret_key: str) -> bytes:
    material = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"scheduler secrets at rest").derive(
        secret_key.encode()
    )
    return base64.urlsafe_b64encode(material)


@cache
def _keyring(keys: tuple[str, ...], secret_keys: tuple[str, ...]) -> MultiFernet:
    if keys:
        return MultiFernet([Fernet(key) for key in keys])
    # Derived from SECRET_KEY, which seals, and from SECRET_KEY_FALLBACKS, which still unseal: rotating SECRET_KEY
    # the way Django documents keeps every secret readable until `reseal_secrets` moved it to the new key.
    return MultiFernet([Fernet(derived_key(secret)) for secret in secret_keys])


def keyring() -> MultiFernet:
    return _keyring(
        tuple(settings.SCHEDULER_ENCRYPTION_KEYS), (settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", ()))
    )


def seal(plain: str) -> str:
    return keyring().encrypt(plain.encode()).decode()


def unseal(sealed: str) -> str:
    try:
        return keyring().decrypt(sealed.encode()).decode()
    except InvalidToken:
        raise SealBroken("no key in SCHEDULER_ENCRYPTION_KEYS opens this secret") from None


def reseal(sealed: str) -> str:
    """The same secret sealed under the first key (MultiFernet.rotate)."""
    try:
        return keyring().rotate(sealed.encode()).decode()
    except InvalidToken:
        raise SealBroken("no key in SCHEDULER_ENCRYPTION_KEYS opens this secret") from None
