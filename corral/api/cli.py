"""``corral serve`` (everything on this machine), ``corral api`` (one replica of many), ``corral
kubeconfig`` and ``corral admin``: the commands that start the control plane, beside what they start. Their options are read
here; what they start is imported only when they run."""

from __future__ import annotations

import enum
import os
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from corral import listen_options as lo
from corral.core import AdmissionMode, AdmissionPolicy, ConfigError
from corral.core.fair import DEFAULT_CREATES_IN_FLIGHT
from corral.core.inflight import (
    DEFAULT_EXECS_PER_SANDBOX,
    DEFAULT_EXECS_PER_TENANT,
    DEFAULT_PORT_REQUESTS_PER_SANDBOX,
)
from corral.core.rates import Rate
from corral.extras import require_extra

if TYPE_CHECKING:
    from corral.api.server import FrontProxyOptions

# A process sandbox's reserve before its first reading: the runtime's readings are trusted at once
# (its settle time is 0), so the reserve covers one heartbeat of growth, not a guest's boot; a fresh
# sandbox holds about 1 MiB. At the policy's 512, twelve 2 GiB hosts (a 24 GiB machine) admit 36
# unmeasured creates, and the first 50 of a new user's burst are refused until measured.
PROCESS_RESERVE_FLOOR_MB = 128

DevSharedAgentToken = Annotated[
    bool,
    typer.Option(
        "--dev-shared-agent-token",
        help="Development only: accept CORRAL_AGENT_TOKEN from every agent, for any host, and present it "
        "to every agent (instead of enrolled hosts' own credentials).",
    ),
]


class LogFormatChoice(enum.StrEnum):
    AUTO = "auto"
    JSON = "json"
    TEXT = "text"


LogFormat = Annotated[
    LogFormatChoice,
    typer.Option(
        "--log-format", help="Log lines as JSON or text (auto: text on a terminal, JSON otherwise)."
    ),
]


StaleAfter = Annotated[
    float | None,
    typer.Option("--stale-after", min=0.01, help="Seconds of silence before a host gets no new sandboxes."),
]
DeadAfter = Annotated[
    float | None,
    typer.Option(
        "--dead-after",
        min=0.01,
        help="Seconds of silence before a host is dead: its sandboxes are recreated elsewhere or orphaned.",
    ),
]
MaxExecsPerSandbox = Annotated[
    int,
    typer.Option(
        "--max-execs-per-sandbox",
        min=1,
        help="Commands one sandbox may have running through the data plane at once (exec, E2B "
        "commands and file operations); more are refused with 429 too_many_concurrent.",
    ),
]
TenantCreateRate = Annotated[
    float | None,
    typer.Option(
        "--tenant-create-rate",
        min=0.001,
        help="Creates a second a tenant may ask for, summed over every replica, where its record names "
        "none (PATCH /v1/tenants/NAME sets one); past it, 429 tenant_rate_limited. Default: unbounded.",
    ),
]
TenantCreateBurst = Annotated[
    int | None,
    typer.Option(
        "--tenant-create-burst",
        min=1,
        help="Creates a tenant may ask for at once (default: a second's worth).",
    ),
]
MaxCreatesInFlight = Annotated[
    int,
    typer.Option(
        "--max-creates-in-flight",
        min=1,
        help="Creates this replica works on at once; the rest wait their turn, tenant by tenant.",
    ),
]


TlsDir = Annotated[
    Path | None,
    typer.Option(
        "--tls-dir", help="Serve HTTPS with the certificate here (a self-signed one made on first use)."
    ),
]


