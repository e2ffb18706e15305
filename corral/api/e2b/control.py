"""E2B's control-plane routes, each one a translation onto corral's own operations (the same create,
list, get, delete and TTL as ``/v1``), authenticated by ``X-API-KEY: <a corral tenant token>``.

State rule: a sandbox its host reports frozen is ``paused``; every other live state (reserved,
starting, running, waiting for capacity, recreating, orphaned) is ``running``, the only other state
E2B knows; a stopped, failed or deleted sandbox does not exist (404).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import urllib.parse
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from corral.agent.client import AgentClient
from corral.agent.envd import ENVD_VERSION
from corral.agent.errors import AgentError, AgentSandboxNotFound
from corral.api.auth import as_user, owner, scope
from corral.api.e2b import names
from corral.api.e2b.access import access_token, traffic_token
from corral.api.e2b.network import policy_body
from corral.api.schemas import MAX_TTL_S, SandboxSpecBody
from corral.codes import ErrorCode
from corral.control import lifecycle
from corral.control.errors import Conflict, InvalidRequest, ResourceNotFound, UnsupportedOption
from corral.control.network import checked, policy_of
from corral.control.plane import ControlPlane
from corral.core.lifecycle import ON_TIMEOUT_KILL, ON_TIMEOUT_PAUSE, Lifecycle
from corral.core.types import DEFAULT_TEMPLATE
from corral.store import Principal, SandboxRecord, SandboxState
from corral.store.rows import encode_cursor

router = APIRouter()

DEFAULT_TIMEOUT_S = 300  # the SDK's own default
BASE_TEMPLATE = "base"  # what the SDK sends when no template is named
LIVE = {
    SandboxState.RESERVED,
    SandboxState.STARTING,
    SandboxState.RUNNING,
    SandboxState.WAITING_CAPACITY,
    SandboxState.ORPHANED,
}
MAX_LIST_SCAN = 10_000  # records a filtered list page may read before it answers
# A sandbox's timeout, in whole seconds as E2B gives it: corral's own bound on a sandbox's TTL (an
# expiry beyond any date would break every later read of the record).
MAX_TIMEOUT_S = int(MAX_TTL_S)


class AutoResume(BaseModel):
    enabled: bool = False


class NewSandbox(BaseModel):
    """E2B's create body. Every option the SDK sends is read: honoured, or refused when set to what
    corral does not do (never dropped in silence). ``network`` and ``allow_internet_access`` are
    the network's to honour."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")
    template_id: str = Field(default=BASE_TEMPLATE, alias="templateID", max_length=128)
    timeout: int | None = Field(default=None, ge=1, le=MAX_TIMEOUT_S)
    metadata: dict[str, str] | None = None
    env_vars: dict[str, str] | None = Field(default=None, alias="envVars")
    network: dict[str, Any] | None = None
    auto_pause: bool = Field(default=False, alias="autoPause")
    auto_pause_memory: bool | None = Field(default=None, alias="autoPauseMemory")
    auto_resume: AutoResume | None = Field(default=None, alias="autoResume")
    mcp: dict[str, Any] | None = None
    volume_mounts: list[Any] | None = Field(default=None, alias="volumeMounts")
    iam: dict[str, Any] | None = None
    secure: bool = True

    def lifecycle(self) -> Lifecycle:
        """E2B's lifecycle: killed at its timeout unless ``autoPause``; paused with its memory unless
        ``autoPauseMemory`` is false (its files alone, the next start a reboot); woken by its next
        data-plane call only with ``autoResume.enabled`` (off unless asked)."""
        auto_resume = self.auto_resume is not None and self.auto_resume.enabled
        memory = self.auto_pause_memory is not False
        if auto_resume and not self.auto_pause:
            raise InvalidRequest("autoResume", "auto-resume needs autoPause (lifecycle on_timeout pause)")
        if auto_resume and not memory:
            raise InvalidRequest(
                "autoResume", "a sandbox paused without its memory is resumed by connect, never by traffic"
            )
        return Lifecycle(
            on_timeout=ON_TIMEOUT_PAUSE if self.auto_pause else ON_TIMEOUT_KILL,
            keep_memory=memory or not self.auto_pause,
            auto_resume=auto_resume,
            timeout_s=self.timeout or DEFAULT_TIMEOUT_S,
        )

    def refuse_unsupported(self) -> None:
        """What corral does not do yet, refused before anything is made (no sandbox is left)."""
        if self.mcp:
            raise UnsupportedOption("mcp", "an MCP gateway inside the sandbox is not supported")
        if self.volume_mounts:
            raise UnsupportedOption("volumeMounts", "volumes are not supported")
        if self.iam:
            raise UnsupportedOption("iam", "workload identity tokens are not supported")
        if not self.secure:
            raise UnsupportedOption("secure", "every corral sandbox's data plane requires its access token")


