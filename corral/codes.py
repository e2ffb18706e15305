"""Every error code corral speaks, declared once with its HTTP status and whether it is retryable.

The API, the host agent, the store, the runtimes, the SDK and the simulator import these instead of
writing the strings. A code is a ``str`` (a ``StrEnum``), so it goes on the wire and into JSON as itself.

``retryable`` means the same request may succeed later unchanged: "not now", never "not this". Every
retryable answer is a 503 with Retry-After, but one: a tenant asking faster than its create rate
(429 ``tenant_rate_limited``, its Retry-After computed from the tenant's bucket). ``status`` is None for the codes the SDK makes up itself
when no usable answer came back (the request may or may not have reached the server).

Standard library only: the SDK imports this module without any server dependency.
"""

from __future__ import annotations

import math
from enum import StrEnum


class ErrorCode(StrEnum):
    status: int | None
    retryable: bool

    def __new__(cls, value: str, status: int | None, retryable: bool = False) -> ErrorCode:
        member = str.__new__(cls, value)
        member._value_ = value
        member.status = status
        member.retryable = retryable
        return member

    # -- the fleet cannot take it now (the SDK backs off and retries under one Idempotency-Key) -------
    NO_CAPACITY = "no_capacity", 503, True
    NO_HEALTHY_HOSTS = "no_healthy_hosts", 503, True
    STORE_UNAVAILABLE = "store_unavailable", 503, True
    CREATE_IN_PROGRESS = "create_in_progress", 503, True
    HOST_UNREACHABLE = "host_unreachable", 503, True

    # -- a verdict about the request --------------------------------------------------------------------
    INVALID_REQUEST = "invalid_request", 422
    UNAUTHORIZED = "unauthorized", 401
    FORBIDDEN = "forbidden", 403
    NOT_FOUND = "not_found", 404
    IMAGE_NOT_FOUND = "image_not_found", 404  # no blob of that digest in the control plane's store
    NO_PLACEMENT_RECORD = "no_placement_record", 404
    METHOD_NOT_ALLOWED = "method_not_allowed", 405
    NAME_CONFLICT = "name_conflict", 409
    HOST_HAS_SANDBOXES = "host_has_sandboxes", 409
    # A tenant is removed only once none of its sandboxes is live: its sandboxes are deleted first.
    TENANT_HAS_SANDBOXES = "tenant_has_sandboxes", 409
    SANDBOX_NOT_RUNNING = "sandbox_not_running", 409
    IDEMPOTENCY_KEY_REUSED = "idempotency_key_reused", 409
    STATE_CONFLICT = "state_conflict", 409
    TOKEN_REVOKED = "token_revoked", 409
    STORE_ERROR = "store_error", 409
    SANDBOX_ORPHANED = "sandbox_orphaned", 410
    PAYLOAD_TOO_LARGE = "payload_too_large", 413
    MISDIRECTED = "misdirected", 421
    TENANT_OVER_QUOTA = "tenant_over_quota", 429
    QUEUE_FULL = "queue_full", 429
    # Too much at once from one caller: a sandbox's or a tenant's data-plane calls in flight, or a
    # token's open connections. 429 with Retry-After: the same call succeeds once one of its own ends.
    TOO_MANY_CONCURRENT = "too_many_concurrent", 429
    TOO_MANY_CONNECTIONS = "too_many_connections", 429
    # The Kubernetes surface: a label or field selector it cannot read; a list's ``continue`` token
    # it did not issue for that list (altered, another list's or another namespace's); a watch from
    # a version the change feed's history no longer holds; a body in a media type it does not take.
    BAD_SELECTOR = "bad_selector", 400
    BAD_CONTINUE = "bad_continue", 400
    RESOURCE_VERSION_EXPIRED = "resource_version_expired", 410
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type", 415
    # A tenant's creates past its create rate (a token bucket per tenant, summed over the replicas).
    # Retryable: the same create succeeds once its bucket refills, which the Retry-After says.
    TENANT_RATE_LIMITED = "tenant_rate_limited", 429, True
    # Any other HTTP error the framework raises keeps its own status; 400 is the usual one.
    HTTP_ERROR = "http_error", 400
    # A recipe's FROM naming a container registry's image whose registry does not answer (or no skopeo).
    REGISTRY_UNAVAILABLE = "registry_unavailable", 422
    # The template's ready check did not pass within the create's bound (its sandbox was removed).
    SANDBOX_NOT_READY = "sandbox_not_ready", 422
    # A create option corral does not honour (E2B's mcp, volumes, auto-pause...): refused, not dropped.
    UNSUPPORTED_OPTION = "unsupported_option", 400
    # A call of E2B's API that corral does not serve (forks, snapshots, volumes, secrets...): said so,
    # rather than a 404 the SDK would read as "sandbox not found".
    UNSUPPORTED_OPERATION = "unsupported_operation", 501

    # -- the server's own failures ----------------------------------------------------------------------
    INTERNAL = "internal", 500
    AGENT_ERROR = "agent_error", 502

    # -- a host agent's answers (to the control plane; the API translates them) ------------------------
    HOST_STARTS_SATURATED = "host_starts_saturated", 503, True
    HOST_MEMORY_PRESSURE = "host_memory_pressure", 503, True
    HOST_DOES_NOT_FIT = "host_does_not_fit", 503, True
    START_FAILED = "start_failed", 503, True
    SANDBOX_STARTING = "sandbox_starting", 503, True
    AGENT_UNAVAILABLE = "agent_unavailable", 503, True
    # The host could not fetch the sandbox's image (or what came did not hash to it): another may.
    IMAGE_UNAVAILABLE = "image_unavailable", 503, True
    SANDBOX_EXISTS = "sandbox_exists", 409
    SANDBOX_PAUSED = "sandbox_paused", 409
    SANDBOX_NOT_PAUSED = "sandbox_not_paused", 409
    WARM_EMPTY = "warm_empty", 409
    STALE_EPOCH = "stale_epoch", 409
    TEMPLATE_MISSING = "template_missing", 422
    # An egress policy naming hostnames: an IP filter cannot hold a name to its addresses, and a policy
    # that pretended to would be a silent "allow".
    NETWORK_HOSTNAMES_UNSUPPORTED = "network_hostnames_unsupported", 422
    # A policy with an interface, for a running sandbox created without one (mode "none"): its network
    # namespace has only loopback, and a running sandbox is not moved into another.
    NETWORK_NOT_ATTACHED = "network_not_attached", 409
    RUNTIME_FAILED = "runtime_failed", 502
    # Ports: nothing listens on the port inside the sandbox (or it refused the connection); a
    # token-guarded sandbox's port asked without its traffic token, or with a wrong one; a custom
    # domain another sandbox already holds (one name, one sandbox, fleet-wide).
    PORT_CLOSED = "port_closed", 502
    TRAFFIC_TOKEN_INVALID = "traffic_token_invalid", 403
    DOMAIN_TAKEN = "domain_taken", 409

    # -- made up by the SDK or a command, with no HTTP answer behind them -------------------------------
    ERROR = "error", None
    # The server was not reached, or not completely: only a request that is safe to repeat (a create
    # under an Idempotency-Key) is retried after it.
    UNREACHABLE = "unreachable", None
    BAD_RESPONSE = "bad_response", None
    INVALID_SCENARIO = "invalid_scenario", None
    # ``--runtime vm`` refused at start-up: this host cannot boot a stock guest kernel under KVM (no
    # /dev/kvm, or a paravirtual one, or no VMX/SVM); or it can, but no VM runtime is built yet.
    VM_HOST_UNSUPPORTED = "vm_host_unsupported", None
    VM_RUNTIME_NOT_BUILT = "vm_runtime_not_built", None


RETRYABLE = frozenset(c for c in ErrorCode if c.retryable)

_BY_VALUE = {c.value: c for c in ErrorCode}


def status_of(code: str, default: int) -> int:
    """The HTTP status a code answers with; ``default`` for an unregistered code or one without."""
    registered = _BY_VALUE.get(code)
    return registered.status if registered is not None and registered.status is not None else default


def retry_after_header(seconds: float | None) -> str:
    """A Retry-After value: whole seconds, at least one."""
    return str(max(1, math.ceil(seconds or 1)))
