"""Starting servers: ``corral serve`` (everything in one process on embedded SQLite) and ``corral api``
(one stateless replica of many, on PostgreSQL, with agents elsewhere)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import secrets
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path

import uvicorn
from starlette.types import ASGIApp

from corral.aio import loop_factory
from corral.api import collector
from corral.api.app import create_app
from corral.api.tokenbound import TokenBound
from corral.clock import SystemClock
from corral.control.agents import HttpAgents, LocalAgents
from corral.control.config import ControlConfig, default_replica_id
from corral.control.localfleet import LocalFleet, build_local_fleet
from corral.control.plane import ControlPlane, build_replica
from corral.control.seal import SEAL_KEY_ENV, Sealer, SealError, load_keys
from corral.core import AdmissionMode, AdmissionPolicy, Timeouts
from corral.core.inflight import DEFAULT_EXECS_PER_SANDBOX, DEFAULT_EXECS_PER_TENANT
from corral.core.listen import DEFAULT_REQUESTS_PER_TOKEN, ListenBounds
from corral.listener import uvicorn_config
from corral.logs import configure as configure_logging
from corral.store import open_store

log = logging.getLogger("corral")


@dataclass(frozen=True)
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 8700
    store: str = "sqlite:///corral.db"
    hosts: int = 12
    runtime: str = "sim"
    host_memory_mb: int = 32768
    host_cpus: float = 16.0
    admission: AdmissionMode = AdmissionMode.WORKING_SET
    admin_token: str | None = None
    agent_token: str | None = None
    heartbeat_interval_s: float = 2.0
    k: int | None = None
    state_dir: Path | None = None
    headroom_mb: int = 2048
    max_concurrent_starts: int = 8
    settle_s: float | None = None  # None: what the runtime declares
    stale_after_s: float | None = None  # None: from the heartbeat interval
    dead_after_s: float | None = None
    seal_key_file: Path | None = None  # None: beside the SQLite file (or in the working directory)
    listen: ListenBounds = field(default_factory=ListenBounds)
    requests_per_token: int = DEFAULT_REQUESTS_PER_TOKEN
    # /metrics without a token: only for a listener that only the scraper can reach.
    metrics_open: bool = False
    max_execs_per_sandbox: int = DEFAULT_EXECS_PER_SANDBOX
    max_execs_per_tenant: int = DEFAULT_EXECS_PER_TENANT
    extra: dict[str, str] = field(default_factory=dict)


def api_server(
    app: ASGIApp,
    host: str,
    port: int,
    bounds: ListenBounds = ListenBounds(),
    requests_per_token: int = DEFAULT_REQUESTS_PER_TOKEN,
) -> uvicorn.Server:
    """The API under its listener's bounds, and each token's requests in flight bounded in front."""
    config = uvicorn_config(
        TokenBound(app, requests_per_token),
        host,
        port,
        bounds,
        log_level="warning",
        access_log=False,
        lifespan="on",
    )
    return uvicorn.Server(config)


def _timeouts(
    heartbeat_interval_s: float, stale_after_s: float | None = None, dead_after_s: float | None = None
) -> Timeouts:
    """The ordering (heartbeat < stale < dead) is checked by :class:`Timeouts` itself."""
    return Timeouts(
        heartbeat_interval_s=heartbeat_interval_s,
        stale_after_s=stale_after_s if stale_after_s is not None else max(10.0, 5 * heartbeat_interval_s),
        dead_after_s=dead_after_s if dead_after_s is not None else max(60.0, 30 * heartbeat_interval_s),
    )


def default_seal_key_file(store: str) -> Path:
    """Beside an SQLite file; else in the working directory."""
    if store.startswith("sqlite:///") and store != "sqlite:///:memory:":
        return Path(store.removeprefix("sqlite:///")).with_suffix(".seal.key")
    return Path("corral.seal.key")


def sealer_for(key_file: Path | None, *, create: bool) -> Sealer:
    try:
        return Sealer(load_keys(key_file, create=create))
    except SealError as exc:
        raise BadSealKey(str(exc)) from exc


MIN_TOKEN_CHARS = 16


class BadToken(ValueError):
    pass


class BadSealKey(ValueError):
    pass


def token_or_new(token: str | None, name: str = "CORRAL_TOKEN") -> tuple[str, bool]:
    if token is None:
        return secrets.token_urlsafe(24), True
    if len(token) < MIN_TOKEN_CHARS:
        raise BadToken(f"{name} must be at least {MIN_TOKEN_CHARS} characters")
    return token, False


Prepare = Callable[[ControlPlane, LocalFleet], Awaitable[None]]


async def serve(opts: ServeOptions, prepare: Prepare | None = None) -> None:
    """All in one: SQLite, the API, and ``opts.hosts`` agents in this process. ``prepare`` runs once
    the store is migrated, before the agents start (a benchmark fills the fleet there)."""
    admin, generated = token_or_new(opts.admin_token)
    if opts.agent_token is not None:
        token_or_new(opts.agent_token, "CORRAL_AGENT_TOKEN")
    policy = AdmissionPolicy(headroom_mb=opts.headroom_mb)
    timeouts = _timeouts(opts.heartbeat_interval_s, opts.stale_after_s, opts.dead_after_s)
    config = ControlConfig(
        timeouts=timeouts,
        policy=policy,
        k=opts.k,
        max_execs_per_tenant=opts.max_execs_per_tenant,
        max_execs_per_sandbox=opts.max_execs_per_sandbox,  # the same as this process's agents'
    )
    # The first start makes the key file (0600); every later one, and every replica, reads it.
    sealer = sealer_for(opts.seal_key_file or default_seal_key_file(opts.store), create=True)
    store = open_store(opts.store)
    # Agents in this process are called directly; any that join over the network are enrolled hosts.
    directory = LocalAgents(HttpAgents(store.host_key, shared_token=opts.agent_token))
    plane = build_replica(store, directory, config, SystemClock(), random.Random(), sealer=sealer)
    fleet = build_local_fleet(
        plane,
        directory,
        hosts=opts.hosts,
        runtime=opts.runtime,
        memory_mb=opts.host_memory_mb,
        cpus=opts.host_cpus,
        admission=opts.admission,
        policy=policy,
        heartbeat_interval_s=opts.heartbeat_interval_s,
        max_concurrent_starts=opts.max_concurrent_starts,
        state_root=opts.state_dir,
        settle_s=opts.settle_s,
        max_execs_per_sandbox=opts.max_execs_per_sandbox,
    )
    stopped = False

    async def shut_down() -> None:
        nonlocal stopped
        if stopped:
            return
        stopped = True
        await fleet.stop(stop_sandboxes=opts.runtime == "process")
        await plane.stop()
        await store.close()

    app = create_app(plane, manage=False, on_shutdown=shut_down, metrics_open=opts.metrics_open)
    try:
        # One process owns this store: the admin token it starts with is the only configured one.
        await plane.start(admin_token=admin, agent_token=opts.agent_token, replace_admin_token=True)
        if prepare is not None:
            await prepare(plane, fleet)
        await fleet.start()
        server = api_server(app, opts.host, opts.port, opts.listen, opts.requests_per_token)
        url = f"http://{opts.host}:{opts.port}"
        print(f"corral serving on {url}: {opts.hosts} {opts.runtime} hosts, store {opts.store}", flush=True)
        if generated:
            print(f"admin token (set CORRAL_TOKEN to choose one): {admin}", flush=True)
        print(f"try:  CORRAL_URL={url} CORRAL_TOKEN=... corral burst -n 50", flush=True)
        async with collector.tuned():
            await server.serve()
    finally:
        await shut_down()  # when the server never started; after a normal shutdown, a no-op


@dataclass(frozen=True)
class ApiOptions:
    store: str
    # Development only: one fleet-wide agent token instead of enrolled hosts.
    agent_token: str | None = None
    host: str = "127.0.0.1"
    port: int = 8700
    admin_token: str | None = None
    k: int | None = None
    heartbeat_interval_s: float = 2.0
    replica_id: str | None = None
    lease_s: float = 15.0
    bind_timeout_s: float = 30.0
    reconcile_interval_s: float = 1.0
    stale_after_s: float | None = None
    dead_after_s: float | None = None
    seal_key_file: Path | None = None
    listen: ListenBounds = field(default_factory=ListenBounds)
    requests_per_token: int = DEFAULT_REQUESTS_PER_TOKEN
    # /metrics without a token: only for a listener that only the scraper can reach.
    metrics_open: bool = False
    max_execs_per_tenant: int = DEFAULT_EXECS_PER_TENANT


async def api(opts: ApiOptions) -> None:
    """One replica: stateless, all state in the store; agents reached at their published addresses."""
    admin, generated = token_or_new(opts.admin_token)
    if opts.agent_token is not None:
        token_or_new(opts.agent_token, "CORRAL_AGENT_TOKEN")
    base = _timeouts(opts.heartbeat_interval_s, opts.stale_after_s, opts.dead_after_s)
    timeouts = Timeouts(
        heartbeat_interval_s=base.heartbeat_interval_s,
        stale_after_s=base.stale_after_s,
        dead_after_s=base.dead_after_s,
        bind_timeout_s=opts.bind_timeout_s,
        reservation_ttl_s=max(base.reservation_ttl_s, 4 * opts.bind_timeout_s),
    )
    config = ControlConfig(
        replica_id=opts.replica_id or default_replica_id(),
        timeouts=timeouts,
        k=opts.k,
        replica_lease_s=opts.lease_s,
        reconcile_interval_s=min(opts.reconcile_interval_s, opts.lease_s / 3),
        max_execs_per_tenant=opts.max_execs_per_tenant,
    )
    # Replicas must share their keys: one is never invented here (no key: no sealed specs, so no
    # secrets, recreate or waiting creates).
    sealer = None
    if opts.seal_key_file is not None or os.environ.get(SEAL_KEY_ENV):
        sealer = sealer_for(opts.seal_key_file, create=True)
    store = open_store(opts.store)
    agents = HttpAgents(store.host_key, shared_token=opts.agent_token)
    plane = build_replica(store, agents, config, SystemClock(), random.Random(), sealer=sealer)
    stopped = False

    async def shut_down() -> None:
        nonlocal stopped
        if not stopped:
            stopped = True
            await plane.stop()
            await store.close()

    app = create_app(plane, manage=False, on_shutdown=shut_down, metrics_open=opts.metrics_open)
    try:
        # Before serving, so a refused configuration (a revoked CORRAL_TOKEN) stops the process.
        await plane.start(admin_token=admin, agent_token=opts.agent_token)
        server = api_server(app, opts.host, opts.port, opts.listen, opts.requests_per_token)
        print(f"corral api replica {config.replica_id} on http://{opts.host}:{opts.port}", flush=True)
        if generated:
            print(f"admin token (set CORRAL_TOKEN to choose one): {admin}", flush=True)
        async with collector.tuned():
            await server.serve()
    finally:
        await shut_down()  # when the server never started; after its shutdown, a no-op


def run(coro: Coroutine[object, object, None], log_format: str = "auto") -> None:
    configure_logging(log_format)
    # uvicorn turns SIGINT/SIGTERM into a graceful shutdown of its server; the finally blocks above
    # then stop the fleet and the control plane.
    with contextlib.suppress(KeyboardInterrupt), asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(coro)
