"""The route hosts fetch images through: agent tokens only, the digest checked before it names
anything, the bytes streamed from the replica's blob store. Every stranger gets a 4xx with a stable
code, never a 500 and never a byte."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from corral.agent.images import HttpImageSource, ImageFetchFailed
from corral.api.app import create_app
from corral.images import digest_file
from corral.images.cache import ImageCache, ImageUnavailable

from .conftest import ADMIN, Cluster

PATH = "/v1/agent/images/"


async def _image(c: Cluster, tmp_path: Path, size: int = (2 << 20) + 17) -> tuple[str, bytes]:
    data = os.urandom(size)
    src = tmp_path / "image.erofs"
    src.write_bytes(data)
    digest = digest_file(src)
    assert c.plane.images.blobs is not None
    await c.plane.images.blobs.put(digest, src)
    return digest, data


async def test_a_host_fetches_an_image_whole_with_its_own_token(cluster: Cluster, tmp_path: Path) -> None:
    digest, data = await _image(cluster, tmp_path)
    creds = await cluster.plane.enrol_host(cluster.fleet.agents[0].id)
    r = await cluster.http.get(PATH + digest, headers=cluster.as_(creds.agent_token))
    assert r.status_code == 200, r.text
    assert r.headers["content-length"] == str(len(data)) and r.content == data


async def test_an_image_the_store_lacks_is_a_404_with_its_code(cluster: Cluster) -> None:
    creds = await cluster.plane.enrol_host(cluster.fleet.agents[0].id)
    r = await cluster.http.get(PATH + "sha256:" + "ab" * 32, headers=cluster.as_(creds.agent_token))
    assert r.status_code == 404 and r.json()["error"]["code"] == "image_not_found"


async def test_only_an_agent_token_fetches_images(cluster: Cluster, tmp_path: Path) -> None:
    digest, _ = await _image(cluster, tmp_path, 1000)
    _, tenant = await cluster.plane.create_tenant("team-a", 10, 1 << 20)
    for headers, status, code in [
        ({}, 401, "unauthorized"),
        ({"Authorization": "Bearer not-a-token-at-all"}, 401, "unauthorized"),
        (cluster.as_(tenant), 403, "forbidden"),
        (cluster.as_(ADMIN), 403, "forbidden"),
    ]:
        r = await cluster.http.get(PATH + digest, headers=headers)
        assert r.status_code == status and r.json()["error"]["code"] == code, (headers, r.text)
    # A host whose credentials were rotated fetches nothing with the old token.
    host = cluster.fleet.agents[1].id
    old = (await cluster.plane.enrol_host(host)).agent_token
    await cluster.plane.enrol_host(host)
    r = await cluster.http.get(PATH + digest, headers=cluster.as_(old))
    assert r.status_code == 401


@pytest.mark.parametrize(
    "tail",
    [
        "..%2F..%2Fetc%2Fpasswd",
        "sha256:..%2F..%2F..%2Fetc%2Fshadow",
        "sha256:" + "A" * 64,
        "sha256:" + "0" * 63,
        "sha256:" + "0" * 64 + "%0A",
        "sha256:" + "0" * 64 + "%00",
        "sha256:" + "0" * 4096,
        "md5:" + "0" * 32,
        "%2e%2e",
    ],
)
async def test_a_digest_that_is_not_one_is_refused_before_it_names_anything(
    cluster: Cluster, tail: str
) -> None:
    creds = await cluster.plane.enrol_host(cluster.fleet.agents[0].id)
    r = await cluster.http.get(PATH + tail, headers=cluster.as_(creds.agent_token))
    assert r.status_code in (404, 422), (tail, r.status_code, r.text)
    assert r.json()["error"]["code"] in ("invalid_request", "not_found"), r.text


async def test_a_hosts_cache_fetches_through_the_route_and_fails_over_replicas(
    cluster: Cluster, tmp_path: Path
) -> None:
    digest, data = await _image(cluster, tmp_path)
    creds = await cluster.plane.enrol_host(cluster.fleet.agents[0].id)
    transport = httpx.ASGITransport(app=create_app(cluster.plane, manage=False))
    # The first replica named is down: the transfer goes through the next one.
    down = httpx.MockTransport(_refuse)
    source = HttpImageSource(
        ["http://down.test", "http://corral.test"], creds.agent_token, transport=_Route(down, transport)
    )
    cache = ImageCache(tmp_path / "host", source, 10 << 20)
    try:
        assert (await cache.local_path(digest)).read_bytes() == data
        with pytest.raises(ImageUnavailable, match="no such image"):
            await cache.local_path("sha256:" + "cd" * 32)
        bad = HttpImageSource("http://corral.test", "wrong-token-wrong-token", transport=transport)
        with pytest.raises(ImageFetchFailed, match="401"):
            [c async for c in bad.read(digest)]
    finally:
        await source.aclose()


def _refuse(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)


class _Route(httpx.AsyncBaseTransport):
    """Requests to down.test go to ``down``, the rest to the cluster's app."""

    def __init__(self, down: httpx.AsyncBaseTransport, app: httpx.AsyncBaseTransport) -> None:
        self.down, self.app = down, app

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        target = self.down if request.url.host == "down.test" else self.app
        return await target.handle_async_request(request)
