"""The public HTTP routes: sandboxes, hosts, tenants, the agents' heartbeat, health and
metrics. Each handler only translates between HTTP and the control plane."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Path, Query, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from corral.agent.execstream import ExecResponse, unless_caller_goes
from corral.agent.protocol import AgentHeartbeat, EgressPolicyBody, HeartbeatReply
from corral.api import hot
from corral.api.auth import Admin, Agent, MetricsReader, Plane, User, owner, scope
from corral.api.jsonresponse import OrjsonResponse
from corral.api.schemas import (
    NAME_PATTERN,
    BatchBody,
    ExecBody,
    QuotaBody,
    SandboxSpecBody,
    TenantBody,
    host_out,
    sandbox_json,
    sandbox_out,
    tenant_out,
    token_info,
)
from corral.control import network
from corral.control.errors import InvalidRequest
from corral.control.explain import explained
from corral.exec_result import STREAM_MEDIA_TYPE, ExecResult
from corral.images import DIGEST_PATTERN
from corral.shapes import ID_PATTERN
from corral.shapes.hosts import Host, HostCredentials, HostList
from corral.shapes.sandboxes import BatchCreated, SandboxPage
from corral.shapes.sandboxes import SandboxRecord as SandboxOut  # the store has its own SandboxRecord
from corral.shapes.tenants import Tenant, TenantList
from corral.shapes.tokens import IssuedToken, TokenList
from corral.store import SandboxState

router = APIRouter()

IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key", max_length=256)]
HostId = Annotated[str, Path(pattern=ID_PATTERN)]


# The create, get and delete of one sandbox are answered by corral.api.hot in front of FastAPI; these
# declarations describe them in /openapi.json and serve them where that layer is not installed.


@router.post("/v1/sandboxes", status_code=201, response_model=SandboxOut)
async def create_sandbox(
    body: SandboxSpecBody, p: User, plane: Plane, response: Response, idempotency_key: IdempotencyKey = None
) -> SandboxOut:
    record, replayed = await hot.create(plane, p, body, idempotency_key)
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return sandbox_out(record)


@router.post("/v1/sandboxes/batch", status_code=201, response_model=BatchCreated)
async def create_batch(body: BatchBody, p: User, plane: Plane) -> BatchCreated:
    if body.count > plane.config.max_batch:
        raise InvalidRequest("count", f"at most {plane.config.max_batch} per batch")
    records = await plane.batches.create(owner(p, plane), body.spec.create_spec(), body.count)
    for r in records:
        await plane.sandboxes.remember(r)
    return BatchCreated(sandboxes=[sandbox_out(r) for r in records])


@router.get("/v1/sandboxes/{sandbox_id}", response_model=SandboxOut)
async def get_sandbox(sandbox_id: str, p: User, plane: Plane) -> Response:
    return JSONResponse(await hot.read_sandbox(plane, sandbox_id, scope(p)))


@router.get("/v1/sandboxes/{sandbox_id}/placement")
async def get_placement(sandbox_id: str, p: User, plane: Plane) -> Response:
    """Why this sandbox went where it went, as its create recorded it (tenants see their own)."""
    return Response(await explained(plane.store, sandbox_id, scope(p)), media_type="application/json")


@router.get("/v1/sandboxes", response_model=SandboxPage)
async def list_sandboxes(
    p: User,
    plane: Plane,
    state: SandboxState | None = None,
    host_id: Annotated[str | None, Query(max_length=256)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[str | None, Query(max_length=1024)] = None,
) -> Response:
    page = await plane.sandboxes.list(scope(p), state=state, host_id=host_id, limit=limit, cursor=cursor)
    # ``SandboxPage``'s shape, each row built as GET builds one: no model pass per row, which cost a
    # page of 1,000 more than reading it.
    return OrjsonResponse(
        {"sandboxes": [sandbox_json(r) for r in page.items], "next_cursor": page.next_cursor}
    )


@router.delete("/v1/sandboxes/{sandbox_id}", status_code=204)
async def delete_sandbox(sandbox_id: str, p: User, plane: Plane) -> Response:
    await plane.sandboxes.delete(sandbox_id, scope(p))
    return Response(status_code=204)


@router.post("/v1/sandboxes/{sandbox_id}/exec", response_model=ExecResult)
async def exec_in_sandbox(
    sandbox_id: str, body: ExecBody, p: User, plane: Plane, request: Request
) -> ExecResult:
    """Run a command; its result once it has ended. A caller that goes away first kills it."""
    return await unless_caller_goes(request, plane.sandboxes.exec(sandbox_id, scope(p), body.request()))


@router.post(
    "/v1/sandboxes/{sandbox_id}/exec/stream",
    status_code=200,
    response_class=ExecResponse,
    responses={200: {"content": {STREAM_MEDIA_TYPE: {}}}},
)
async def exec_streamed(sandbox_id: str, body: ExecBody, p: User, plane: Plane) -> ExecResponse:
    """The command's output as it is written, one JSON object a line: ``{"stdout": TEXT}``,
    ``{"stderr": TEXT}``, ``{}`` while it is silent, and last ``{"result": EXEC_RESULT}`` (or
    ``{"error": {"code", "message"}}``). A caller that goes away before the end kills the command."""
    return ExecResponse(await plane.sandboxes.exec_stream(sandbox_id, scope(p), body.request()))


@router.put("/v1/sandboxes/{sandbox_id}/network", response_model=SandboxOut)
async def set_sandbox_network(sandbox_id: str, body: EgressPolicyBody, p: User, plane: Plane) -> SandboxOut:
    """Replace a running sandbox's egress policy, atomically on its host (``allow_public_traffic``
    left out: the sandbox keeps its own)."""
    policy = network.checked(body.wire())
    keep = body.allow_public_traffic is None
    return sandbox_out(await plane.sandboxes.set_network(sandbox_id, scope(p), policy, keep_public=keep))


@router.get("/v1/hosts", response_model=HostList)
async def list_hosts(_: Admin, plane: Plane) -> HostList:
    return HostList(hosts=[host_out(h.record, h.heartbeat_age_s) for h in await plane.hosts()])


@router.post("/v1/hosts/{host_id}/drain", response_model=Host)
async def drain_host(host_id: str, _: Admin, plane: Plane, evacuate: bool = False) -> Host:
    rec = await plane.drain(host_id, True, evacuate=evacuate)
    return host_out(rec, max(0.0, plane.clock.now() - rec.heartbeat_at))


@router.post("/v1/hosts/{host_id}/undrain", response_model=Host)
async def undrain_host(host_id: str, _: Admin, plane: Plane) -> Host:
    rec = await plane.drain(host_id, False)
    return host_out(rec, max(0.0, plane.clock.now() - rec.heartbeat_at))


@router.post("/v1/hosts/{host_id}/token", status_code=201, response_model=HostCredentials)
async def enrol_host(host_id: HostId, _: Admin, plane: Plane) -> HostCredentials:
    """Enrol a host (or rotate its credentials): its previous token and key stop working."""
    return await plane.enrol_host(host_id)


@router.delete("/v1/hosts/{host_id}", status_code=204)
async def forget_host(host_id: HostId, _: Admin, plane: Plane) -> Response:
    await plane.forget_host(host_id)
    return Response(status_code=204)


@router.get("/v1/tokens", response_model=TokenList)
async def list_tokens(_: Admin, plane: Plane) -> TokenList:
    return TokenList(tokens=[token_info(t) for t in await plane.tokens()])


@router.post("/v1/tokens/admin", status_code=201, response_model=IssuedToken)
async def issue_admin_token(_: Admin, plane: Plane) -> IssuedToken:
    """A further admin token: hand it to replicas (CORRAL_TOKEN), then revoke the old one."""
    token = await plane.issue_admin_token()
    return await _issued(plane, token)


@router.post("/v1/tenants/{name}/tokens", status_code=201, response_model=IssuedToken)
async def issue_tenant_token(
    name: Annotated[str, Path(pattern=NAME_PATTERN)], _: Admin, plane: Plane
) -> IssuedToken:
    """A further token for the tenant: rotate by issuing one, then revoking the old one."""
    _tenant, token = await plane.issue_tenant_token(name)
    return await _issued(plane, token)


@router.post("/v1/tokens/metrics", status_code=201, response_model=IssuedToken)
async def issue_metrics_token(_: Admin, plane: Plane) -> IssuedToken:
    """A token that reads /metrics and nothing else: a scraper's (Prometheus' ``bearer_token``)."""
    token = await plane.issue_metrics_token()
    return await _issued(plane, token)


async def _issued(plane: Plane, token: str) -> IssuedToken:
    p = await plane.authenticate(token)
    return IssuedToken(id=p.token_id, role=p.role.value, tenant=p.tenant_id, token=token)


@router.delete("/v1/tokens/{token_id}", status_code=204)
async def revoke_token(
    token_id: Annotated[str, Path(max_length=64)], caller: Admin, plane: Plane
) -> Response:
    await plane.revoke_token(token_id, caller)
    return Response(status_code=204)


@router.post("/v1/tenants", status_code=201, response_model=Tenant)
async def create_tenant(body: TenantBody, _: Admin, plane: Plane) -> Tenant:
    tenant, token = await plane.create_tenant(
        body.name, body.max_sandboxes, body.max_memory_mb, body.max_cpus
    )
    return tenant_out(tenant, token)


@router.patch("/v1/tenants/{name}", response_model=Tenant)
async def set_quota(
    name: Annotated[str, Path(pattern=NAME_PATTERN)], body: QuotaBody, _: Admin, plane: Plane
) -> Tenant:
    """Change a tenant's limits; a field left out stays as it is (a create rate given as null goes
    back to the configured default)."""
    tenant = await plane.set_quota(
        name, max_sandboxes=body.max_sandboxes, max_memory_mb=body.max_memory_mb, max_cpus=body.max_cpus
    )
    rates = body.rate_changes()
    if rates:
        tenant = await plane.set_create_rate(name, **rates)
    return tenant_out(tenant)


@router.delete("/v1/tenants/{name}", status_code=204)
async def delete_tenant(name: Annotated[str, Path(pattern=NAME_PATTERN)], _: Admin, plane: Plane) -> Response:
    """Remove a tenant and revoke its tokens; 409 ``tenant_has_sandboxes`` while any of its sandboxes
    is live (delete them first: nothing here stops a sandbox)."""
    await plane.delete_tenant(name)
    return Response(status_code=204)


@router.get("/v1/tenants", response_model=TenantList)
async def list_tenants(_: Admin, plane: Plane) -> TenantList:
    return TenantList(tenants=[tenant_out(t) for t in await plane.store.list_tenants()])


@router.post("/v1/agent/heartbeat")
async def heartbeat(hb: AgentHeartbeat, sender: Agent, plane: Plane) -> HeartbeatReply:
    return await plane.heartbeat_reply(hb, sender)


@router.get("/v1/agent/images/{digest}", response_class=StreamingResponse)
async def fetch_image(
    digest: Annotated[str, Path(pattern=DIGEST_PATTERN, max_length=71)], _: Agent, plane: Plane
) -> StreamingResponse:
    """An image's bytes, for a host about to start a sandbox of it (agent tokens only), streamed from
    the blob store every replica shares. The host checks them against the digest before it keeps them."""
    image = await plane.images.open(digest)
    return StreamingResponse(
        image.chunks, media_type="application/octet-stream", headers={"Content-Length": str(image.size)}
    )


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(plane: Plane) -> JSONResponse:
    await plane.ready()
    return JSONResponse({"status": "ready"})


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(_: MetricsReader, plane: Plane) -> PlainTextResponse:
    return PlainTextResponse(generate_latest(plane.metrics.registry), media_type=CONTENT_TYPE_LATEST)
