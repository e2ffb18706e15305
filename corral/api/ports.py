"""Sandboxes' ports through any replica: a request whose Host is ``{port}-{sandbox_id}.{domain}``
(the control plane's ``domain``), whose path is ``/v1/sandboxes/{id}/ports/{port}/...``, or whose
Host is a custom domain a sandbox has bound, reaches that port at the sandbox's slot address (HTTP
both ways as a stream, WebSocket upgrades; :mod:`corral.agent.portrelay`).

* **Who may.** A sandbox created with ``allow_public_traffic`` (the default) answers anyone; one
  created without answers only requests carrying its traffic token in ``e2b-traffic-access-token``
  (403 ``traffic_token_invalid`` otherwise, missing or wrong alike). The token is not passed on.
* **Where.** A sandbox on an agent of this process is reached at its slot directly; one on another
  host through that host's agent (its host key, the routed epoch, ``Corral-Forwarded``). A request
  that arrives already forwarded is refused (421 ``misdirected``): a routing loop cannot form.
* **Refusals.** No such running sandbox: 404 ``not_found``; one without an interface (egress
  ``none``): 409 ``network_not_attached``; nothing listening: 502 ``port_closed``; more than
  ``max_port_requests_per_sandbox`` at once through this replica: 429 ``too_many_concurrent``.
* **Spliced.** On the replica's listener, a plain HTTP/1.1 port request without credentials is
  taken before any ASGI request is built and relayed as bytes after its head
  (:mod:`corral.agent.portsplice`, routed and authorised by :meth:`Ports.splice_plan`); everything
  else (refusals among it) is answered here, the one source of them.
* **Freshness.** Where a sandbox runs, and whether it is public, is remembered for ``ROUTE_TTL_S``
  per replica (so a kept-alive stream of requests costs no store read each), as is which sandbox a
  custom domain names: a deleted sandbox, a new policy or a moved domain is seen within that time.
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic, TypeVar

from starlette.types import ASGIApp, Receive, Scope, Send

from corral.agent.client import HttpAgentClient, LocalAgentClient
from corral.agent.errors import AgentError
from corral.agent.portrelay import PortRelay, raw_path, refuse, request_headers
from corral.agent.portsplice import PortSplicer, Splice
from corral.agent.protocol import CALLER_AUTH_HEADER, EPOCH_HEADER, HOP_HEADER
from corral.api.e2b.access import AccessKey, traffic_valid
from corral.api.tokenbound import CREDENTIAL_HEADERS
from corral.codes import ErrorCode
from corral.control.network import policy_of
from corral.control.plane import ControlPlane
from corral.core.httphead import SPLICE_DROPS, RequestHead, render_request
from corral.core.inflight import BUSY_RETRY_S, InFlight
from corral.core.ingress import BadPort, PortTarget, by_host, by_path, custom_hostname, host_name
from corral.store import SandboxState, StoreUnavailable

TRAFFIC_TOKEN_HEADER = "e2b-traffic-access-token"
ROUTE_TTL_S = 1.0
_CACHE = 100_000
V = TypeVar("V")
_TOKEN = TRAFFIC_TOKEN_HEADER.encode()
_HOP = HOP_HEADER.encode()
_NEVER_RELAYED = frozenset({_TOKEN, _HOP, CALLER_AUTH_HEADER.encode(), EPOCH_HEADER.lower().encode()})


@dataclass(frozen=True, slots=True)
class Route:
    tenant_id: str
    host_id: str
    address: str
    epoch: int
    public: bool


class _Expiring(Generic[V]):
    """At most ``_CACHE`` entries, each good for ``ROUTE_TTL_S``."""

    def __init__(self) -> None:
        self._items: OrderedDict[str, tuple[float, V]] = OrderedDict()

    def get(self, key: str, now: float) -> tuple[bool, V | None]:
        found = self._items.get(key)
        if found is None or found[0] < now:
            return False, None
        return True, found[1]

    def put(self, key: str, value: V, now: float) -> None:
        self._items[key] = (now + ROUTE_TTL_S, value)
        self._items.move_to_end(key)
        while len(self._items) > _CACHE:
            self._items.popitem(last=False)

    def drop(self, key: str) -> None:
        self._items.pop(key, None)


class _Refused(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers or {}


def _headers(scope: Scope) -> dict[bytes, bytes]:
    return {k.lower(): v for k, v in scope["headers"]}


def _may_be_custom(host: str) -> bool:
    """Whether a Host could be a custom domain at all (an address or a bare name never is)."""
    if not host or "." not in host or host.endswith(".localhost"):
        return False
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return True
    return False


class Ports:
    """In front of the whole app: port requests here, everything else to ``app``."""

    def __init__(self, app: ASGIApp, plane: ControlPlane, secret: AccessKey) -> None:
        self.app = app
        self.plane = plane
        self.secret = secret
        self.relay = PortRelay()
        self.routes: _Expiring[Route] = _Expiring()
        self.domains: _Expiring[tuple[str, int] | None] = _Expiring()
        self.in_flight = InFlight("sandbox", plane.config.max_port_requests_per_sandbox)
        self.splicer = PortSplicer(self.splice_plan)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        try:
            target = await self._target(scope, headers)
        except _Refused as exc:
            await refuse(scope, send, exc.status, exc.code, exc.message, exc.headers)
            return
        if target is None:
            await self.app(scope, receive, send)
            return
        busy = self.in_flight.enter(target.sandbox_id)
        if busy is not None:
            retry = {"Retry-After": str(int(BUSY_RETRY_S))}
            await refuse(scope, send, 429, ErrorCode.TOO_MANY_CONCURRENT, busy.message, retry, busy.details())
            return
        try:
            await self._serve(target, headers, scope, receive, send)
        except _Refused as exc:
            await refuse(scope, send, exc.status, exc.code, exc.message, exc.headers)
        finally:
            self.in_flight.leave(target.sandbox_id)

    # -- which port -----------------------------------------------------------------------------------

    async def _target(self, scope: Scope, headers: dict[bytes, bytes]) -> PortTarget | None:
        return await self._target_of(raw_path(scope), headers)

    async def _target_of(self, path: str, headers: dict[bytes, bytes]) -> PortTarget | None:
        host = headers.get(b"host", b"").decode("latin-1")
        target = by_host(host, self.plane.config.domain, path)
        if target is None:
            try:
                target = by_path(path)
            except BadPort as exc:
                raise _Refused(422, ErrorCode.INVALID_REQUEST, str(exc)) from None
        if target is None:
            target = await self._custom(host_name(host), path)
        if target is not None and _HOP in headers:
            raise _Refused(421, ErrorCode.MISDIRECTED, "this request was already forwarded once")
        return target

    async def _custom(self, host: str, path: str) -> PortTarget | None:
        if not _may_be_custom(host):
            return None
        now = self.plane.clock.now()
        known, bound = self.domains.get(host, now)
        if not known:
            try:
                name = custom_hostname(host)
            except ValueError:
                return None
            try:
                record = await self.plane.store.get_domain(name)
            except StoreUnavailable:
                return None  # the API answers the request as its own, in its own terms
            bound = (record.sandbox_id, record.port) if record is not None else None
            self.domains.put(host, bound, now)
        if bound is None:
            return None
        return PortTarget(bound[0], bound[1], path or "/")

    # -- where, and whether this caller may --------------------------------------------------------

    async def route(self, sandbox_id: str) -> Route:
        now = self.plane.clock.now()
        known, cached = self.routes.get(sandbox_id, now)
        if known and cached is not None:
            return cached
        missing = _Refused(404, ErrorCode.NOT_FOUND, f"no running sandbox {sandbox_id}")
        try:
            record = await self.plane.store.get_sandbox(sandbox_id)
        except StoreUnavailable:
            raise _Refused(
                503, ErrorCode.STORE_UNAVAILABLE, "store unavailable", {"Retry-After": "1"}
            ) from None
        if record is None or record.state is not SandboxState.RUNNING or record.host_id is None:
            raise missing
        address = await self.plane.sandboxes._address(record.host_id)
        found = Route(record.tenant_id, record.host_id, address, record.epoch, policy_of(record).public)
        self.routes.put(sandbox_id, found, now)
        return found

    async def _hop(
        self, target: PortTarget, headers: dict[bytes, bytes]
    ) -> tuple[Route, str | HttpAgentClient]:
        """The sandbox's route once this caller may use it, and the next hop: the slot's address (a
        sandbox of this process's agents) or its host's agent."""
        route = await self.route(target.sandbox_id)
        if not route.public:
            presented = headers.get(_TOKEN)
            if presented is None or not traffic_valid(
                await self.secret.get(), target.sandbox_id, presented.decode("latin-1")
            ):
                raise _Refused(
                    403,
                    ErrorCode.TRAFFIC_TOKEN_INVALID,
                    f"sandbox {target.sandbox_id}'s ports need its traffic token in {TRAFFIC_TOKEN_HEADER}",
                )
        client = self.plane.agents.client(route.host_id, route.address)
        if isinstance(client, LocalAgentClient):
            try:
                return route, client.agent.port_address(target.sandbox_id, route.epoch)
            except AgentError as exc:
                self.routes.drop(target.sandbox_id)
                raise _Refused(exc.status, exc.code, exc.message) from None
        if isinstance(client, HttpAgentClient):
            return route, client
        raise _Refused(502, ErrorCode.AGENT_ERROR, f"host {route.host_id} relays no ports")

    async def _serve(
        self, target: PortTarget, headers: dict[bytes, bytes], scope: Scope, receive: Receive, send: Send
    ) -> None:
        route, hop = await self._hop(target, headers)
        relayed = request_headers(scope, _NEVER_RELAYED)
        if isinstance(hop, str):
            await self.relay(scope, receive, send, f"http://{hop}:{target.port}{target.path}", relayed)
        else:
            await self._forward(hop, route, target, relayed, scope, receive, send)

    async def splice_plan(self, head: RequestHead) -> Splice | None:
        """Where the byte relay sends a request it read (:mod:`corral.agent.portsplice`); None when
        this is not a port request, or when the ASGI path answers it: a refusal, a request with
        credentials (bounded per token in front of the app), a host's agent over HTTPS."""
        if any(k in CREDENTIAL_HEADERS for k, _ in head.headers):
            return None
        headers = dict(head.headers)
        path, _, query = head.target.partition(b"?")
        try:
            target = await self._target_of(path.decode("latin-1"), headers)
        except _Refused:
            return None
        if target is None or self.in_flight.enter(target.sandbox_id) is not None:
            return None
        sandbox_id = target.sandbox_id
        try:
            splice = await self._splice(head, target, headers, query)
        except BaseException:
            self.in_flight.leave(sandbox_id)
            raise
        if splice is None:
            self.in_flight.leave(sandbox_id)
        return splice

    async def _splice(
        self, head: RequestHead, target: PortTarget, headers: dict[bytes, bytes], query: bytes
    ) -> Splice | None:
        try:
            route, hop = await self._hop(target, headers)
        except _Refused:
            return None
        relayed = [(k, v) for k, v in head.headers if k not in SPLICE_DROPS and k not in _NEVER_RELAYED]
        suffix = (target.path + ("?" + query.decode("latin-1") if query else "")).encode("latin-1")
        if isinstance(hop, str):
            address, port, to = hop, target.port, suffix
        else:
            url = hop.http.base_url
            if url.scheme != "http" or url.host is None:
                return None
            address, port = url.host, url.port or 80
            prefix = (
                f"{url.raw_path.decode().rstrip('/')}/v1/sandboxes/{target.sandbox_id}/ports/{target.port}"
            )
            to = prefix.encode() + suffix
            relayed += await self._hop_headers(hop, route)
        sandbox_id = target.sandbox_id
        return Splice(
            address,
            port,
            render_request(head.method, to, tuple(relayed)),
            lambda: self.in_flight.leave(sandbox_id),
        )

    async def _hop_headers(self, client: HttpAgentClient, route: Route) -> list[tuple[bytes, bytes]]:
        """What a request forwarded to a host's agent carries besides the caller's: the agent's
        credentials, the routed epoch, and the mark that it was forwarded once."""
        out = [(k.lower().encode(), v.encode()) for k, v in (await client.auth_headers()).items()]
        return [*out, (EPOCH_HEADER.lower().encode(), str(route.epoch).encode()), (_HOP, b"1")]

    async def _forward(
        self,
        client: HttpAgentClient,
        route: Route,
        target: PortTarget,
        relayed: list[tuple[bytes, bytes]],
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        """To the sandbox's host's agent, which relays it to the port; its refusals come back as
        they are (404 gone from the host, 409 no interface, 502 nothing listening)."""
        out = [(k, v) for k, v in relayed if k != b"authorization"]
        caller = next((v for k, v in relayed if k == b"authorization"), None)
        if caller is not None:
            out.append((CALLER_AUTH_HEADER.encode(), caller))
        out += await self._hop_headers(client, route)
        base = str(client.http.base_url).rstrip("/")
        url = f"{base}/v1/sandboxes/{target.sandbox_id}/ports/{target.port}{target.path}"

        def unreachable(exc: BaseException) -> tuple[int, str, str]:
            self.routes.drop(target.sandbox_id)
            return (
                503,
                ErrorCode.HOST_UNREACHABLE,
                f"host {route.host_id} is unreachable ({type(exc).__name__})",
            )

        await self.relay(scope, receive, send, url, out, unreachable)
