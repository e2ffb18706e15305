"""What the store raises: one class per way an operation can fail, each with its stable code."""

from __future__ import annotations

from typing import TYPE_CHECKING

from corral.codes import ErrorCode

if TYPE_CHECKING:
    from corral.store.records import SandboxState


class StoreError(Exception):
    """Base of every error the store raises. ``code`` is stable: the API maps it to a response."""

    code: str = ErrorCode.STORE_ERROR


class StoreUnavailable(StoreError):
    """The state of record cannot be reached (refused, timed out, server gone). Retryable: the
    backend reconnects by itself when the server is back."""

    code = ErrorCode.STORE_UNAVAILABLE


class RecordNotFound(StoreError):
    code = ErrorCode.NOT_FOUND


class NameConflict(StoreError):
    """A name already taken in its scope (a live sandbox name in its tenant; a tenant or template)."""

    code = ErrorCode.NAME_CONFLICT


class DomainTaken(StoreError):
    """A custom domain another live sandbox holds: one name, one sandbox, fleet-wide."""

    code = ErrorCode.DOMAIN_TAKEN


class IdempotencyMismatch(StoreError):
    """The same idempotency key was sent again with a different request body."""

    code = ErrorCode.IDEMPOTENCY_KEY_REUSED


class QuotaExceeded(StoreError):
    """The tenant's own limit. ``limit`` names which: ``max_sandboxes``, ``max_memory_mb`` or
    ``max_cpus``."""

    code = ErrorCode.TENANT_OVER_QUOTA

    def __init__(self, limit: str, allowed: float, used: float, requested: float) -> None:
        self.limit = limit
        self.allowed = allowed
        self.used = used
        self.requested = requested
        super().__init__(f"{limit}: {used} used + {requested} requested > {allowed} allowed")


class StateConflict(StoreError):
    """A compare-and-set lost: the sandbox is no longer in the expected state (or version)."""

    code = ErrorCode.STATE_CONFLICT

    def __init__(self, sandbox_id: str, current: SandboxState, version: int) -> None:
        self.sandbox_id = sandbox_id
        self.current = current
        self.version = version
        super().__init__(f"sandbox {sandbox_id} is {current.value} (version {version})")


class HostHasSandboxes(StoreError):
    """A host cannot be forgotten while sandboxes are live on it."""

    code = ErrorCode.HOST_HAS_SANDBOXES


class TenantHasSandboxes(StoreError):
    """A tenant cannot be removed while any of its sandboxes is live (``LIVE_STATES``); ``live`` says
    how many are."""

    code = ErrorCode.TENANT_HAS_SANDBOXES

    def __init__(self, tenant_id: str, live: int) -> None:
        self.tenant_id = tenant_id
        self.live = live
        super().__init__(f"tenant {tenant_id} has {live} live sandboxes")


class TokenRevoked(StoreError):
    """A configured token that was revoked: it is never adopted again."""

    code = ErrorCode.TOKEN_REVOKED


class InvalidRecord(StoreError, ValueError):
    """Input the store refuses before touching anything (negative memory, unknown state, ...)."""

    code = ErrorCode.INVALID_REQUEST


# -- enums -----------------------------------------------------------------------------------------
