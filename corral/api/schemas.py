"""The public API's bodies (pydantic v2). Bad input is refused here with the field named, before any
state is touched. What the SDK reads back is declared once, in :mod:`corral.shapes`; here it is built
from the records."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from corral.agent.inputs import AbsPath, Env, check_argv
from corral.agent.protocol import EgressPolicyBody, ExecRequest
from corral.control.create import CreateSpec
from corral.core.netpolicy import NO_NETWORK
from corral.core.types import (
    DEFAULT_SANDBOX_PIDS,
    DEFAULT_TEMPLATE,
    MAX_SANDBOX_DISK_MB,
    MAX_SANDBOX_PIDS,
    MIN_SANDBOX_DISK_MB,
    MIN_SANDBOX_PIDS,
)
from corral.exec_result import DEFAULT_EXEC_TIMEOUT_S, MAX_EXEC_TIMEOUT_S
from corral.shapes import Wire
from corral.shapes.hosts import JOINING, Host
from corral.shapes.sandboxes import SandboxRecord as SandboxOut  # the store has its own SandboxRecord
from corral.shapes.templates import Template
from corral.shapes.tenants import Tenant
from corral.shapes.tokens import TokenInfo
from corral.store import (
    DEFAULT_MAX_CPUS,
    HostRecord,
    SandboxRecord,
    TemplateRecord,
    TenantRecord,
    TokenRecord,
)

NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
TEMPLATE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
MAX_MEMORY_MB = 1024 * 1024  # 1 TiB
MAX_CPUS = 1024.0
MAX_TTL_S = 30 * 24 * 3600.0


def iso(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


Failover = Literal["recreate", "orphan"]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SandboxSpecBody(_Body):
    template: str = Field(default=DEFAULT_TEMPLATE, pattern=TEMPLATE_PATTERN)
    memory_mb: int | None = Field(default=None, gt=0, le=MAX_MEMORY_MB, strict=True)
    cpus: float | None = Field(default=None, gt=0, le=MAX_CPUS)
    stateful: bool | None = Field(default=None, strict=True)
    ttl_seconds: float | None = Field(default=None, gt=0, le=MAX_TTL_S)
    name: str | None = Field(default=None, pattern=NAME_PATTERN)
    metadata: dict[str, str] = Field(default_factory=dict, max_length=64)
    env: Env = Field(default_factory=dict)
    # Delivered like env; kept only sealed; never in any answer.
    secrets: Env = Field(default_factory=dict, repr=False)
    failover: Failover | None = None  # None: the template's (orphan unless it says otherwise)
    # Wait up to this long for capacity (parked in waiting_capacity) instead of a 503 now.
    wait_s: float | None = Field(default=None, gt=0, le=3600)
    # Its own disk (the writable layer over its template's image), MiB; None: the template's.
    disk_mb: int | None = Field(default=None, ge=MIN_SANDBOX_DISK_MB, le=MAX_SANDBOX_DISK_MB, strict=True)
    # Its egress policy; None: mode "none" (no interface but loopback, the default: see
    # corral.core.netpolicy for why).
    network: EgressPolicyBody | None = None

    @field_validator("metadata")
    @classmethod
    def _metadata_sizes(cls, v: dict[str, str]) -> dict[str, str]:
        for k, val in v.items():
            if not 0 < len(k) <= 128 or len(val) > 1024:
                raise ValueError("metadata keys are 1-128 characters, values at most 1024")
            if "\x00" in k or "\x00" in val:
                raise ValueError(f"metadata {k[:64]!r} contains a NUL byte")
        return v

    def create_spec(self) -> CreateSpec:
        """The create this body asks for, as the control plane runs it."""
        fields = self.model_dump(exclude={"network"})
        return CreateSpec(**fields, network=self.network.wire() if self.network is not None else None)


class BatchBody(_Body):
    count: int = Field(gt=0, le=500, strict=True)
    spec: SandboxSpecBody = Field(default_factory=SandboxSpecBody)


class ExecBody(_Body):
    # A list is the argv; a string is a shell command line.
    command: list[str] | str = Field(min_length=1)
    timeout_s: float = Field(default=DEFAULT_EXEC_TIMEOUT_S, gt=0, le=MAX_EXEC_TIMEOUT_S)
    env: Env = Field(default_factory=dict)
    cwd: AbsPath | None = None

    @field_validator("command")
    @classmethod
    def _command(cls, v: list[str] | str) -> list[str] | str:
        check_argv([v] if isinstance(v, str) else v)
        return v

    def argv(self) -> list[str]:
        return ["/bin/sh", "-c", self.command] if isinstance(self.command, str) else list(self.command)

    def request(self) -> ExecRequest:
        return ExecRequest(command=self.argv(), timeout_s=self.timeout_s, env=self.env, cwd=self.cwd)


class TemplateBody(_Body):
    name: str = Field(pattern=TEMPLATE_PATTERN)
    cpus: float = Field(default=1.0, gt=0, le=MAX_CPUS)
    memory_mb: int = Field(default=512, gt=0, le=MAX_MEMORY_MB, strict=True)
    stateful: bool = Field(default=False, strict=True)
    description: str = Field(default="", max_length=1024)
    pids: int = Field(default=DEFAULT_SANDBOX_PIDS, ge=MIN_SANDBOX_PIDS, le=MAX_SANDBOX_PIDS, strict=True)
    failover: Failover = "orphan"
    disk_mb: int | None = Field(default=None, ge=MIN_SANDBOX_DISK_MB, le=MAX_SANDBOX_DISK_MB, strict=True)

    def record(self) -> TemplateRecord:
        return TemplateRecord(**self.model_dump())


# The most CPUs a tenant's quota may name: far beyond any fleet, yet exact in the store's millicores.
MAX_TENANT_CPUS = 1e9
TenantCpus = Annotated[float, Field(gt=0, le=MAX_TENANT_CPUS, allow_inf_nan=False, strict=True)]


class TenantBody(_Body):
    name: str = Field(pattern=NAME_PATTERN)
    max_sandboxes: int = Field(default=1000, ge=0, le=10_000_000, strict=True)
    max_memory_mb: int = Field(default=1024 * 1024, ge=0, le=1 << 40, strict=True)
    # CPUs its live sandboxes may ask for in all (CPU is overcommitted on hosts, so this is the bound).
    max_cpus: TenantCpus = DEFAULT_MAX_CPUS


# The fastest create rate a tenant may be given (creates a second, summed over the replicas), and the
# largest burst: far beyond what a fleet can place, so the bounds only keep out nonsense.
MAX_CREATE_RATE_PER_S = 1e6
MAX_CREATE_BURST = 1_000_000


class QuotaBody(_Body):
    """A tenant's limits changed; a field left out stays as it is. ``create_rate_per_s`` and
    ``create_burst`` given as null go back to the control plane's configured default."""

    max_sandboxes: int | None = Field(default=None, ge=0, le=10_000_000, strict=True)
    max_memory_mb: int | None = Field(default=None, ge=0, le=1 << 40, strict=True)
    max_cpus: TenantCpus | None = None
    create_rate_per_s: float | None = Field(
        default=None, gt=0, le=MAX_CREATE_RATE_PER_S, allow_inf_nan=False, strict=True
    )
    create_burst: int | None = Field(default=None, ge=1, le=MAX_CREATE_BURST, strict=True)

    def rate_changes(self) -> dict[str, float | int | None]:
        """The create-rate fields the body names (null included), as ``set_create_rate`` takes them."""
        named = {"create_rate_per_s": "rate_per_s", "create_burst": "burst"}
        return {arg: getattr(self, f) for f, arg in named.items() if f in self.model_fields_set}


