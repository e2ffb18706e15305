"""What the API sends back, validated. The shapes are the server's own (:mod:`corral.shapes`): unknown
fields are ignored so a newer server does not break an older SDK; a response missing what the contract
promises is a ``bad_response`` error."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from corral.client.errors import CorralError
from corral.codes import ErrorCode
from corral.shapes.commands import CommandInfo, CommandList, CommandOutput
from corral.shapes.hosts import Host, HostCredentials, HostList
from corral.shapes.sandboxes import BatchCreated, SandboxPage, SandboxRecord
from corral.shapes.tenants import E2bKey, Tenant, TenantList
from corral.shapes.tokens import IssuedToken, TokenInfo, TokenList

__all__ = [
    "BatchCreated",
    "CommandInfo",
    "CommandList",
    "CommandOutput",
    "E2bKey",
    "Host",
    "HostCredentials",
    "HostList",
    "IssuedToken",
    "SandboxPage",
    "SandboxRecord",
    "Tenant",
    "TenantList",
    "TokenInfo",
    "TokenList",
    "parse",
]


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
