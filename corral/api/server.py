"""Starting servers: ``corral serve`` (everything in one process on embedded SQLite) and ``corral api``
(one stateless replica of many, on PostgreSQL, with agents elsewhere)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import secrets
import shlex
import ssl
import sys
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from starlette.types import ASGIApp

from corral.aio import loop_factory
from corral.api import collector
from corral.api.app import create_app
from corral.api.ports import Ports
from corral.api.tokenbound import TokenBound
from corral.clock import SystemClock
from corral.control.agents import HttpAgents, LocalAgents
from corral.control.builds import local_builds
from corral.control.config import ControlConfig, default_replica_id
from corral.control.localfleet import LocalFleet, build_local_fleet
from corral.control.plane import ControlPlane, build_replica
from corral.control.seal import SEAL_KEY_ENV, Sealer, SealError, load_keys
from corral.core import AdmissionMode, AdmissionPolicy, ConfigError, Timeouts
from corral.core.fair import DEFAULT_CREATES_IN_FLIGHT
from corral.core.frontproxy import FrontProxyPolicy
from corral.core.inflight import (
    DEFAULT_EXECS_PER_SANDBOX,
    DEFAULT_EXECS_PER_TENANT,
    DEFAULT_PORT_REQUESTS_PER_SANDBOX,
)
from corral.core.listen import DEFAULT_REQUESTS_PER_TOKEN, ListenBounds
from corral.core.rates import Rate
from corral.images import DirBlobStore
from corral.listener import uvicorn_config
from corral.logs import configure as configure_logging
from corral.store import open_store, own_blobs
from corral.tls import self_signed

log = logging.getLogger("corral")


@dataclass(frozen=True)
class FrontProxyOptions:
    """The aggregated-API mode: a Kubernetes aggregator's client certificates are verified against
    ``client_ca`` (its request-header CA, PEM) as connections are made, and its identity headers
    mapped by ``policy``. Needs HTTPS."""

    client_ca: Path
    policy: FrontProxyPolicy = field(default_factory=FrontProxyPolicy)


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
    # The charge of a sandbox not measured yet (at least this much, at most what it asked for).
    reserve_floor_mb: int = AdmissionPolicy().reserve_floor_mb
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
    max_port_requests_per_sandbox: int = DEFAULT_PORT_REQUESTS_PER_SANDBOX
    # Where the admin token is kept when CORRAL_TOKEN is not set (None: beside the SQLite file).
    admin_token_file: Path | None = None
    # Leave the process runtime's sandboxes running at shutdown, for the next start to re-adopt.
    keep_sandboxes: bool = False
    # A tenant's create rate where its record names none (None: unbounded), and the creates worked on
    # at once, taken in turns by tenant.
    default_create_rate: Rate | None = None
    max_creates_in_flight: int = DEFAULT_CREATES_IN_FLIGHT
    extra: dict[str, str] = field(default_factory=dict)
    # HTTPS with the certificate there (self-signed, made on first use); None: plain HTTP.
    tls_dir: Path | None = None
    # E2B's Template SDK builds: their layers and uploads (None: beside the SQLite file), the base
    # tarballs (None: under the build directory), and whether build steps share this machine's network.
    build_dir: Path | None = None
    bases_dir: Path | None = None
    build_network: bool = False
    domain: str | None = None  # where sandboxes' ports are reached ({port}-{id}.{domain})
    front_proxy: FrontProxyOptions | None = None


def api_server(
    app: ASGIApp,
    host: str,
    port: int,
    bounds: ListenBounds = ListenBounds(),
    requests_per_token: int = DEFAULT_REQUESTS_PER_TOKEN,
    tls_dir: Path | None = None,
    client_ca: Path | None = None,
) -> uvicorn.Server:
    """The API under its listener's bounds, and each token's requests in flight bounded in front;
    over HTTPS with ``tls_dir``'s certificate. ``client_ca``: a client certificate, when one is
    presented, is verified against it in the handshake (one from any other CA fails it), and the
    verified certificate is in each request's scope (:data:`corral.listener.TLS_PEER`). An app with
    sandboxes' ports has their plain requests spliced before the parser (:mod:`corral.agent.portsplice`)."""
    ports = getattr(app, "ports", None)
    tls: dict[str, Any] = {}
    if tls_dir is not None:
        cert, key = self_signed(tls_dir)
        tls = {"ssl_certfile": str(cert), "ssl_keyfile": str(key)}
    if client_ca is not None:
        if tls_dir is None:
            raise ConfigError("a request-header CA needs HTTPS (--tls-dir)")
        if not client_ca.is_file():
            raise ConfigError(f"no request-header CA file at {client_ca}")
        tls.update(ssl_ca_certs=str(client_ca), ssl_cert_reqs=ssl.CERT_OPTIONAL)
    config = uvicorn_config(
        TokenBound(app, requests_per_token),
        host,
        port,
        bounds,
        front=ports.splicer if isinstance(ports, Ports) else None,
        log_level="warning",
        access_log=False,
        lifespan="on",
        **tls,
    )
    return uvicorn.Server(config)