def sandbox_out(r: SandboxRecord) -> SandboxOut:
    return SandboxOut.model_validate(sandbox_json(r))


def sandbox_json(r: SandboxRecord) -> dict[str, object]:
    """A sandbox as the API shows it (``SandboxOut``'s fields), built without a validation pass: the
    hot routes answer with this directly."""
    return {
        "id": r.id,
        "name": r.name,
        "tenant": r.tenant_id,
        "template": r.template,
        "host_id": r.host_id,
        "state": r.state.value,
        "memory_mb": r.memory_mb,
        "cpus": r.cpus,
        "stateful": r.stateful,
        "metadata": dict(r.metadata),
        "created_at": iso(r.created_at),
        "expires_at": iso(r.expires_at),
        "oom_kills": r.oom_kills,
        "warm": r.warm,
        "failover": r.failover,
        "epoch": r.epoch,
        "recreated_at": iso(r.recreated_at),
        "image": r.image,
        "disk_mb": r.disk_mb,
        "disk_used_mb": None,  # a live reading of its host's (GET of one sandbox fills it in)
        "network": json.loads(r.network) if r.network is not None else NO_NETWORK.to_dict(),
    }


def host_out(r: HostRecord, age: float) -> Host:
    return Host(
        id=r.id,
        state=r.state.value if r.heard_from else JOINING,
        heartbeat_age_s=round(age, 3) if r.heard_from else None,
        cpu_total=r.cpu_total,
        cpu_used=r.cpu_used,
        memory_mb_total=r.memory_mb_total,
        memory_mb_used=r.memory_mb_used,
        memory_mb_admittable=r.memory_mb_admittable,
        memory_admission=r.memory_admission.value,
        reserved_mb=r.reserved_mb,
        sandboxes=r.sandbox_count,
        runtime=r.runtime,
        address=r.address,
        warm={t: {"ready": n[0], "starting": n[1]} for t, n in sorted(r.warm.items())},
    )


def token_info(t: TokenRecord) -> TokenInfo:
    return TokenInfo(
        id=t.id,
        role=t.role.value,
        tenant=t.tenant_id,
        host_id=t.host_id,
        source=t.source,
        created_at=datetime.fromtimestamp(t.created_at, UTC),
    )


def template_out(t: TemplateRecord, size_bytes: int | None = None) -> Template:
    return _shown(Template, t, size_bytes=size_bytes)


def tenant_out(t: TenantRecord, token: str | None = None) -> Tenant:
    return _shown(Tenant, t, token=token)


W = TypeVar("W", bound=Wire)


def _shown(shape: type[W], record: object, **extra: object) -> W:
    """The API's ``shape`` of a record: its same-named fields, and ``extra`` (what the record lacks)."""
    return shape.model_validate(record, from_attributes=True).model_copy(update=extra)