class Timeout(BaseModel):
    timeout: int = Field(ge=0, le=MAX_TIMEOUT_S)


async def caller(request: Request) -> tuple[ControlPlane, Principal]:
    plane: ControlPlane = request.app.state.plane
    return plane, as_user(await plane.authenticate(request.headers.get("x-api-key")))


async def _template(plane: ControlPlane, p: Principal, name: str) -> str:
    """The corral template a create names: the caller's own E2B-built one first (names.py)."""
    if names.foreign(p.tenant_id, name):
        raise InvalidRequest("templateID", f"unknown template {name!r}")
    if p.tenant_id is not None and await plane.templates.get(names.owned(p.tenant_id, name)) is not None:
        return names.owned(p.tenant_id, name)
    if name == BASE_TEMPLATE and await plane.store.get_template(name) is None:
        return DEFAULT_TEMPLATE
    return name


def _iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).isoformat().replace("+00:00", "Z")


def created(
    record: SandboxRecord, secret: bytes, domain: str | None, template: str | None = None
) -> dict[str, Any]:
    """``domain``: the control plane's, where ``{port}-{sandboxID}.{domain}`` reaches a port (the
    SDK's ``get_host``); ``trafficAccessToken``: what those requests must carry, for a sandbox
    created with ``allowPublicTraffic: false`` (null for a public one, as E2B answers)."""
    public = policy_of(record).public
    return {
        "templateID": template or record.template,
        "sandboxID": record.id,
        "clientID": record.host_id or "corral",
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": access_token(secret, record.id),
        "trafficAccessToken": None if public else traffic_token(secret, record.id),
        "domain": domain,
    }


def detail(record: SandboxRecord, paused: bool, secret: bytes, domain: str | None) -> dict[str, Any]:
    life = Lifecycle.parse(record.lifecycle)
    end = record.expires_at if record.expires_at is not None else record.created_at + 10 * 365 * 86400
    return {
        **created(record, secret, domain),
        "startedAt": _iso(record.created_at),
        "endAt": _iso(end),
        "cpuCount": max(1, round(record.cpus)),
        "memoryMB": record.memory_mb,
        "diskSizeMB": 0,
        "state": "paused" if paused else "running",
        "metadata": dict(record.metadata),
        "lifecycle": {"autoResume": life.auto_resume, "onTimeout": life.on_timeout},
        "volumeMounts": [],
    }


async def agent_of(plane: ControlPlane, host_id: str) -> AgentClient:
    return plane.agents.client(host_id, await plane.sandboxes._address(host_id))


async def _get(plane: ControlPlane, p: Principal, sandbox_id: str) -> SandboxRecord:
    record = await plane.sandboxes.get(sandbox_id, scope(p))
    if record.state not in LIVE:
        raise ResourceNotFound(f"sandbox {sandbox_id} was not found")
    return record


async def _paused(plane: ControlPlane, record: SandboxRecord) -> bool:
    if record.paused is not None:
        return True
    if record.state is not SandboxState.RUNNING or record.host_id is None:
        return False
    try:
        client = await agent_of(plane, record.host_id)
        return any(i.id == record.id and i.paused for i in await client.list())
    except AgentError:
        return False


async def _paused_on_hosts(plane: ControlPlane, records: list[SandboxRecord]) -> set[str]:
    """Which of ``records`` their hosts report paused: one call per host, not per sandbox."""
    paused = {r.id for r in records if r.paused is not None}
    for host_id in {r.host_id for r in records if r.host_id and r.state is SandboxState.RUNNING}:
        assert host_id is not None
        with contextlib.suppress(AgentError):
            client = await agent_of(plane, host_id)
            paused |= {i.id for i in await client.list() if i.paused}
    return paused