RequestHeaderCA = Annotated[
    Path | None,
    typer.Option(
        "--requestheader-client-ca-file",
        help="Aggregated-API mode: the Kubernetes front-proxy CA (the requestheader-client-ca-file of "
        "kube-system/extension-apiserver-authentication). A client certificate it signed may send "
        "X-Remote-User and X-Remote-Group for the Kubernetes routes; from anyone else they are ignored. "
        "Needs --tls-dir.",
    ),
]
RequestHeaderAllowedNames = Annotated[
    str,
    typer.Option(
        "--requestheader-allowed-names",
        help="Comma-separated common names of the front proxy's client certificate (default: any the "
        "CA signed; the aggregator's is usually front-proxy-client).",
    ),
]
RequestHeaderAdminGroups = Annotated[
    list[str] | None,
    typer.Option(
        "--requestheader-admin-group",
        help="A Kubernetes group whose users are corral's admin (repeatable; default: system:masters). "
        "Other users are the tenant their group corral:tenant:NAME or system:serviceaccounts:NAME names.",
    ),
]


def front_proxy(
    ca: Path | None, allowed_names: str, admin_groups: list[str] | None, tls_dir: Path | None
) -> FrontProxyOptions | None:
    """The aggregated-API mode the flags name (names or groups alone name none)."""
    from corral.api.server import FrontProxyOptions
    from corral.core.frontproxy import DEFAULT_ADMIN_GROUPS, FrontProxyPolicy

    if ca is None:
        if allowed_names or admin_groups:
            raise typer.BadParameter("needs --requestheader-client-ca-file", param_hint="--requestheader-*")
        return None
    if tls_dir is None:
        raise typer.BadParameter(
            "the aggregator reaches corral over HTTPS: needs --tls-dir",
            param_hint="--requestheader-client-ca-file",
        )
    if not ca.is_file():
        raise typer.BadParameter(f"no such file: {ca}", param_hint="--requestheader-client-ca-file")
    names = frozenset(n.strip() for n in allowed_names.split(",") if n.strip())
    groups = frozenset(admin_groups) if admin_groups else DEFAULT_ADMIN_GROUPS
    return FrontProxyOptions(ca, FrontProxyPolicy(names, groups))


def create_rate(rate: float | None, burst: int | None) -> Rate | None:
    """The default create rate the flags name (a burst alone names none)."""
    if rate is None:
        if burst is not None:
            raise typer.BadParameter("needs --tenant-create-rate", param_hint="--tenant-create-burst")
        return None
    return Rate.of(rate, burst)


MaxPortRequestsPerSandbox = Annotated[
    int,
    typer.Option(
        "--max-port-requests-per-sandbox",
        min=1,
        help="Requests to one sandbox's ports this replica relays at once (WebSockets included); more "
        "are refused with 429 too_many_concurrent.",
    ),
]
MaxExecsPerTenant = Annotated[
    int,
    typer.Option(
        "--max-execs-per-tenant",
        min=1,
        help="Data-plane calls one tenant may have in flight through this replica (per replica); more "
        "are refused with 429 too_many_concurrent.",
    ),
]
SealKeyFile = Annotated[
    Path | None,
    typer.Option(
        "--seal-key-file",
        help="Keys sealing sandbox specs, newest first (made, 0600, on first start; CORRAL_SEAL_KEY wins). "
        "Every replica needs the same.",
    ),
]
MetricsOpen = Annotated[
    bool,
    typer.Option(
        "--metrics-open",
        help="Serve /metrics without a token: only on a listener that only the scraper can reach "
        "(otherwise it takes the admin token or a metrics token: `corral tokens metrics`).",
    ),
]


Domain = Annotated[
    str | None,
    typer.Option(
        "--domain",
        help="Where sandboxes' ports are reached: {port}-{sandbox_id}.DOMAIN on any replica (returned on "
        "creates, the e2b SDK's get_host). Default: localhost:PORT (browsers resolve *.localhost here).",
    ),
]


