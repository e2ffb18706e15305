"""``corral ...``: the command line. Each sub-command lives beside what it starts; this module only
registers them."""

from __future__ import annotations

import enum
import importlib.util
import os
from pathlib import Path
from typing import Annotated

import typer

from corral import __version__
from corral import listen_options as lo
from corral.client.cli import (
    burst_command,
    exec_command,
    explain_command,
    hosts_command,
    kill_command,
    ps_command,
    tokens_command,
    top_command,
)
from corral.client.pools_cli import pools_app
from corral.core import AdmissionMode, ConfigError
from corral.core.inflight import DEFAULT_EXECS_PER_SANDBOX, DEFAULT_EXECS_PER_TENANT

app = typer.Typer(
    no_args_is_help=True, add_completion=False, help="corral: a control plane for sandbox fleets."
)

# `pip install corral` is the SDK and the client commands; these extras bring the rest.
EXTRAS = {
    "server": ("fastapi", "uvicorn", "psycopg", "psycopg_pool", "prometheus_client"),
    "sim": ("matplotlib",),
}


def missing_module(extra: str) -> str | None:
    """The first module of an extra that is not installed, if any."""
    return next((m for m in EXTRAS[extra] if importlib.util.find_spec(m) is None), None)


def require_extra(extra: str, command: str) -> None:
    module = missing_module(extra)
    if module is not None:
        typer.echo(
            f"corral {command} needs the {extra} extra ({module} is not installed): "
            f"pip install 'corral[{extra}]'",
            err=True,
        )
        raise typer.Exit(2)


def _needs_extra(extra: str, command: str) -> None:
    """Register ``command`` as a stub that explains which extra to install."""

    @app.command(
        command,
        help=f"(needs `pip install 'corral[{extra}]'`)",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        add_help_option=False,
    )
    def stub(ctx: typer.Context) -> None:
        require_extra(extra, command)


@app.callback()
def main() -> None:
    """corral: a control plane for sandbox fleets."""


@app.command()
def version() -> None:
    """Print corral's version."""
    typer.echo(__version__)


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


@app.command()
def serve(
    hosts: Annotated[
        int, typer.Option("--hosts", min=1, max=1000, help="Local hosts (agents in this process).")
    ] = 12,
    runtime: Annotated[
        str | None, typer.Option("--runtime", help="process | sim (default: process where bubblewrap works).")
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
    log_format: LogFormat = LogFormatChoice.AUTO,
) -> None:
    """Run everything on this machine: API, embedded store and a local fleet."""
    require_extra("server", "serve")
    from corral.agent.cli import host_memory_mb
    from corral.api.server import BadSealKey, BadToken, ServeOptions, run
    from corral.api.server import serve as serve_
    from corral.control.localfleet import process_runtime_available
    from corral.store import TokenRevoked

    kind = runtime or ("process" if process_runtime_available() else "sim")
    if kind not in ("process", "sim"):
        raise typer.BadParameter("one of: process, sim", param_hint="--runtime")
    if kind == "process":
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
    )
    try:
        run(serve_(opts), log_format.value)
    except (BadToken, TokenRevoked) as e:
        raise typer.BadParameter(str(e), param_hint="CORRAL_TOKEN") from None
    except (ConfigError, BadSealKey) as e:
        raise typer.BadParameter(str(e)) from None


@app.command()
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
    log_format: LogFormat = LogFormatChoice.AUTO,
) -> None:
    """Run one control-plane replica against a shared store; agents join over HTTP once enrolled
    (`corral hosts token ID`)."""
    require_extra("server", "api")
    from corral.api.server import ApiOptions, BadSealKey, BadToken, run
    from corral.api.server import api as api_
    from corral.store import TokenRevoked

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
    )
    try:
        run(api_(opts), log_format.value)
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


if missing_module("server") is None:
    from corral.agent.cli import agent_command

    app.command("agent")(agent_command)
else:
    _needs_extra("server", "agent")
app.command("burst")(burst_command)
app.command("ps")(ps_command)
app.command("hosts")(hosts_command)
app.command("tokens")(tokens_command)
app.command("exec", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(exec_command)
app.command("kill")(kill_command)
app.command("explain")(explain_command)
app.command("top")(top_command)
if missing_module("sim") is None:
    from corral.sim.cli import sim_app

    app.add_typer(sim_app, name="sim")
else:
    _needs_extra("sim", "sim")
app.add_typer(pools_app, name="pools")
app.add_typer(admin_app, name="admin")


if __name__ == "__main__":  # pragma: no cover
    app()