async def create(request: Request, body: dict[str, Any], idempotency_key: str | None) -> JSONResponse:
    plane, p = await caller(request)
    try:
        new = NewSandbox.model_validate(body)
        new.refuse_unsupported()
        spec = SandboxSpecBody(
            template=await _template(plane, p, new.template_id),
            ttl_seconds=new.timeout or DEFAULT_TIMEOUT_S,
            metadata=new.metadata or {},
            env=new.env_vars or {},
        )
        egress = policy_body(body, new.network)
        life = new.lifecycle().text()
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InvalidRequest(".".join(map(str, first["loc"])) or "body", first["msg"]) from None
    create_spec = dataclasses.replace(spec.create_spec(), network=egress, lifecycle=life)
    record, _replayed = await plane.creates.create(
        owner(p, plane), create_spec, idempotency_key=idempotency_key
    )
    await plane.sandboxes.remember(record)
    return JSONResponse(
        created(record, await request.app.state.e2b_access.get(), plane.config.domain, new.template_id),
        status_code=201,
    )


IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key", max_length=256)]
JsonBody = Annotated[dict[str, Any], Body()]


@router.post("/sandboxes", status_code=201)
async def create_v1(request: Request, body: JsonBody) -> JSONResponse:
    return await create(request, body, None)


@router.post("/v2/sandboxes", status_code=201)
async def create_v2(request: Request, body: JsonBody, idempotency_key: IdempotencyKey = None) -> JSONResponse:
    return await create(request, body, idempotency_key)


@router.get("/sandboxes/{sandbox_id}")
async def get_sandbox(sandbox_id: str, request: Request) -> JSONResponse:
    plane, p = await caller(request)
    record = await _get(plane, p, sandbox_id)
    return JSONResponse(
        detail(
            record,
            await _paused(plane, record),
            await request.app.state.e2b_access.get(),
            plane.config.domain,
        )
    )


@router.delete("/sandboxes/{sandbox_id}", status_code=204)
async def kill(sandbox_id: str, request: Request) -> Response:
    plane, p = await caller(request)
    await _get(plane, p, sandbox_id)
    await plane.sandboxes.delete(sandbox_id, scope(p))
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/timeout", status_code=204)
async def set_timeout(sandbox_id: str, request: Request, body: Timeout) -> Response:
    plane, p = await caller(request)
    await _get(plane, p, sandbox_id)
    await plane.store.set_sandbox_expiry(sandbox_id, plane.clock.now() + body.timeout)
    return Response(status_code=204)


@contextlib.asynccontextmanager
async def _on_host(plane: ControlPlane, record: SandboxRecord) -> AsyncIterator[AgentClient]:
    """The agent of the host running ``record``, its refusals as E2B's API answers them."""
    if record.state is not SandboxState.RUNNING or record.host_id is None:
        raise Conflict(f"sandbox {record.id} is {record.state.value}", code=ErrorCode.SANDBOX_NOT_RUNNING)
    client = await agent_of(plane, record.host_id)
    try:
        yield client
    except AgentSandboxNotFound:
        raise ResourceNotFound(f"sandbox {record.id} was not found") from None
    except AgentError as exc:
        if exc.status == 409:
            raise Conflict(exc.message, code=exc.code) from None
        raise


@router.put("/sandboxes/{sandbox_id}/network", status_code=204)
async def update_network(sandbox_id: str, request: Request, body: JsonBody) -> Response:
    plane, p = await caller(request)
    await _get(plane, p, sandbox_id)
    wire = policy_body(body, body) or {"mode": "internet"}
    await plane.sandboxes.set_network(sandbox_id, scope(p), checked(wire))
    return Response(status_code=204)


def _memory(body: Any) -> bool:
    memory = body.get("memory", True) if isinstance(body, dict) else True
    if memory is None:
        return True
    if not isinstance(memory, bool):
        raise InvalidRequest("memory", "memory is true or false")
    return memory