def _shared_agent_token(enabled: bool) -> str | None:
    token = os.environ.get("CORRAL_AGENT_TOKEN") or None
    if enabled and token is None:
        raise typer.BadParameter("set CORRAL_AGENT_TOKEN", param_hint="--dev-shared-agent-token")
    if token is not None and not enabled:
        raise typer.BadParameter(
            "CORRAL_AGENT_TOKEN is set: a fleet-wide agent token is a development mode, say so with "
            "--dev-shared-agent-token (or enrol hosts: `corral hosts token ID`)",
            param_hint="CORRAL_AGENT_TOKEN",
        )
    return token


def serve(
    hosts: Annotated[
        int, typer.Option("--hosts", min=1, max=1000, help="Local hosts (agents in this process).")
    ] = 12,
    runtime: Annotated[
        str | None,
        typer.Option(
            "--runtime",
            help="process | gvisor | sim | vm (vm: probed, not built yet; default: process where "
            "bubblewrap works).",
        ),
    ] = None,
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535)] = 8700,
    store: Annotated[
        str, typer.Option("--store", help="sqlite:///path.db or postgresql://...")
    ] = "sqlite:///corral.db",
    memory_mb: Annotated[int | None, typer.Option("--host-memory-mb", min=1024)] = None,
    host_cpus: Annotated[float | None, typer.Option("--host-cpus", min=0.1)] = None,
    admission: Annotated[AdmissionMode, typer.Option("--admission")] = AdmissionMode.WORKING_SET,
    heartbeat_interval: Annotated[float, typer.Option("--heartbeat-interval", min=0.05)] = 2.0,
    k: Annotated[
        int | None, typer.Option("--k", min=0, help="Power-of-K (default: max(2, log2 hosts); 0: scan all).")
    ] = None,
    state_dir: Annotated[Path | None, typer.Option("--state-dir", help="Process runtime state.")] = None,
    max_concurrent_starts: Annotated[int, typer.Option("--max-concurrent-starts", min=1)] = 8,
    dev_shared_agent_token: DevSharedAgentToken = False,
    settle_s: Annotated[
        float | None,
        typer.Option(
            "--memory-settle-s",
            min=0,
            help="Seconds before a sandbox's stable memory reading replaces its reserve "
            "(default: what the runtime declares: process 0, sim 10).",
        ),
    ] = None,
    stale_after: StaleAfter = None,
    dead_after: DeadAfter = None,
    seal_key_file: SealKeyFile = None,
    header_timeout: lo.HeaderTimeout = lo.DEFAULTS.header_timeout_s,
    body_timeout: lo.BodyTimeout = lo.DEFAULTS.body_timeout_s,
    keep_alive_timeout: lo.KeepAliveTimeout = lo.DEFAULTS.keep_alive_s,
    max_connections: lo.MaxConnections = lo.DEFAULTS.max_connections,
    max_connections_per_peer: lo.MaxConnectionsPerPeer = lo.DEFAULTS.max_connections_per_peer,
    max_requests_per_token: lo.MaxRequestsPerToken = lo.DEFAULT_REQUESTS_PER_TOKEN,
    metrics_open: MetricsOpen = False,
    max_execs_per_sandbox: MaxExecsPerSandbox = DEFAULT_EXECS_PER_SANDBOX,
    max_execs_per_tenant: MaxExecsPerTenant = DEFAULT_EXECS_PER_TENANT,
    max_port_requests_per_sandbox: MaxPortRequestsPerSandbox = DEFAULT_PORT_REQUESTS_PER_SANDBOX,
    tenant_create_rate: TenantCreateRate = None,
    tenant_create_burst: TenantCreateBurst = None,
    max_creates_in_flight: MaxCreatesInFlight = DEFAULT_CREATES_IN_FLIGHT,
    tls_dir: TlsDir = None,
    requestheader_client_ca_file: RequestHeaderCA = None,
    requestheader_allowed_names: RequestHeaderAllowedNames = "",
    requestheader_admin_group: RequestHeaderAdminGroups = None,
    log_format: LogFormat = LogFormatChoice.AUTO,
    reserve_floor_mb: Annotated[
        int | None,
        typer.Option(
            "--reserve-floor-mb",
            min=0,
            help="What a sandbox not measured yet is charged, at least (at most what it asked for). "
            f"Default: process {PROCESS_RESERVE_FLOOR_MB} (its first reading replaces it at the next "
            "heartbeat), sim 512.",
        ),
    ] = None,
    domain: Domain = None,
    keep_sandboxes: Annotated[
        bool,
        typer.Option(
            "--keep-sandboxes",
            help="On stop, leave the process runtime's sandboxes running; the next start re-adopts them "
            "(default: they are stopped, and their records say so).",
        ),
    ] = False,
    build_dir: Annotated[
        Path | None,
        typer.Option(
            "--build-dir", help="E2B template builds' layers and uploads (default: beside the store)."
        ),
    ] = None,
    bases_dir: Annotated[
        Path | None,
        typer.Option(
            "--bases-dir", help="Base root filesystems (tarballs), made with mmdebstrap when missing."
        ),
    ] = None,
    build_network: Annotated[
        bool,
        typer.Option(
            "--build-network",
            help="Let template build steps use this machine's network (apt, pip). Off by default: a "
            "tenant's build step then shares the host's network, loopback services included.",
        ),
    ] = False,
) -> None:
    """Run everything on this machine: API, embedded store and a local fleet. Without CORRAL_TOKEN the
    admin token is made on the first start and kept beside the store (corral.admin-token, 0600)."""
    require_extra("server", "serve")
    from corral.agent.cli import host_memory_mb
    from corral.api.server import ServeOptions
    from corral.api.server import serve as serve_
    from corral.control.localfleet import process_runtime_available

    kind = runtime or ("process" if process_runtime_available() else "sim")
    if kind == "vm":
        from corral.runtime import vm

        raise typer.BadParameter(vm.unavailable_reason(), param_hint="--runtime")
    if kind not in ("process", "gvisor", "sim"):
        raise typer.BadParameter("one of: process, gvisor, sim", param_hint="--runtime")
    if kind == "gvisor":
        from corral.runtime.gvisor import unavailable_reason

        if (why := unavailable_reason()) is not None:
            raise typer.BadParameter(f"the gvisor runtime is not available: {why}", param_hint="--runtime")
    if kind in ("process", "gvisor"):
        # A process host is a slice of this machine, not a 32 GiB fiction.
        mem = memory_mb or max(2048, (host_memory_mb() or 8192) // hosts)
        # CPU is not partitioned between process hosts (no CPU limit is enforced): each may use every
        # core of this machine, and the admission policy overcommits it.
        cpus = host_cpus or float(os.cpu_count() or 1)
    else:
        mem = memory_mb or 32768
        cpus = host_cpus or 16.0
    opts = ServeOptions(
        host=host,
        port=port,
        store=store,
        hosts=hosts,
        runtime=kind,
        host_memory_mb=mem,
        host_cpus=cpus,
        admission=admission,
        admin_token=os.environ.get("CORRAL_TOKEN") or None,
        agent_token=_shared_agent_token(dev_shared_agent_token),
        heartbeat_interval_s=heartbeat_interval,
        k=k,
        state_dir=state_dir,
        headroom_mb=min(2048, mem // 8),
        max_concurrent_starts=max_concurrent_starts,
        settle_s=settle_s,
        stale_after_s=stale_after,
        dead_after_s=dead_after,
        seal_key_file=seal_key_file,
        listen=lo.bounds(
            header_timeout, body_timeout, keep_alive_timeout, max_connections, max_connections_per_peer
        ),
        requests_per_token=max_requests_per_token,
        metrics_open=metrics_open,
        max_execs_per_sandbox=max_execs_per_sandbox,
        max_execs_per_tenant=max_execs_per_tenant,
        max_port_requests_per_sandbox=max_port_requests_per_sandbox,
        default_create_rate=create_rate(tenant_create_rate, tenant_create_burst),
        max_creates_in_flight=max_creates_in_flight,
        tls_dir=tls_dir,
        front_proxy=front_proxy(
            requestheader_client_ca_file, requestheader_allowed_names, requestheader_admin_group, tls_dir
        ),
        keep_sandboxes=keep_sandboxes,
        build_dir=build_dir,
        bases_dir=bases_dir,
        build_network=build_network,
        domain=domain or f"localhost:{port}",
        reserve_floor_mb=reserve_floor_mb
        if reserve_floor_mb is not None
        else (PROCESS_RESERVE_FLOOR_MB if kind == "process" else AdmissionPolicy().reserve_floor_mb),
    )
    _run_replica(serve_(opts), log_format)


def kubeconfig(
    server: Annotated[str, typer.Option("--server", help="corral's HTTPS URL")] = "https://127.0.0.1:8700",
    tls_dir: Annotated[
        Path | None, typer.Option("--tls-dir", help="The server's --tls-dir: its certificate is the CA")
    ] = None,
    namespace: Annotated[
        str, typer.Option("--namespace", help="The tenant whose namespace is current")
    ] = "default",
) -> None:
    """Print a kubeconfig for kubectl against corral, with CORRAL_TOKEN (the admin's, or a tenant's
    from `corral tokens tenant NAME`) as its bearer token."""
    import base64

    import yaml

    token = os.environ.get("CORRAL_TOKEN")
    if not token:
        raise typer.BadParameter("set CORRAL_TOKEN to the token kubectl should present")
    cluster: dict[str, str] = {"server": server}
    if tls_dir is not None:
        from corral.tls import CERT

        cluster["certificate-authority-data"] = base64.b64encode((tls_dir / CERT).read_bytes()).decode()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "corral", "cluster": cluster}],
        "users": [{"name": "corral", "user": {"token": token}}],
        "contexts": [
            {"name": "corral", "context": {"cluster": "corral", "user": "corral", "namespace": namespace}}
        ],
        "current-context": "corral",
    }
    typer.echo(yaml.safe_dump(config, sort_keys=False), nl=False)


