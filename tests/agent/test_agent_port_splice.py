"""The agent's plan for port requests it splices (:class:`corral.agent.ports.PortPlan`): what it
would refuse (no host key or a wrong one, a bad epoch, a sandbox not here or without an interface,
a bad port) it never takes, and its ASGI path answers it with its code."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import httpx
from agent_doubles import TOKEN

from corral.agent import Agent
from corral.agent.http import create_app
from corral.agent.ports import PortPlan
from corral.agent.portsplice import PortSplicer
from corral.codes import ErrorCode
from corral.core.httphead import parse_request
from corral.core.types import AdmissionMode

AUTH = f"Bearer {TOKEN}"


async def test_what_the_agent_refuses_is_never_spliced(make_agent: Callable[..., Agent]) -> None:
    app = create_app(make_agent(admission=AdmissionMode.COMMITTED), TOKEN)
    splicer = app.state.port_splicer
    assert isinstance(splicer, PortSplicer)
    transport = httpx.ASGITransport(app)
    async with httpx.AsyncClient(transport=transport, base_url="http://agent") as http:
        made = await http.post(
            "/v1/sandboxes", json={"id": "a", "memory_mb": 512}, headers={"Authorization": AUTH}
        )
        assert made.status_code in (200, 201), made.text
        port = "/v1/sandboxes/a/ports/8080/x"  # a sim sandbox: no interface
        cases = [
            (port, {}, 401, ErrorCode.UNAUTHORIZED),
            (port, {"Authorization": f"Bearer {TOKEN}x"}, 401, ErrorCode.UNAUTHORIZED),
            (port, {"Authorization": TOKEN}, 401, ErrorCode.UNAUTHORIZED),
            (port, {"Authorization": AUTH, "X-Corral-Epoch": "1e3"}, 422, ErrorCode.INVALID_REQUEST),
            (port, {"Authorization": AUTH}, 409, ErrorCode.NETWORK_NOT_ATTACHED),
            ("/v1/sandboxes/gone/ports/8080/x", {"Authorization": AUTH}, 404, ErrorCode.NOT_FOUND),
            ("/v1/sandboxes/a/ports/0/x", {"Authorization": AUTH}, 422, ErrorCode.INVALID_REQUEST),
        ]
        for path, headers, status, code in cases:
            lines = b"".join(b"%s: %s\r\n" % (k.encode(), v.encode()) for k, v in headers.items())
            head = parse_request(b"GET %s HTTP/1.1\r\nHost: agent\r\n%s\r\n" % (path.encode(), lines))
            assert await splicer.plan(head) is None, (path, headers)
            r = await http.get(path, headers=headers)
            assert (r.status_code, r.json()["error"]["code"]) == (status, code), (path, headers, r.text)


class _Reachable:
    """An agent whose every sandbox is reachable (at loopback): what the plan decides is the key's."""

    def port_address(self, sandbox_id: str, epoch: int | None) -> str:
        return "127.0.0.1"


async def test_the_key_is_read_from_the_first_authorization_as_the_key_gate_reads_it() -> None:
    """Two ``Authorization`` headers, a stranger's first: the key gate refuses the request, so the
    plan must not take it on the strength of the second."""
    plan = PortPlan(cast(Agent, _Reachable()), lambda header: header == AUTH)
    port = b"GET /v1/sandboxes/a/ports/8080/x HTTP/1.1\r\nHost: agent\r\n"
    assert await plan(parse_request(port + b"Authorization: %s\r\n\r\n" % AUTH.encode())) is not None
    two = b"Authorization: Bearer stranger\r\nAuthorization: %s\r\n\r\n" % AUTH.encode()
    assert await plan(parse_request(port + two)) is None
