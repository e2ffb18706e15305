"""``corral agent``: run one host agent (its HTTP API under uvicorn, plus the heartbeat loop).

The main CLI registers it with ``app.command("agent")(agent_command)``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import random
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from corral import listen_options as lo
from corral.agent import credentials
from corral.agent.agent import Agent
from corral.agent.config import AgentConfig
from corral.agent.dns import upstream_of
from corral.agent.http import create_app
from corral.agent.images import HttpImageSource
from corral.agent.netslots import DEFAULT_POOL_SIZE, pool_for
from corral.agent.pressure import PressureSignal, host_signal, sim_signal
from corral.agent.sinks import HttpHeartbeatSink, http_heartbeat_sink
from corral.aio import loop_factory
from corral.clock import SystemClock
from corral.core.admission import AdmissionPolicy
from corral.core.inflight import DEFAULT_EXECS_PER_SANDBOX
from corral.core.listen import ListenBounds
from corral.core.types import AdmissionMode
from corral.images.cache import DEFAULT_IMAGE_CACHE_MB, ImageCache
from corral.images.resolver import ImageResolver
from corral.runtime.base import KeepsDisks, Runtime
from corral.runtime.sim import SimRuntime

if TYPE_CHECKING:
    import uvicorn

log = logging.getLogger("corral.agent")

RUNTIMES = ("sim", "process", "gvisor", "vm")


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) -> (host, port)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise typer.BadParameter(f"expected HOST:PORT, got {listen!r}", param_hint="--listen")
    return host.strip("[]"), int(port)


def build_runtime(
    name: str,
    sandbox_uids: str | None = None,
    state_dir: Path | None = None,
    memory_mb: int | None = None,
    images: ImageResolver | None = None,
) -> Runtime:
    """``memory_mb``: a sim host's physical memory, which its OOM killer guards; ``images``: where the
    process and gvisor runtimes get their images' files (the agent's cache: one count of what
    sandboxes hold)."""
    if name == "sim":
        return SimRuntime(SystemClock(), random.Random(), memory_mb=memory_mb)
    if name == "process":
        # Imported only when asked for: it needs the host's namespaces and cgroups.
        try:
            from corral.runtime.process import ProcessRuntime
        except ImportError as exc:
            raise typer.BadParameter(
                f"the process runtime is not available: {exc}", param_hint="--runtime"
            ) from exc
        from corral.runtime.uids import DEFAULT_UIDS, parse_range

        try:
            uids = parse_range(sandbox_uids) if sandbox_uids else DEFAULT_UIDS
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--sandbox-uids") from exc
        runtime: Runtime = ProcessRuntime(
            root=state_dir, uids=uids, cgroup_prefix=_state_prefix(state_dir), images=images
        )
        return runtime
    if name == "gvisor":
        from corral.runtime.gvisor import GvisorRuntime, unavailable_reason

        if (why := unavailable_reason()) is not None:
            raise typer.BadParameter(f"the gvisor runtime is not available: {why}", param_hint="--runtime")
        return GvisorRuntime(root=state_dir, cgroup_prefix=_state_prefix(state_dir), images=images)
    if name == "vm":
        # Probed, then refused whatever the verdict: no VM runtime is built yet (docs/runtimes.md).
        from corral.runtime import vm

        raise typer.BadParameter(vm.unavailable_reason(), param_hint="--runtime")
    raise typer.BadParameter(
        f"unknown runtime {name!r} (one of {', '.join(RUNTIMES)})", param_hint="--runtime"
    )


def _state_prefix(state_dir: Path | None) -> str:
    """A state directory of its own marks one of several hosts on this machine: so do its cgroups."""
    return (
        "" if state_dir is None else hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:8] + "-"
    )


def host_memory_mb() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def agent_command(
    control_plane: Annotated[
        list[str],
        typer.Option(
            "--control-plane",
            help="Control plane base URL; repeat it (or separate with commas) to name several replicas.",
        ),
    ],
    id: Annotated[
        str | None, typer.Option("--id", help="This agent's id (default: the host named in --token-file).")
    ] = None,
    token_file: Annotated[
        Path | None,
        typer.Option(
            "--token-file",
            help="This host's credentials (mode 0600), from `corral hosts token ID --out FILE`.",
        ),
    ] = None,
    dev_shared_token: Annotated[
        bool,
        typer.Option(
            "--dev-shared-token",
            help="Development only: one token (--token or CORRAL_AGENT_TOKEN) for every host, both ways.",
        ),
    ] = False,
    token: Annotated[
        str | None,
        typer.Option(
            "--token", envvar="CORRAL_AGENT_TOKEN", help="The shared token (only with --dev-shared-token)."
        ),
    ] = None,
    runtime: Annotated[
        str, typer.Option("--runtime", help="sim | process | gvisor | vm (vm: probed, not built yet)")
    ] = "sim",
    memory_mb: Annotated[
        int | None, typer.Option("--memory-mb", min=1, help="Memory to offer (default: the host's).")
    ] = None,
    cpus: Annotated[
        float | None, typer.Option("--cpus", min=0.01, help="CPUs to offer (default: the host's).")
    ] = None,
    listen: Annotated[
        str, typer.Option("--listen", help="HOST:PORT for the agent API (port 0: any free port).")
    ] = "127.0.0.1:7070",
    advertise: Annotated[
        str | None,
        typer.Option("--advertise", help="URL the control plane should call (default: from --listen)."),
    ] = None,
    admission: Annotated[AdmissionMode, typer.Option("--admission")] = AdmissionMode.WORKING_SET,
    max_concurrent_starts: Annotated[int, typer.Option("--max-concurrent-starts", min=1)] = 8,
    max_execs_per_sandbox: Annotated[
        int,
        typer.Option(
            "--max-execs-per-sandbox",
            min=1,
            help="Commands one sandbox may have running through the data plane at once; more are "
            "refused with 429 too_many_concurrent.",
        ),
    ] = DEFAULT_EXECS_PER_SANDBOX,
    heartbeat_interval: Annotated[float, typer.Option("--heartbeat-interval", min=0.05)] = 2.0,
    headroom_mb: Annotated[int, typer.Option("--headroom-mb", min=0)] = 2048,
    template: Annotated[
        list[str] | None, typer.Option("--template", help="A template this host has (repeat; default: any).")
    ] = None,
    sandbox_uids: Annotated[
        str | None,
        typer.Option(
            "--sandbox-uids",
            help="START-END: host uids the process runtime leases to its sandboxes, one each "
            "(default 2000000-2065535; agents on one machine share it safely).",
        ),
    ] = None,
    state_dir: Annotated[
        Path | None,
        typer.Option(
            "--state-dir",
            help="Where the process runtime keeps its sandboxes' records (one directory per agent: "
            "agents sharing a machine must not share it).",
        ),
    ] = None,
    image_cache: Annotated[
        Path | None,
        typer.Option(
            "--image-cache",
            help="Where this host keeps the images it fetched from the control plane (default: "
            "images/ under --state-dir, else ./corral-images-ID).",
        ),
    ] = None,
    image_cache_mb: Annotated[
        int,
        typer.Option(
            "--image-cache-mb",
            min=0,
            help="Disk the image cache keeps within: past it, the least recently used images no "
            "sandbox uses are deleted.",
        ),
    ] = DEFAULT_IMAGE_CACHE_MB,
    network_slots: Annotated[
        int,
        typer.Option(
            "--network-slots",
            min=0,
            help="Network slots kept ready for sandboxes with egress, from the host's first such sandbox on "
            "(a drained pool builds on demand; slots left by an agent that died are reclaimed at start).",
        ),
    ] = DEFAULT_POOL_SIZE,
    dns_upstream: Annotated[
        str | None,
        typer.Option(
            "--dns-upstream",
            help="ADDRESS[:PORT] (IPv4) the resolver of sandboxes with egress forwards the names their "
            "policy allows to (default: the host's first nameserver).",
        ),
    ] = None,
    header_timeout: lo.HeaderTimeout = lo.DEFAULTS.header_timeout_s,
    body_timeout: lo.BodyTimeout = lo.DEFAULTS.body_timeout_s,
    keep_alive_timeout: lo.KeepAliveTimeout = lo.DEFAULTS.keep_alive_s,
    max_connections: lo.MaxConnections = lo.DEFAULTS.max_connections,
    max_connections_per_peer: lo.MaxConnectionsPerPeer = lo.DEFAULTS.max_connections_per_peer,
) -> None:
    """Run a host agent: its HTTP API and its heartbeats to the control plane."""
    id, agent_token, host_key = _identity(id, token_file, dev_shared_token, token)
    host, port = parse_listen(listen)
    bounds = lo.bounds(
        header_timeout, body_timeout, keep_alive_timeout, max_connections, max_connections_per_peer
    )
    total_mb = memory_mb or host_memory_mb() or 4096
    urls = [u.strip() for item in control_plane for u in item.split(",") if u.strip()]
    if not urls:
        raise typer.BadParameter("at least one control-plane URL", param_hint="--control-plane")
    # Images come through the control plane's image route, with this host's own agent token.
    cache_root = image_cache or (state_dir / "images" if state_dir else Path(f"corral-images-{id}"))
    images = ImageCache(cache_root, HttpImageSource(urls, agent_token), image_cache_mb << 20)
    rt = build_runtime(runtime, sandbox_uids, state_dir, total_mb, images)
    total_cpus = cpus or float(os.cpu_count() or 1)
    if headroom_mb >= total_mb:
        raise typer.BadParameter(
            f"headroom ({headroom_mb} MiB) leaves nothing of {total_mb} MiB to admit",
            param_hint="--headroom-mb",
        )
    signal: PressureSignal | None = None
    if runtime in ("process", "gvisor"):
        signal = host_signal()
    elif isinstance(rt, SimRuntime):
        signal = sim_signal(rt.memory_used_ratio)
    address = advertise or _url(host, port)
    sink = http_heartbeat_sink(urls, agent_token)
    config = AgentConfig(
        id,
        total_mb,
        total_cpus,
        admission=admission,
        policy=AdmissionPolicy(headroom_mb=headroom_mb),
        max_concurrent_starts=max_concurrent_starts,
        max_execs_per_sandbox=max_execs_per_sandbox,
        templates=template or None,
        heartbeat_interval_s=heartbeat_interval,
        address=address,
    )
    slots = None
    if runtime == "process":
        from corral.runtime.process import DEFAULT_ROOT

        slots = pool_for(rt, state_dir or DEFAULT_ROOT, network_slots, _upstream(dns_upstream))
    agent = Agent(config, rt, pressure=signal, sink=sink, images=images, netslots=slots)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(_serve(agent, host_key, host, port, advertise, bounds))


def _identity(
    id: str | None, token_file: Path | None, dev_shared_token: bool, token: str | None
) -> tuple[str, str, str]:
    """(host id, token the agent presents, key it expects) from the enrolment file, or in the
    development mode, one shared token for both directions."""
    if dev_shared_token:
        if token_file is not None:
            raise typer.BadParameter("either --token-file or --dev-shared-token", param_hint="--token-file")
        if not token:
            raise typer.BadParameter(
                "--dev-shared-token needs --token or CORRAL_AGENT_TOKEN", param_hint="--token"
            )
        if not id:
            raise typer.BadParameter("--dev-shared-token needs --id", param_hint="--id")
        return id, token, token
    if token_file is None:
        raise typer.BadParameter(
            "an agent needs its host's credentials: enrol it (`corral hosts token ID --out FILE`) "
            "and pass --token-file FILE",
            param_hint="--token-file",
        )
    try:
        creds = credentials.load(token_file)
    except credentials.BadCredentials as exc:
        raise typer.BadParameter(str(exc), param_hint="--token-file") from None
    if id is not None and id != creds.host_id:
        raise typer.BadParameter(f"--id {id} but the credentials are for {creds.host_id}", param_hint="--id")
    return creds.host_id, creds.agent_token, creds.host_key


def _url(host: str, port: int) -> str:
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}"


def agent_server(agent: Agent, host_key: str, host: str, port: int, bounds: ListenBounds) -> uvicorn.Server:
    """The agent's API under its listener's bounds. The control plane is its one caller: no bound
    per token here."""
    import uvicorn

    from corral.listener import uvicorn_config

    app = create_app(agent, host_key)
    return uvicorn.Server(
        uvicorn_config(app, host, port, bounds, front=app.state.port_splicer, log_level="warning")
    )


async def _serve(
    agent: Agent, host_key: str, host: str, port: int, advertise: str | None, bounds: ListenBounds
) -> None:
    server = agent_server(agent, host_key, host, port, bounds)
    # Adopt before accepting any start, so a restarted agent never starts a twin of what still runs.
    adopted = await agent.adopt()
    serving = asyncio.create_task(server.serve())
    while not server.started and not serving.done():
        await asyncio.sleep(0.01)
    if serving.done():  # could not bind: surface uvicorn's own error
        await serving
        return
    if advertise is None:
        # With --listen HOST:0 the kernel chose the port: publish the real one (tests find it here).
        bound = server.servers[0].sockets[0].getsockname()[1] if server.servers else port
        agent.address = _url(host, bound)
    log.info(
        "agent %s listening on %s: %d sandboxes adopted, runtime %s",
        agent.id,
        agent.address,
        adopted,
        agent.runtime.name,
    )
    beats = asyncio.create_task(agent.run_heartbeats())
    warm = asyncio.create_task(agent.run_warm())
    if agent.netslots is not None:
        agent.netslots.refill()
    try:
        await serving
    finally:
        beats.cancel()
        warm.cancel()
        await asyncio.gather(beats, warm, return_exceptions=True)
        if agent.netslots is not None:
            await agent.netslots.close()
        if isinstance(agent.runtime, KeepsDisks):
            await agent.runtime.drain_disks()  # the ready ones; those in use stay with their sandboxes
        sink = agent.sink
        if isinstance(sink, HttpHeartbeatSink):
            await sink.aclose()


__all__ = ["agent_command", "agent_server", "parse_listen"]


def _upstream(text: str | None) -> tuple[str, int] | None:
    if text is None:
        return None
    try:
        return upstream_of(text)
    except ValueError as exc:
        raise typer.BadParameter(f"{text!r}: {exc}", param_hint="--dns-upstream") from None