def api(
    store: Annotated[str, typer.Option("--store", help="postgresql://user@host:port/db (or sqlite:///...)")],
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535)] = 8700,
    k: Annotated[
        int | None, typer.Option("--k", min=0, help="Power-of-K (default: max(2, log2 hosts)).")
    ] = None,
    heartbeat_interval: Annotated[float, typer.Option("--heartbeat-interval", min=0.05)] = 2.0,
    replica_id: Annotated[str | None, typer.Option("--replica-id")] = None,
    lease_s: Annotated[float, typer.Option("--lease-s", min=0.5, help="Replica lease.")] = 15.0,
    bind_timeout: Annotated[float, typer.Option("--bind-timeout", min=0.1)] = 30.0,
    reconcile_interval: Annotated[float, typer.Option("--reconcile-interval", min=0.05)] = 1.0,
    dev_shared_agent_token: DevSharedAgentToken = False,
    stale_after: StaleAfter = None,
    dead_after: DeadAfter = None,
    seal_key_file: SealKeyFile = None,
    header_timeout: lo.HeaderTimeout = lo.DEFAULTS.header_timeout_s,
    body_timeout: lo.BodyTimeout = lo.DEFAULTS.body_timeout_s,
    keep_alive_timeout: lo.KeepAliveTimeout = lo.DEFAULTS.keep_alive_s,
    max_connections: lo.MaxConnections = lo.DEFAULTS.max_connections,
    max_connections_per_peer: lo.MaxConnectionsPerPeer = lo.DEFAULTS.max_connections_per_peer,
    max_requests_per_token: lo.MaxRequestsPerToken = lo.DEFAULT_REQUESTS_PER_TOKEN,
    metrics_open: MetricsOpen = False,
    max_execs_per_tenant: MaxExecsPerTenant = DEFAULT_EXECS_PER_TENANT,
    max_port_requests_per_sandbox: MaxPortRequestsPerSandbox = DEFAULT_PORT_REQUESTS_PER_SANDBOX,
    tenant_create_rate: TenantCreateRate = None,
    tenant_create_burst: TenantCreateBurst = None,
    max_creates_in_flight: MaxCreatesInFlight = DEFAULT_CREATES_IN_FLIGHT,
    tls_dir: TlsDir = None,
    requestheader_client_ca_file: RequestHeaderCA = None,
    requestheader_allowed_names: RequestHeaderAllowedNames = "",
    requestheader_admin_group: RequestHeaderAdminGroups = None,
    log_format: LogFormat = LogFormatChoice.AUTO,
    domain: Domain = None,
) -> None:
    """Run one control-plane replica against a shared store; agents join over HTTP once enrolled
    (`corral hosts token ID`)."""
    require_extra("server", "api")
    from corral.api.server import ApiOptions
    from corral.api.server import api as api_

    agent_token = _shared_agent_token(dev_shared_agent_token)
    opts = ApiOptions(
        host=host,
        port=port,
        store=store,
        admin_token=os.environ.get("CORRAL_TOKEN") or None,
        agent_token=agent_token,
        k=k,
        heartbeat_interval_s=heartbeat_interval,
        replica_id=replica_id,
        lease_s=lease_s,
        bind_timeout_s=bind_timeout,
        reconcile_interval_s=reconcile_interval,
        stale_after_s=stale_after,
        dead_after_s=dead_after,
        seal_key_file=seal_key_file,
        listen=lo.bounds(
            header_timeout, body_timeout, keep_alive_timeout, max_connections, max_connections_per_peer
        ),
        requests_per_token=max_requests_per_token,
        metrics_open=metrics_open,
        max_execs_per_tenant=max_execs_per_tenant,
        max_port_requests_per_sandbox=max_port_requests_per_sandbox,
        default_create_rate=create_rate(tenant_create_rate, tenant_create_burst),
        max_creates_in_flight=max_creates_in_flight,
        tls_dir=tls_dir,
        front_proxy=front_proxy(
            requestheader_client_ca_file, requestheader_allowed_names, requestheader_admin_group, tls_dir
        ),
        domain=domain or f"localhost:{port}",
    )
    _run_replica(api_(opts), log_format)