@router.post("/sandboxes/{sandbox_id}/pause", status_code=204)
async def pause(sandbox_id: str, request: Request) -> Response:
    """Frozen with its memory, or (``memory: false``) its processes ended and its files kept. A
    paused sandbox waits to be resumed rather than to expire; connect sets its timeout again."""
    plane, p = await caller(request)
    record = await _get(plane, p, sandbox_id)
    raw = await request.body()
    try:
        body = json.loads(raw) if raw.strip() else {}
    except ValueError:
        raise InvalidRequest("body", "the body is JSON") from None
    memory = _memory(body)
    if record.paused is not None or await _paused(plane, record):
        raise Conflict(f"sandbox {sandbox_id} is already paused", code=ErrorCode.SANDBOX_PAUSED)
    async with _on_host(plane, record) as client:
        await lifecycle.pause(plane.store, client, record, memory=memory)
    return Response(status_code=204)


async def connect(sandbox_id: str, request: Request, body: dict[str, Any]) -> JSONResponse:
    """Resume a paused sandbox (201) or answer a running one (200). A resumed sandbox's timeout is
    the one given (the default when none is); a running one's only ever grows (E2B: "the timeout will
    update only if the new timeout is longer than the existing one")."""
    plane, p = await caller(request)
    record = await _get(plane, p, sandbox_id)
    timeout = body.get("timeout") if isinstance(body, dict) else None
    if timeout is not None and (
        not isinstance(timeout, int) or isinstance(timeout, bool) or not 1 <= timeout <= MAX_TIMEOUT_S
    ):
        raise InvalidRequest("timeout", f"timeout must be an integer of seconds from 1 to {MAX_TIMEOUT_S}")
    status = 200
    expiry = plane.clock.now() + (timeout or DEFAULT_TIMEOUT_S)
    if await _paused(plane, record):
        async with _on_host(plane, record) as client:
            record = await lifecycle.resume(
                plane.store, client, record, expires_at=expiry, memory=_memory(body)
            )
        status = 201
    elif record.expires_at is not None and record.expires_at < expiry:
        record = await plane.store.set_sandbox_expiry(sandbox_id, expiry)
    return JSONResponse(
        created(record, await request.app.state.e2b_access.get(), plane.config.domain), status_code=status
    )


@router.post("/sandboxes/{sandbox_id}/connect")
async def connect_v1(sandbox_id: str, request: Request, body: JsonBody) -> JSONResponse:
    return await connect(sandbox_id, request, body)


@router.post("/v2/sandboxes/{sandbox_id}/connect")
async def connect_v2(sandbox_id: str, request: Request, body: JsonBody) -> JSONResponse:
    return await connect(sandbox_id, request, body)


@router.post("/sandboxes/{sandbox_id}/resume", status_code=201)
async def resume(sandbox_id: str, request: Request, body: JsonBody) -> JSONResponse:
    return await connect(sandbox_id, request, body)


# E2B's range bounds: unix seconds (a bound past any date would not be a time).
NO_END = 2**40
UnixSeconds = Annotated[int | None, Query(ge=0, le=NO_END)]


@router.get("/sandboxes/{sandbox_id}/metrics")
async def metrics(
    sandbox_id: str, request: Request, start: UnixSeconds = None, end: UnixSeconds = None
) -> JSONResponse:
    """The sandbox's samples from ``start`` to ``end`` (whole unix seconds, both included; by default
    from its start to now), oldest first: its memory as its host read it, at most one every 5 s
    (``corral.core.samples``). CPU use and disk are not sampled (0)."""
    plane, p = await caller(request)
    if start is not None and end is not None and start > end:
        raise InvalidRequest("start", "start is after end")
    record = await _get(plane, p, sandbox_id)
    samples = []
    if record.host_id and record.state is SandboxState.RUNNING:
        with contextlib.suppress(AgentError):  # its host out of reach: no samples, as E2B has none
            client = await agent_of(plane, record.host_id)
            # Whole seconds as E2B gives them: a sample at 100.7 is in a range that ends at 100. No
            # end: all, the host's reading of the present included (its clock, not this replica's).
            last = NO_END if end is None else end + 1
            samples = (await client.samples(record.id, start or 0, last)).samples
    return JSONResponse(
        [
            {
                "timestamp": _iso(s.at),
                "timestampUnix": int(s.at),
                "cpuCount": max(1, round(record.cpus)),
                "cpuUsedPct": 0.0,
                "memUsed": s.memory_mb * 1024 * 1024,
                "memTotal": record.memory_mb * 1024 * 1024,
                "memCache": 0,
                "diskUsed": 0,
                "diskTotal": 0,
            }
            for s in samples
            if end is None or int(s.at) <= end
        ]
    )