def listener(app: ASGIApp, opts: ServeOptions | ApiOptions) -> uvicorn.Server:
    """The API's server as a replica's options configure it."""
    return api_server(
        app,
        opts.host,
        opts.port,
        opts.listen,
        opts.requests_per_token,
        opts.tls_dir,
        opts.front_proxy.client_ca if opts.front_proxy else None,
    )


def _timeouts(
    heartbeat_interval_s: float, stale_after_s: float | None = None, dead_after_s: float | None = None
) -> Timeouts:
    """The ordering (heartbeat < stale < dead) is checked by :class:`Timeouts` itself."""
    return Timeouts(
        heartbeat_interval_s=heartbeat_interval_s,
        stale_after_s=stale_after_s if stale_after_s is not None else max(10.0, 5 * heartbeat_interval_s),
        dead_after_s=dead_after_s if dead_after_s is not None else max(60.0, 30 * heartbeat_interval_s),
    )


def _beside_store(store: str, suffix: str) -> Path:
    """Beside an SQLite file; else in the working directory."""
    if store.startswith("sqlite:///") and store != "sqlite:///:memory:":
        return Path(store.removeprefix("sqlite:///")).with_suffix(suffix)
    return Path("corral" + suffix)


def default_seal_key_file(store: str) -> Path:
    return _beside_store(store, ".seal.key")


def default_admin_token_file(store: str) -> Path:
    return _beside_store(store, ".admin-token")


def kept_admin_token(path: Path) -> tuple[str, bool]:
    """The admin token ``corral serve`` keeps across restarts: read from ``path``, or made and written
    there (0600) on the first start. True when it was made now."""
    try:
        kept = path.read_text().strip()
    except FileNotFoundError:
        kept = ""
    if kept:
        return token_or_new(kept, str(path))[0], False
    token = secrets.token_urlsafe(24)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Owner-only from its first byte; a file made meanwhile by another start is not overwritten.
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        f.write(token + "\n")
    return token, True


def default_blob_dir(store: str) -> Path:
    """Where ``corral serve`` keeps images: beside an SQLite file; else in the working directory."""
    if store.startswith("sqlite:///") and store != "sqlite:///:memory:":
        return Path(store.removeprefix("sqlite:///")).with_suffix(".blobs")
    return Path("corral.blobs")


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


def _sandboxes(n: int) -> str:
    return f"{n} sandbox" if n == 1 else f"{n} sandboxes"


def start_hint(url: str, admin: str, generated: bool, token_file: Path | None) -> list[str]:
    """What ``serve`` prints once it listens: the admin token (the first time only), where it is kept,
    and a command that works as pasted."""
    corral = Path(sys.executable).parent / "corral"
    program = shlex.quote(str(corral)) if corral.exists() else "corral"
    lines = []
    if generated:
        lines.append(f"admin token (set CORRAL_TOKEN to choose one): {admin}")
    if token_file is not None:
        lines.append(f"admin token kept in {token_file.resolve()} (0600; the same on every restart)")
        token = f'"$(cat {shlex.quote(str(token_file.resolve()))})"'
    else:
        token = '"$CORRAL_TOKEN"'
    lines.append(f"try:  CORRAL_URL={url} CORRAL_TOKEN={token} {program} burst -n 50")
    return lines


