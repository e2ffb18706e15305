"""Where a remote host's images come from: the control plane's image route, reached with the host's
own agent token (as its heartbeats are), through whichever replica answers. What it streams is
checked against the digest by the cache (:class:`~corral.images.cache.ImageCache`), never here."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx

from corral.agent.replicas import Replicas
from corral.images import BlobNotFound, check_digest

IMAGES_PATH = "/v1/agent/images/"
CHUNK = 1 << 20


class ImageFetchFailed(Exception):
    """No replica streamed the image (each refused or could not be reached)."""


class HttpImageSource(Replicas):
    """``GET {control_plane}/v1/agent/images/{digest}``. Before the first byte, a replica that does
    not answer is passed over for the next; once bytes flow, a cut stream is the transfer's failure
    (the cache fetches it again whole). 404 is :class:`BlobNotFound`: no replica has the image."""

    TIMEOUT_S = 30.0

    async def read(self, digest: str) -> AsyncIterator[bytes]:
        path = IMAGES_PATH + check_digest(digest)
        failures: list[str] = []
        started = False
        for i in self._in_turn():
            try:
                async with self._client.stream("GET", self.bases[i] + path) as resp:
                    if resp.status_code == 404:
                        raise BlobNotFound(digest)
                    if not resp.is_success:
                        failures.append(f"{self.bases[i]}: HTTP {resp.status_code}")
                        if resp.status_code in (401, 403):
                            break  # every replica would say the same
                        continue
                    self._current = i
                    async for chunk in resp.aiter_bytes(CHUNK):
                        started = True
                        yield chunk
                    return
            except httpx.TransportError as exc:
                if started:
                    raise  # part of the image came: the transfer failed, not the replica's answer
                failures.append(f"{self.bases[i]}: {exc!r}")
        raise ImageFetchFailed("; ".join(failures) or "no replica answered")
