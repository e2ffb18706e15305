"""What the API sends back, validated. Unknown fields are ignored so a newer server does not break an
older SDK; a response missing what the contract promises is a ``bad_response`` error."""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from corral.client.errors import CorralError
from corral.codes import ErrorCode


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class SandboxRecord(_Wire):
    """One sandbox as the API describes it."""

    id: str
    name: str | None = None
    tenant: str | None = None
    template: str
    host_id: str | None = None
    state: str
    memory_mb: int | None = None
    cpus: float | None = None
    stateful: bool = False
    metadata: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime | None = None
    expires_at: datetime | None = None
    # Taken from a warm pool rather than started for this create.
    warm: bool = False
    failover: str = "orphan"
    epoch: int = 0  # how many times it was given a new host
    recreated_at: datetime | None = None


class Host(_Wire):
    """One host as the admin API describes it: its published admission verdict and its load."""

    id: str
    state: str
    heartbeat_age_s: float | None = None
    cpu_total: float = 0.0
    cpu_used: float = 0.0
    memory_mb_total: int = 0
    memory_mb_used: int = 0
    memory_mb_admittable: int = 0
    memory_admission: str | None = None
    reserved_mb: int = 0
    sandboxes: int = 0
    # Warm sandboxes per template: {"ready": n, "starting": n}.
    warm: dict[str, dict[str, int]] = Field(default_factory=dict)


class HostCredentials(_Wire):
    """A host's credentials from enrolment: the agent's token and the key the control plane presents to
    the agent. Shown once; write them where only the agent's user can read them."""

    host_id: str
    agent_token: str
    host_key: str


class TokenInfo(_Wire):
    """A stored token, without its secret."""

    id: str
    role: str
    tenant: str | None = None
    host_id: str | None = None
    source: str | None = None
    created_at: datetime | None = None


class TokenList(_Wire):
    tokens: list[TokenInfo]


class IssuedToken(_Wire):
    """A new token: ``token`` is its secret, shown once."""

    id: str
    role: str
    tenant: str | None = None
    token: str


class SandboxPage(_Wire):
    sandboxes: list[SandboxRecord]
    next_cursor: str | None = None


class HostList(_Wire):
    hosts: list[Host]


class BatchCreated(_Wire):
    sandboxes: list[SandboxRecord]


M = TypeVar("M", bound=BaseModel)


def parse(model: type[M], data: Any) -> M:
    """Validate a response body, turning a contract breach into a typed error rather than a KeyError."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "body"
        raise CorralError(
            f"unexpected {model.__name__} from server at {where}: {first.get('msg')}",
            code=ErrorCode.BAD_RESPONSE,
        ) from exc