def _run_replica(main: Coroutine[object, object, None], log_format: LogFormatChoice) -> None:
    """Run a replica's ``main``; a bad token, seal key or setting is the operator's mistake, said as one."""
    from corral.api.server import BadSealKey, BadToken, run
    from corral.store import TokenRevoked

    try:
        run(main, log_format.value)
    except (BadToken, TokenRevoked) as e:
        raise typer.BadParameter(str(e), param_hint="CORRAL_TOKEN") from None
    except (ConfigError, BadSealKey) as e:
        raise typer.BadParameter(str(e)) from None


admin_app = typer.Typer(no_args_is_help=True, help="Operations on the state of record.")


@admin_app.command("reseal")
def reseal(
    store: Annotated[str, typer.Option("--store", help="sqlite:///path.db or postgresql://...")],
    seal_key_file: SealKeyFile = None,
) -> None:
    """Seal every sandbox spec under the newest key (after a rotation), so old keys can be removed."""
    import asyncio

    from corral.api.server import BadSealKey, default_seal_key_file, sealer_for
    from corral.control.reseal import reseal_all
    from corral.store import open_store

    try:
        sealer = sealer_for(seal_key_file or default_seal_key_file(store), create=False)
    except BadSealKey as e:
        raise typer.BadParameter(str(e), param_hint="--seal-key-file") from None

    async def go() -> None:
        async with open_store(store) as st:
            await st.migrate()
            report = await reseal_all(st, sealer)
        typer.echo(f"{report.checked} sealed specs checked, {report.resealed} re-sealed under the newest key")

    asyncio.run(go())