async def serve(opts: ServeOptions, prepare: Prepare | None = None) -> None:
    """All in one: SQLite, the API, and ``opts.hosts`` agents in this process. ``prepare`` runs once
    the store is migrated, before the agents start (a benchmark fills the fleet there)."""
    token_file = opts.admin_token_file or default_admin_token_file(opts.store)
    if opts.admin_token is not None:
        admin, generated = token_or_new(opts.admin_token)
    else:
        admin, generated = kept_admin_token(token_file)
    if opts.agent_token is not None:
        token_or_new(opts.agent_token, "CORRAL_AGENT_TOKEN")
    policy = AdmissionPolicy(headroom_mb=opts.headroom_mb, reserve_floor_mb=opts.reserve_floor_mb)
    timeouts = _timeouts(opts.heartbeat_interval_s, opts.stale_after_s, opts.dead_after_s)
    config = ControlConfig(
        timeouts=timeouts,
        policy=policy,
        k=opts.k,
        max_execs_per_tenant=opts.max_execs_per_tenant,
        max_port_requests_per_sandbox=opts.max_port_requests_per_sandbox,
        max_execs_per_sandbox=opts.max_execs_per_sandbox,  # the same as this process's agents'
        default_create_rate=opts.default_create_rate,
        max_creates_in_flight=opts.max_creates_in_flight,
        domain=opts.domain,
    )
    # The first start makes the key file (0600); every later one, and every replica, reads it.
    sealer = sealer_for(opts.seal_key_file or default_seal_key_file(opts.store), create=True)
    store = open_store(opts.store)
    # Agents in this process are called directly; any that join over the network are enrolled hosts.
    directory = LocalAgents(HttpAgents(store.host_key, shared_token=opts.agent_token))
    # Images in a directory on this machine, unless the store keeps them itself (PostgreSQL).
    blobs = own_blobs(store) or DirBlobStore(default_blob_dir(opts.store))
    plane = build_replica(
        store, directory, config, SystemClock(), random.Random(), sealer=sealer, blobs=blobs
    )
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
    stopped = started = False

    async def shut_down() -> None:
        nonlocal stopped
        if stopped:
            return
        stopped = True
        real = opts.runtime in ("process", "gvisor")  # sandboxes that outlive this process
        keep = opts.keep_sandboxes or not real
        ended = await fleet.stop(stop_sandboxes=not keep)
        if real and started:
            if keep:
                running = sum(len(a.list()) for a in fleet.agents)
                print(
                    f"corral: left {_sandboxes(running)} running; `corral serve` on the same --state-dir "
                    "and --store re-adopts them",
                    flush=True,
                )
            else:
                await fleet.record_stopped(ended)
                print(
                    f"corral: stopped {_sandboxes(len(ended))} (--keep-sandboxes leaves them running for "
                    "the next start to re-adopt)",
                    flush=True,
                )
        await builds.close()
        await plane.stop()
        await store.close()

    builds = local_builds(
        plane,
        opts.build_dir or default_blob_dir(opts.store).with_suffix(".builds"),
        bases_dir=opts.bases_dir,
        network=opts.build_network,
    )
    app = create_app(
        plane,
        manage=False,
        on_shutdown=shut_down,
        metrics_open=opts.metrics_open,
        builds=builds,
        front_proxy=opts.front_proxy.policy if opts.front_proxy else None,
    )
    try:
        # One process owns this store: the admin token it starts with is the only configured one.
        await plane.start(admin_token=admin, agent_token=opts.agent_token, replace_admin_token=True)
        if prepare is not None:
            await prepare(plane, fleet)
        await fleet.start()
        started = True
        # What the runtime no longer runs (a restart after the sandboxes were stopped, a reboot) is
        # stopped in the records before the first request, not seconds later by the reconciler.
        gone = await fleet.correct_records()
        server = listener(app, opts)
        url = f"{'https' if opts.tls_dir else 'http'}://{opts.host}:{opts.port}"
        print(f"corral serving on {url}: {opts.hosts} {opts.runtime} hosts, store {opts.store}", flush=True)
        adopted = sum(len(a.list()) for a in fleet.agents)
        if adopted or gone:
            print(
                f"corral: re-adopted {adopted} running sandboxes; {len(gone)} recorded as stopped", flush=True
            )
        for line in start_hint(url, admin, generated, None if opts.admin_token else token_file):
            print(line, flush=True)
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
    max_port_requests_per_sandbox: int = DEFAULT_PORT_REQUESTS_PER_SANDBOX
    tls_dir: Path | None = None
    default_create_rate: Rate | None = None
    max_creates_in_flight: int = DEFAULT_CREATES_IN_FLIGHT
    domain: str | None = None
    front_proxy: FrontProxyOptions | None = None


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
        max_port_requests_per_sandbox=opts.max_port_requests_per_sandbox,
        default_create_rate=opts.default_create_rate,
        max_creates_in_flight=opts.max_creates_in_flight,
        domain=opts.domain,
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

    app = create_app(
        plane,
        manage=False,
        on_shutdown=shut_down,
        metrics_open=opts.metrics_open,
        front_proxy=opts.front_proxy.policy if opts.front_proxy else None,
    )
    try:
        # Before serving, so a refused configuration (a revoked CORRAL_TOKEN) stops the process.
        await plane.start(admin_token=admin, agent_token=opts.agent_token)
        server = listener(app, opts)
        scheme = "https" if opts.tls_dir else "http"
        print(f"corral api replica {config.replica_id} on {scheme}://{opts.host}:{opts.port}", flush=True)
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
