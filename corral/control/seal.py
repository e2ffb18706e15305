"""Sealed sandbox specs: a sandbox's environment and secrets are kept in the store only as AES-GCM
ciphertext, with the sandbox id as associated data (a sealed spec copied onto another record does not
open). Keys come from ``CORRAL_SEAL_KEY`` (comma-separated, newest first) or a key file (one key a
line, newest first); every replica of one control plane must have the same keys. The newest key seals;
every listed key opens, so a rotated-out key keeps old specs readable until they are re-sealed."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from corral.control.ports import Specs
from corral.jsontext import dumps_sorted

SEAL_KEY_ENV = "CORRAL_SEAL_KEY"
KEY_BYTES = 32
NONCE_BYTES = 12
_PREFIX = "v1"


class SealError(Exception):
    """A sealed spec that no configured key opens, or a malformed key."""


def key_id(key: bytes) -> str:
    return hashlib.sha256(b"corral-seal-key-id" + key).hexdigest()[:12]


def parse_key(text: str) -> bytes:
    try:
        key = base64.urlsafe_b64decode(text.strip().encode())
    except (ValueError, TypeError) as exc:
        raise SealError("a seal key is 32 bytes, base64-encoded") from exc
    if len(key) != KEY_BYTES:
        raise SealError("a seal key is 32 bytes, base64-encoded")
    return key


def new_key_text() -> str:
    return base64.urlsafe_b64encode(AESGCM.generate_key(bit_length=256)).decode()


@dataclass(frozen=True, slots=True)
class Spec:
    """What is sealed: everything a host needs to start the sandbox again that the record does not hold."""

    env: Mapping[str, str]
    secrets: Mapping[str, str]


class Sealer:
    def __init__(self, keys: Sequence[bytes]) -> None:
        if not keys:
            raise SealError("at least one seal key is needed")
        self._keys = {key_id(k): AESGCM(k) for k in keys}
        self.current = key_id(keys[0])

    def seal(self, sandbox_id: str, spec: Spec) -> str:
        body = dumps_sorted({"env": dict(spec.env), "secrets": dict(spec.secrets)}).encode()
        nonce = os.urandom(NONCE_BYTES)
        ct = self._keys[self.current].encrypt(nonce, body, sandbox_id.encode())
        return f"{_PREFIX}:{self.current}:{base64.b64encode(nonce + ct).decode()}"

    def sealed_under(self, sealed: str) -> str:
        """The id of the key ``sealed`` was sealed under."""
        parts = sealed.split(":")
        return parts[1] if len(parts) == 3 else ""

    def open(self, sandbox_id: str, sealed: str) -> Spec:
        try:
            prefix, kid, b64 = sealed.split(":")
            aead = self._keys[kid]
            raw = base64.b64decode(b64)
            body = json.loads(aead.decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], sandbox_id.encode()))
        except KeyError as exc:
            raise SealError("sealed under a key this control plane does not have") from exc
        except Exception as exc:
            raise SealError("a sealed spec that does not open") from exc
        if prefix != _PREFIX:
            raise SealError("an unknown sealing format")
        return Spec(env=dict(body["env"]), secrets=dict(body["secrets"]))

    def reseal(self, sandbox_id: str, sealed: str) -> str | None:
        """``sealed`` sealed under the newest key; None when it already is."""
        if self.sealed_under(sealed) == self.current:
            return None
        return self.seal(sandbox_id, self.open(sandbox_id, sealed))


def load_keys(key_file: Path | None, *, create: bool = False) -> list[bytes]:
    """The seal keys, newest first: from the environment if set, else from ``key_file`` (made, with one
    fresh key, mode 0600, when ``create`` and it does not exist)."""
    env = os.environ.get(SEAL_KEY_ENV, "").strip()
    if env:
        return [parse_key(k) for k in env.split(",") if k.strip()]
    if key_file is None:
        raise SealError(f"no seal key: set {SEAL_KEY_ENV} or give a key file")
    if create and not key_file.exists():
        key_file.parent.mkdir(parents=True, exist_ok=True)
        # Written whole under another name, then linked into place: replicas starting together see
        # either no file or a complete one, and only the first link wins.
        tmp = key_file.with_name(f".{key_file.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(new_key_text() + "\n")
        try:
            os.link(tmp, key_file)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    try:
        lines = key_file.read_text().splitlines()
    except OSError as exc:
        raise SealError(f"cannot read the seal key file {key_file}: {exc.strerror}") from exc
    keys = [parse_key(line) for line in lines if line.strip() and not line.startswith("#")]
    if not keys:
        raise SealError(f"the seal key file {key_file} holds no key")
    return keys


async def open_spec(store: Specs, sealer: Sealer | None, sandbox_id: str) -> Spec:
    """A sandbox's env and secrets, unsealed (empty when it has no sealed spec, or no key is set)."""
    sealed = await store.sealed_spec(sandbox_id)
    if sealed is None or sealer is None:
        return Spec(env={}, secrets={})
    return sealer.open(sandbox_id, sealed)
