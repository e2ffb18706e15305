"""``limit`` and ``continue`` for lists of sandboxes and claims, as kubectl and client-go send them.

A page ends at a position in the store's listing order, (created_at, id): the next page is what comes
after it (keyset paging), so a sandbox created or deleted between two pages neither repeats nor skips
one that stayed. The token carries that position and the first page's resourceVersion, which every
later page answers with (a watch from it then replays whatever changed meanwhile). It is signed with
a key every replica shares, over the list it was issued for (the kind and the namespace scope): an
altered token, or one presented for another list or another namespace, is refused (400), never read.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from dataclasses import dataclass

import orjson

from corral.api.fleetkey import FleetKey
from corral.codes import ErrorCode
from corral.control.errors import ControlError, InvalidRequest
from corral.store import Store

MAX_TOKEN = 1024
_MAC_BYTES = 16


class BadContinue(ControlError):
    code = ErrorCode.BAD_CONTINUE


@dataclass(frozen=True, slots=True)
class Position:
    version: int  # the first page's resourceVersion
    after: tuple[float, str]  # the last row given: the next page starts after it


def limit_of(text: str | None, most: int) -> int | None:
    """``limit``: None (no limit) when absent or not positive, as the API server reads it; at most
    ``most`` (a server may answer fewer than asked, with a ``continue``)."""
    if not text:
        return None
    try:
        n = int(text)
    except ValueError:
        raise InvalidRequest("limit", "limit: an integer") from None
    return min(n, most) if n > 0 else None


class ContinueTokens:
    """Issues and reads tokens under a key every replica holds (a list's pages may be asked of
    different ones)."""

    NAME = "kube-continue"

    def __init__(self, store: Store) -> None:
        self._key = FleetKey(store, self.NAME)

    @staticmethod
    def _mac(key: bytes, scope: str, plural: str, payload: bytes) -> bytes:
        signed = b"\0".join((scope.encode(), plural.encode(), payload))
        return hmac.new(key, signed, hashlib.sha256).digest()[:_MAC_BYTES]

    async def issue(self, scope: str, plural: str, at: Position) -> str:
        """``scope``: the namespace's tenant id, or ``*`` for all namespaces."""
        payload = orjson.dumps([at.version, at.after[0], at.after[1]])
        mac = self._mac(await self._key.get(), scope, plural, payload)
        return f"{_b64(payload)}.{_b64(mac)}"

    async def read(self, token: str, scope: str, plural: str) -> Position:
        body, _, mac_text = token.partition(".")
        try:
            if len(token) > MAX_TOKEN:
                raise ValueError("too long")
            payload, mac = _unb64(body), _unb64(mac_text)
        except (ValueError, binascii.Error):
            raise BadContinue("invalid continue token: not a token this server issued") from None
        if not hmac.compare_digest(mac, self._mac(await self._key.get(), scope, plural, payload)):
            raise BadContinue("invalid continue token: not issued for this list (its kind and namespace)")
        version, at, after = orjson.loads(payload)
        return Position(int(version), (float(at), str(after)))


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    """Strict: only the one spelling :func:`_b64` gives (base64 leaves a last character's spare bits
    free, and a token that reads the same under another spelling is still an altered token)."""
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if not text or _b64(raw) != text:
        raise ValueError("not this server's spelling")
    return raw
