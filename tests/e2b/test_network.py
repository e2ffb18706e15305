"""Egress through the unmodified e2b SDK, against the lab "internet" namespace of the test's own:
``network={allow_out, deny_out}`` with allow winning, ``allow_internet_access``, ``update_network``
on a running sandbox, and hostnames refused rather than silently allowed."""

from __future__ import annotations

import ipaddress
import os
import shlex
import time

import httpx
import pytest
from e2b import Sandbox
from e2b.exceptions import SandboxException

from corral.agent import netns
from corral.core.netpolicy import DEFAULT_SLOT_RANGE
from corral.testing import netlab
from corral.testing.portserver import start_argv
from tests.e2b.conftest import Corral

pytestmark = [
    pytest.mark.process,
    pytest.mark.skipif(os.geteuid() != 0 or bool(netns.tools_missing()), reason="slots need root, ip, nft"),
]

_GET = (
    "import sys, urllib.request\n"
    "for url in sys.argv[1:]:\n"
    "    try:\n"
    "        print(urllib.request.urlopen(url, timeout=1.5).read().decode())\n"
    "    except OSError as exc:\n"
    "        print('closed')\n"
)


def _reach(sandbox: Sandbox, lab: netlab.Lab) -> list[str]:
    urls = " ".join(lab.url(a) for a in (netlab.ALLOWED, netlab.DENIED))
    result = sandbox.commands.run(f"python3 -c {_quote(_GET)} {urls}", timeout=20)
    return result.stdout.split()


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def test_network_options_and_update_through_the_sdk(sdk_env: Corral) -> None:
    with netlab.internet() as lab:
        listed = Sandbox.create(network={"allow_out": [str(netlab.ALLOWED)], "deny_out": ["0.0.0.0/0"]})
        offline = Sandbox.create(allow_internet_access=False)
        try:
            assert _reach(listed, lab) == [str(netlab.ALLOWED), "closed"]
            assert _reach(offline, lab) == ["closed", "closed"]
            offline.update_network({"allow_out": [str(netlab.DENIED)], "deny_out": ["0.0.0.0/0"]})
            assert _reach(offline, lab) == ["closed", str(netlab.DENIED)]
            # A name: accepted, and held by the slot's resolver, the sandbox's one nameserver (not
            # asked here: its upstream is this machine's). A name opens no address by number.
            offline.update_network({"allow_out": ["allowed.lab"], "deny_out": ["0.0.0.0/0"]})
            assert _reach(offline, lab) == ["closed", "closed"]
            conf = offline.commands.run("cat /etc/resolv.conf").stdout.split()
            assert conf[0] == "nameserver" and ipaddress.IPv4Address(conf[1]) in DEFAULT_SLOT_RANGE
            with pytest.raises(SandboxException):
                Sandbox.create(network={"deny_out": ["pypi.org"]})
        finally:
            listed.kill()
            offline.kill()


def test_get_host_and_the_traffic_token_through_the_sdk(sdk_env: Corral) -> None:
    # corral serve: the sandbox's agent lives in the replica's process, reached at its slot directly.
    sandbox = Sandbox.create(network={"allow_public_traffic": False})
    try:
        started = sandbox.commands.run(shlex.join(start_argv(8080)), timeout=30)
        assert started.stdout.strip() == "listening"
        host = sandbox.get_host(8080)
        assert host == f"8080-{sandbox.sandbox_id}.localhost:{httpx.URL(sdk_env.url).port}"
        token = sandbox.traffic_access_token
        assert token
        with httpx.Client(base_url=sdk_env.url, timeout=30) as c:
            assert c.get("/hello", headers={"Host": host}).status_code == 403
            wrong = c.get("/hello", headers={"Host": host, "e2b-traffic-access-token": token[::-1]})
            assert wrong.status_code == 403
            right = c.get("/hello", headers={"Host": host, "e2b-traffic-access-token": token})
            assert right.status_code == 200 and right.text == f"hello /hello {host}"
            # An update of its egress keeps its ports private (E2B's update carries no such flag).
            sandbox.update_network({"deny_out": ["0.0.0.0/0"]})
            time.sleep(1.1)  # the replica's remembered route
            assert c.get("/hello", headers={"Host": host}).status_code == 403
    finally:
        sandbox.kill()