def _metadata_filter(raw: str | None) -> dict[str, str]:
    if not raw:
        return {}
    return {k: v for k, v in urllib.parse.parse_qsl(raw, keep_blank_values=True)}


def _started_after(raw: str | None) -> datetime.datetime | None:
    if not raw:
        return None
    try:
        at = datetime.datetime.fromisoformat(raw)
    except ValueError:
        raise InvalidRequest("startedAfter", "startedAfter must be an ISO 8601 date and time") from None
    return at if at.tzinfo else at.replace(tzinfo=datetime.UTC)


def _started(record: SandboxRecord) -> datetime.datetime:
    """A record's start as ``startedAt`` gives it (to the microsecond), so a bound copied from one
    sandbox's ``startedAt`` includes that sandbox."""
    return datetime.datetime.fromtimestamp(record.created_at, datetime.UTC)


@router.get("/sandboxes")  # the older SDKs' list: the same answer
@router.get("/v2/sandboxes")
async def list_sandboxes(
    request: Request,
    metadata: Annotated[str | None, Query(max_length=8192)] = None,
    state: Annotated[str | None, Query(max_length=64)] = None,
    order: Annotated[str | None, Query(max_length=8)] = None,
    started_after: Annotated[str | None, Query(alias="startedAfter", max_length=64)] = None,
    template: Annotated[str | None, Query(max_length=128)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    next_token: Annotated[str | None, Query(alias="nextToken", max_length=1024)] = None,
) -> JSONResponse:
    """E2B's list: the most recent first unless ``order=asc`` (by start time, across the whole
    result before it is paged), filtered by metadata, states, start time and template."""
    plane, p = await caller(request)
    wanted_meta = _metadata_filter(metadata)
    states = set((state or "running,paused").split(","))
    if not states <= {"running", "paused"}:
        raise InvalidRequest("state", "state is a comma-separated list of running and paused")
    if order not in (None, "asc", "desc"):
        raise InvalidRequest("order", "order is asc or desc")
    newest_first = order != "asc"
    after = _started_after(started_after)
    templates = None if not template else {template, await _template(plane, p, template)}

    def wanted(r: SandboxRecord) -> bool:
        return (
            r.state in LIVE
            and (after is None or _started(r) >= after)
            and (templates is None or r.template in templates)
            and all(r.metadata.get(k) == v for k, v in wanted_meta.items())
        )

    found: list[tuple[SandboxRecord, bool]] = []
    cursor, scanned, more = next_token, 0, True
    while more and len(found) < limit and scanned < MAX_LIST_SCAN:
        page = await plane.sandboxes.list(
            scope(p), state=None, host_id=None, limit=200, cursor=cursor, newest_first=newest_first
        )
        scanned += len(page.items)
        candidates = [r for r in page.items if wanted(r)]
        paused = await _paused_on_hosts(plane, candidates)
        stop_at = None
        for r in candidates:
            if ("paused" if r.id in paused else "running") in states:
                found.append((r, r.id in paused))
                if len(found) == limit:
                    stop_at = r
                    break
        if stop_at is not None:
            cursor = encode_cursor(stop_at.created_at, stop_at.id)
            more = page.next_cursor is not None or page.items[-1] is not stop_at
            break
        cursor, more = page.next_cursor, page.next_cursor is not None
        if newest_first and after is not None and page.items and _started(page.items[-1]) < after:
            more = False  # everything further back started before the bound
    headers = {"x-next-token": cursor} if more and cursor else {}
    secret = await request.app.state.e2b_access.get()
    return JSONResponse(
        [detail(r, is_paused, secret, plane.config.domain) for r, is_paused in found], headers=headers
    )
