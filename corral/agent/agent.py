"""The host agent: a runtime behind a local admission gate, a starts limiter and a pressure gate, publishing
what the host can still admit. The last line of defence, and the only one that still works when the
scheduler is the problem (a burst every replica sent to the same host, a retry storm, a buggy client).

The gate's arithmetic is the core's (:func:`corral.core.admission.admittable_mb` and ``fits``); the number
the agent publishes is the same function's result, so the scheduler reads a verdict instead of re-deriving
a formula. The agent is free of HTTP: :mod:`corral.agent.http` wraps it, :mod:`corral.agent.client` calls it.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import dataclasses
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping

from corral.agent.beats import SETTLE_SAMPLE_S, EarlyBeat, HeartbeatBuilder, ReadingTurns
from corral.agent.commands import Commands, Follower
from corral.agent.config import AgentConfig
from corral.agent.errors import (
    AgentBusy,
    AgentConflict,
    AgentError,
    AgentInvalid,
    AgentRefusal,
    AgentRuntimeError,
    AgentSandboxNotFound,
)
from corral.agent.execstream import ExecStream, oom_verdict
from corral.agent.fence import RunFence
from corral.agent.inputs import MAX_IMAGES_PER_HOST
from corral.agent.keeper import WarmKeeper
from corral.agent.limiter import StartsLimiter, StartsSaturated
from corral.agent.live import Live, LiveSet
from corral.agent.netns import netns_path
from corral.agent.netslots import SlotPool, SlotsUnavailable
from corral.agent.pressure import PressureSignal, PressureSource, usage_ratio_signal
from corral.agent.protocol import (
    ROLE_OWNED,
    AgentHeartbeat,
    Capacity,
    ClaimWarm,
    EgressPolicyBody,
    ExecRequest,
    HeartbeatReply,
    MemorySample,
    SandboxInfo,
    SandboxSamples,
    StartSandbox,
    WarmTarget,
)
from corral.agent.sinks import HeartbeatSink
from corral.agent.warm import WarmBook
from corral.clock import SystemClock
from corral.codes import ErrorCode
from corral.core.admission import AdmissionBook, charge_mb, fits, request_charge_mb
from corral.core.clock import Clock
from corral.core.inflight import BUSY_RETRY_S, InFlight
from corral.core.netpolicy import NO_NETWORK, EgressPolicy, PolicyError
from corral.core.pressure import PressureGate
from corral.core.settle import DEFAULT_SETTLE_S, SettleRule
from corral.core.types import AdmissionMode, CreateRequest, SandboxUsage
from corral.exec_result import ExecResult
from corral.images.cache import ImageCache, ImageUnavailable
from corral.runtime.base import (
    InvalidSandbox,
    Reboots,
    Runtime,
    RuntimeFailure,
    SandboxHandle,
    SandboxNotFound,
    SandboxPaused,
    SandboxSpec,
)
from corral.runtime.stream import Spawned
from corral.shapes.commands import CommandInfo, CommandList, CommandOutput

log = logging.getLogger("corral.agent")

# Honest Retry-After estimates, per reason.
STARTS_SATURATED_RETRY_S = 1.0  # a start takes a fraction of a second: a slot frees up soon
PRESSURE_RETRY_S = 10.0  # the PSI window the gate reads is ten seconds wide
START_FAILED_RETRY_S = 1.0
IMAGE_RETRY_S = 1.0  # another host may have it, or the next transfer may arrive whole


class Agent:
    """One host's agent: how it is set (``config``: the host's id and size, its bounds and its
    policy, :class:`AgentConfig`) and what it is wired to (``runtime`` and the keywords).
    ``pressure`` is a :class:`PressureSignal` or a bare callable read on the usage-ratio scale (None:
    the sandboxes' measured memory over the host's); ``sink`` receives every heartbeat; ``images`` is
    the host's image cache (None: a start that names an image leaves it to the runtime).

    Every state change happens on the event loop without an ``await`` between the check and the commit,
    so the gate needs no lock.
    """

    def __init__(
        self,
        config: AgentConfig,
        runtime: Runtime,
        *,
        clock: Clock | None = None,
        pressure: PressureSignal | PressureSource | None = None,
        pressure_gate: PressureGate | None = None,
        sink: HeartbeatSink | None = None,
        images: ImageCache | None = None,
        netslots: SlotPool | None = None,
        lease_clock: Callable[[], float] | None = None,
    ) -> None:
        self.config = config
        self.id = config.id
        self.runtime = runtime
        self.memory_mb_total = config.memory_mb_total
        self.cpu_total = config.cpu_total
        self.admission = AdmissionMode(config.admission)
        self.policy = config.policy
        self.clock: Clock = clock or SystemClock()
        self.templates = None if config.templates is None else frozenset(config.templates)
        self.heartbeat_interval_s = config.heartbeat_interval_s
        self.sink = sink
        # Network slots for sandboxes whose egress policy needs an interface (None: this host has none).
        self.netslots = netslots
        self.address = config.address
        self.settle_s = (
            float(getattr(runtime, "memory_settle_s", DEFAULT_SETTLE_S))
            if config.settle_s is None
            else config.settle_s
        )
        self.settle_rule = SettleRule(self.settle_s)
        self.gpu = config.gpu
        self.role = config.role
        self.stream_restore = config.stream_restore
        self.limiter = StartsLimiter(config.max_concurrent_starts, config.start_wait_s)
        self.execs = InFlight("sandbox", config.max_execs_per_sandbox)
        self.signal = self._signal(pressure)
        self.gate = pressure_gate or self.signal.gate()

        self._live = LiveSet(AdmissionBook(config.memory_mb_total, self.admission, self.policy))
        # Each live sandbox of an image holds it in the cache (no eviction) until it leaves the set.
        self.images = images
        self._image_holders: set[str] = set()
        self._live.on_gone = self._gone
        # Background commands, kept running after the request that started them until they end.
        self.commands = Commands(self.clock)
        # Each sandbox's secrets, in memory only: never in the runtime's records on disk.
        self._secrets: dict[str, dict[str, str]] = {}
        # Adopted sandboxes whose secrets the control plane has not sent again yet.
        self._restore: set[str] = set()
        self._starting: dict[str, int] = {}  # id -> memory charged while its start is in flight
        self._stopping: dict[str, asyncio.Task[None]] = {}
        self._background: set[asyncio.Task[None]] = set()  # held so they are not collected mid-flight
        self._oom_ids: set[str] = set()  # sandboxes with OOM kills: the heartbeat's sparse map
        # Seeded from the clock so that a restarted agent's sequence still moves forward.
        self.beats = HeartbeatBuilder(config.id, int(self.clock.now() * 1000))
        # The run lease each reply renews, on a monotonic clock (``lease_clock``: a test's).
        self.fence = RunFence(
            config.id, runtime, self._live, self._fence_stop, self._paused, lease_clock or time.monotonic
        )
        self.early = EarlyBeat()
        self._turns = ReadingTurns()
        self.refusals: dict[str, int] = {}
        self.warm = WarmBook()
        self.keeper = WarmKeeper(self, config.warm_starts_per_round, config.warm_fill_interval_s)
        self.heartbeats_sent = 0
        self.heartbeat_failures = 0
        self.oom_kills_total = 0  # over every sandbox this agent has run, gone ones included

    @property
    def _seq(self) -> int:
        """The last heartbeat's sequence number."""
        return self.beats.seq

    def _signal(self, pressure: PressureSignal | PressureSource | None) -> PressureSignal:
        if isinstance(pressure, PressureSignal):
            return pressure
        if pressure is not None:
            return usage_ratio_signal(pressure, "injected")
        # No host signal given: judge by what the agent's own sandboxes are measured to hold.
        return usage_ratio_signal(self.used_ratio, "sandbox_resident_ratio")

    # -- accounting -------------------------------------------------------------------------------

    @property
    def pending_mb(self) -> int:
        """Memory charged to starts in flight: the gate's ``pending``."""
        return sum(self._starting.values())

    def usages(self) -> list[SandboxUsage]:
        return [s.usage for s in self._live.values()]

    def admittable_mb(self) -> int:
        """What the host can still admit before the starts in flight: the number a heartbeat publishes
        (the core's ``admittable_mb``, kept incrementally by its ``AdmissionBook``)."""
        return self._live.book.admittable()

    def memory_mb_used(self) -> int:
        return self._live.observed_mb

    def used_ratio(self) -> float:
        return self.memory_mb_used() / self.memory_mb_total

    def _count_refusal(self, code: str) -> None:
        self.refusals[code] = self.refusals.get(code, 0) + 1

    def _refuse(self, code: str, message: str, retry_after_s: float, **details: object) -> AgentRefusal:
        self._count_refusal(code)
        return AgentRefusal(code, message, retry_after_s, details)

    def observe_pressure(self) -> bool:
        """Feed the gate one reading; returns whether intake is open."""
        try:
            value = self.signal.read()
        except Exception:  # a broken reading must not take the agent down; the gate keeps its state
            log.exception("pressure signal %s failed", self.signal.name)
            value = None
        return self.gate.is_open if value is None else self.gate.observe(value)

    def _check_pressure(self) -> None:
        if not self.observe_pressure():
            raise self._refuse(
                ErrorCode.HOST_MEMORY_PRESSURE,
                f"host memory pressure ({self.signal.name}) is above {self.gate.close_at:g}; intake is "
                f"closed until it falls below {self.gate.open_at:g}",
                PRESSURE_RETRY_S,
                signal=self.signal.name,
                close_at=self.gate.close_at,
                open_at=self.gate.open_at,
            )

    def _check_fits(self, req: CreateRequest) -> None:
        admittable, pending = self.admittable_mb(), self.pending_mb
        if not fits(admittable, pending, req, self.admission, self.policy) and not self.keeper.evict_for(req):
            need = request_charge_mb(req, self.admission, self.policy)
            raise self._refuse(
                ErrorCode.HOST_DOES_NOT_FIT,
                f"needs {need} MiB ({self.admission.value}); {admittable - pending} MiB admittable",
                self.heartbeat_interval_s,
                needed_mb=need,
                admittable_mb=admittable,
                pending_mb=pending,
                admission=self.admission.value,
            )

    def _check_template(self, req: StartSandbox) -> None:
        if self.templates is not None and req.template is not None and req.template not in self.templates:
            raise AgentInvalid(
                ErrorCode.TEMPLATE_MISSING,
                f"template {req.template!r} is not on this host",
                details={"field": "template", "templates": sorted(self.templates)},
            )

    # -- warm sandboxes -----------------------------------------------------------------------------

    def _in_background(self, coro: Awaitable[None]) -> None:
        async def run() -> None:
            try:
                await coro
            except Exception as exc:  # a stop that failed is found again by the next round
                log.info("agent %s: background work failed: %r", self.id, exc)

        task = asyncio.get_running_loop().create_task(run())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def set_warm_targets(self, targets: Iterable[WarmTarget]) -> None:
        targets = builtins.list(targets)
        self.warm.set_targets(targets)
        self._prefetch_images(targets)

    def claim(self, template: str, req: ClaimWarm) -> SandboxInfo:
        """Hand over one ready warm sandbox (see :meth:`WarmKeeper.claim`)."""
        return self.keeper.claim(template, req)

    def replenish(self) -> int:
        """One refill round toward the warm targets (see :meth:`WarmKeeper.replenish`)."""
        return self.keeper.replenish()

    async def run_warm(self) -> None:
        await self.keeper.run()

    # -- operations -------------------------------------------------------------------------------

    async def start(self, req: StartSandbox) -> SandboxInfo:
        """Admit and start one sandbox, or refuse with a stable code. Never queues for long."""
        self._check_template(req)
        existing = self._live.get(req.id)
        if existing is not None and existing.spec.epoch < req.epoch:
            # The copy here is an older epoch's: the control plane has given this id a newer epoch on
            # this host, so the stale copy goes and the new one starts. Answering the start as already
            # done would leave the old copy running under a record that routes only the new epoch.
            await self.stop(req.id)
            existing = self._live.get(req.id)
        if existing is not None:
            if existing.spec.epoch == req.epoch and _same(existing.spec, req):
                return self._info(req.id, existing)  # a retried start: the sandbox is already here
            raise AgentConflict(ErrorCode.SANDBOX_EXISTS, f"sandbox {req.id!r} already exists")
        if req.id in self._starting:
            raise AgentConflict(ErrorCode.SANDBOX_EXISTS, f"sandbox {req.id!r} is already starting")
        creq = CreateRequest(memory_mb=req.memory_mb, cpu=req.cpus, stateful=req.stateful)
        self._check_pressure()
        # A host that lacks the image fetches it before taking a start slot: a transfer waits on the
        # network, and concurrent creates of the image wait on this one transfer, not on the slots.
        await self._fetch_image(req.image)
        if self.limiter.saturated:
            # A refusal that is already certain must not wait for a slot first.
            self._check_fits(creq)
        try:
            await self.limiter.acquire()
        except StartsSaturated as exc:
            raise self._refuse(
                ErrorCode.HOST_STARTS_SATURATED,
                str(exc),
                STARTS_SATURATED_RETRY_S,
                in_flight=self.limiter.in_flight,
                limit=self.limiter.limit,
            ) from None
        try:
            # Re-check: anything may have changed while this start waited for its slot.
            if req.id in self._live or req.id in self._starting:
                raise AgentConflict(ErrorCode.SANDBOX_EXISTS, f"sandbox {req.id!r} already exists")
            self._check_pressure()
            self._check_fits(creq)
            return await self._run_start(req, creq)
        finally:
            self.limiter.release()

    async def _run_start(self, req: StartSandbox, creq: CreateRequest) -> SandboxInfo:
        spec = req.spec()
        egress = _egress(req)
        self._starting[req.id] = request_charge_mb(creq, self.admission, self.policy)
        held = False
        try:
            held = await self._hold_image(req.image)
            handle = await self._start_attached(spec, egress)
        except SlotsUnavailable as exc:
            if held and req.image is not None and self.images is not None:
                self.images.release(req.image)
            raise self._refuse(ErrorCode.START_FAILED, str(exc), START_FAILED_RETRY_S) from exc
        except InvalidSandbox as exc:
            raise AgentInvalid(ErrorCode.INVALID_REQUEST, str(exc), details={"field": exc.field}) from exc
        except RuntimeFailure as exc:
            raise self._refuse(
                ErrorCode.START_FAILED, f"runtime {self.runtime.name}: {exc}", START_FAILED_RETRY_S
            ) from exc
        except asyncio.CancelledError:
            # The caller went away mid-start: make sure nothing half-started stays behind unaccounted.
            reaper = asyncio.get_running_loop().create_task(self._reap(req.id))
            self._background.add(reaper)
            reaper.add_done_callback(self._background.discard)
            raise
        except BaseException:
            if held and req.image is not None and self.images is not None:
                self.images.release(req.image)
            raise
        finally:
            del self._starting[req.id]
        live = self._live[req.id] = Live(handle.spec, handle.started_at)
        if held:
            self._image_holders.add(req.id)
        if req.secrets:
            self._secrets[req.id] = dict(req.secrets)
        return self._info(req.id, live)

    # -- images ------------------------------------------------------------------------------------

    async def _fetch_image(self, digest: str | None) -> None:
        if digest is None or self.images is None:
            return
        try:
            await self.images.fetch(digest)
        except ImageUnavailable as exc:
            raise self._refuse(ErrorCode.IMAGE_UNAVAILABLE, str(exc), IMAGE_RETRY_S, image=digest) from exc

    async def _hold_image(self, digest: str | None) -> bool:
        """Count the starting sandbox as a user of its image (fetched now when it is not here yet, as
        for a warm start). False when there is nothing to hold."""
        if digest is None or self.images is None:
            return False
        try:
            await self.images.local_path(digest)
        except ImageUnavailable as exc:
            raise self._refuse(ErrorCode.IMAGE_UNAVAILABLE, str(exc), IMAGE_RETRY_S, image=digest) from exc
        return True

    def _gone(self, sandbox_id: str, live: Live) -> None:
        """What a sandbox held goes with it, whatever removed it from the live set."""
        self._image_gone(sandbox_id, live)
        self.commands.forget(sandbox_id)

    def _image_gone(self, sandbox_id: str, live: Live) -> None:
        if sandbox_id in self._image_holders:
            self._image_holders.discard(sandbox_id)
            if live.spec.image is not None and self.images is not None:
                self.images.release(live.spec.image)

    def held_images(self) -> builtins.list[str]:
        """The digests a heartbeat names: the images on this host's disk, most recently used first."""
        return [] if self.images is None else self.images.held(MAX_IMAGES_PER_HOST)

    def _prefetch_images(self, targets: Iterable[WarmTarget]) -> None:
        """Warm targets' images the host lacks are fetched ahead, before their first warm start."""
        if self.images is None:
            return
        for digest in {t.image for t in targets if t.image is not None and t.target > 0}:
            if not self.images.has(digest):
                self._in_background(self._prefetch(digest))

    async def _prefetch(self, digest: str) -> None:
        assert self.images is not None
        await self.images.prefetch(digest)

    async def _start_attached(self, spec: SandboxSpec, egress: EgressPolicy) -> SandboxHandle:
        """The runtime's start, in a network slot of its own when ``egress`` needs an interface."""
        self._check_names(egress)
        if egress.attached and self.netslots is not None:
            slot = await self.netslots.take(spec.id, egress)
            served = self.netslots.resolver is not None
            spec = dataclasses.replace(
                spec, netns=netns_path(slot), nameserver=str(slot.host_ip) if served else None
            )
        elif egress.attached and self.runtime.name != "sim":  # the simulator runs nothing to attach
            raise SlotsUnavailable(f"host {self.id} has no network slots (egress {egress.mode!r})")
        try:
            return await self.runtime.start(spec)
        except asyncio.CancelledError:
            raise  # the reaper gives its slot back once the runtime has torn it down
        except BaseException:
            await asyncio.shield(self._detach(spec.id))
            raise

    async def _detach(self, sandbox_id: str) -> None:
        """Return a gone sandbox's network slot (scrubbed) to the pool, if it had one."""
        if self.netslots is not None:
            await self.netslots.give_back(sandbox_id)

    async def set_egress(self, sandbox_id: str, body: EgressPolicyBody, epoch: int | None = None) -> None:
        """Replace a running sandbox's egress policy in one transaction. Mode "none" on a sandbox with
        a slot closes it (the interface stays, nothing passes); a policy that needs an interface, for a
        sandbox started without one, is refused: a running sandbox is not moved to another namespace."""
        self._check_epoch(sandbox_id, epoch)
        self._require(sandbox_id)
        egress = _parse_egress(body)
        self._check_names(egress)
        if self.netslots is not None and self.netslots.slot_of(sandbox_id) is not None:
            await self.netslots.apply(sandbox_id, egress)
        elif egress.attached and self.runtime.name != "sim":
            raise AgentConflict(
                ErrorCode.NETWORK_NOT_ATTACHED,
                f"sandbox {sandbox_id!r} was started without a network interface (egress 'none')",
            )

    def _check_names(self, egress: EgressPolicy) -> None:
        """A policy naming hosts needs this host's resolver to hold them (the simulator runs nothing)."""
        served = self.netslots is not None and self.netslots.resolver is not None
        if egress.allow_hosts and not served and self.runtime.name != "sim":
            raise AgentInvalid(ErrorCode.NETWORK_HOSTNAMES_UNSUPPORTED, _NO_RESOLVER.format(self.id))

    def port_address(self, sandbox_id: str, epoch: int | None = None) -> str:
        """The address a running sandbox's ports are reached at from this host: its slot's. A
        sandbox without a slot (egress "none": loopback only) has no port anyone can reach."""
        self._check_epoch(sandbox_id, epoch)
        self._require(sandbox_id)
        slot = self.netslots.slot_of(sandbox_id) if self.netslots is not None else None
        if slot is None:
            raise AgentConflict(
                ErrorCode.NETWORK_NOT_ATTACHED,
                f"sandbox {sandbox_id!r} has no network interface (egress 'none'): its ports are "
                "reached only with a network policy of mode 'internet' (deny_out 0.0.0.0/0 keeps it offline)",
            )
        return str(slot.sandbox_ip)

    async def _reap(self, sandbox_id: str) -> None:
        # Never started, or already gone: either way nothing is left.
        with contextlib.suppress(RuntimeFailure, SandboxNotFound):
            await self.runtime.stop(sandbox_id)
        await self._detach(sandbox_id)

    def _check_epoch(self, sandbox_id: str, epoch: int | None) -> None:
        """A call routed to another epoch of this id than the copy here is refused: one of the two is
        stale, and a stale copy must never answer."""
        live = self._live.get(sandbox_id)
        if epoch is not None and live is not None and live.spec.epoch != epoch:
            raise AgentConflict(
                ErrorCode.STALE_EPOCH,
                f"sandbox {sandbox_id!r} here is epoch {live.spec.epoch}, the call is for epoch {epoch}",
            )

    async def stop(self, sandbox_id: str, epoch: int | None = None) -> None:
        self._check_epoch(sandbox_id, epoch)
        task = self._stopping.get(sandbox_id)
        if task is None:
            if sandbox_id in self._starting:
                # Not now: once its start returns it can be stopped like any other.
                raise self._refuse(
                    ErrorCode.SANDBOX_STARTING,
                    f"sandbox {sandbox_id!r} is still starting",
                    STARTS_SATURATED_RETRY_S,
                )
            if sandbox_id not in self._live:
                raise AgentSandboxNotFound(message=f"no sandbox {sandbox_id!r} on this host")
            self.warm.take_ready(sandbox_id)  # no claim may take it while it stops
            task = asyncio.get_running_loop().create_task(self._stop(sandbox_id))
            self._stopping[sandbox_id] = task
            task.add_done_callback(lambda _t: self._stopping.pop(sandbox_id, None))
        # Shielded: a caller that gives up must not leave a stop half-done.
        await asyncio.shield(task)

    async def _stop(self, sandbox_id: str) -> None:
        try:
            await self.runtime.stop(sandbox_id)
        except SandboxNotFound:
            pass  # it is gone either way
        except RuntimeFailure as exc:
            # Still there as far as we know: keep charging for it.
            raise AgentRuntimeError(message=f"runtime {self.runtime.name}: {exc}") from exc
        self._live.pop(sandbox_id, None)
        self._secrets.pop(sandbox_id, None)
        self.warm.forget(sandbox_id)
        await self._detach(sandbox_id)

    def enter(self, sandbox_id: str) -> None:
        """Take one of the sandbox's command slots, or refuse with 429 ``too_many_concurrent``. Every
        command the data plane runs in a sandbox holds one from before it is started until it has
        exited (hand it back with :meth:`leave`): a bound at the agent holds whichever replica
        forwarded the call, and wherever the command runs."""
        busy = self.execs.enter(sandbox_id)
        if busy is not None:
            self._count_refusal(ErrorCode.TOO_MANY_CONCURRENT)
            raise AgentBusy(ErrorCode.TOO_MANY_CONCURRENT, busy.message, BUSY_RETRY_S, busy.details())

    def leave(self, sandbox_id: str) -> None:
        self.execs.leave(sandbox_id)

    async def exec(self, sandbox_id: str, req: ExecRequest, epoch: int | None = None) -> ExecResult:
        if sandbox_id not in self._live:
            raise AgentSandboxNotFound(message=f"no sandbox {sandbox_id!r} on this host")
        self._check_epoch(sandbox_id, epoch)
        self.enter(sandbox_id)
        try:
            return await self._exec(sandbox_id, req)
        finally:
            self.leave(sandbox_id)

    def _exec_env(self, sandbox_id: str, req: ExecRequest) -> Mapping[str, str]:
        claimed_env = self.warm.env(sandbox_id)
        secrets = self._secrets.get(sandbox_id)
        env = {**claimed_env, **req.env} if claimed_env else req.env
        return {**secrets, **env} if secrets else env

    @contextlib.contextmanager
    def _runtime_errors(self, sandbox_id: str) -> Iterator[None]:
        """The runtime's refusals of a command, as the agent answers them."""
        try:
            yield
        except SandboxNotFound:
            self._live.pop(sandbox_id, None)  # it died under us; stop accounting for it
            raise AgentSandboxNotFound(message=f"sandbox {sandbox_id!r} is gone") from None
        except InvalidSandbox as exc:
            # What the kernel would refuse (E2BIG, a NUL it would cut) is the caller's input.
            raise AgentInvalid(ErrorCode.INVALID_REQUEST, str(exc), details={"field": exc.field}) from exc
        except SandboxPaused as exc:
            raise AgentConflict(ErrorCode.SANDBOX_PAUSED, str(exc)) from exc
        except RuntimeFailure as exc:
            raise AgentRuntimeError(message=f"runtime {self.runtime.name}: {exc}") from exc

    async def oom_kills_of(self, sandbox_id: str) -> int:
        """The sandbox's OOM kills so far, read now (0 when the runtime cannot tell)."""
        try:
            return await self.runtime.oom_kills(sandbox_id)
        except (RuntimeFailure, OSError):
            return 0

    async def _exec(self, sandbox_id: str, req: ExecRequest) -> ExecResult:
        env = self._exec_env(sandbox_id, req)
        before = await self.oom_kills_of(sandbox_id)
        with self._runtime_errors(sandbox_id):
            r = await self.runtime.exec(
                sandbox_id, req.command, timeout_s=req.timeout_s, env=env, cwd=req.cwd
            )
        return oom_verdict(r, before, await self.oom_kills_of(sandbox_id))

    async def exec_stream(self, sandbox_id: str, req: ExecRequest, epoch: int | None = None) -> ExecStream:
        """Start a command whose output is read as it comes; it holds one of the sandbox's command
        slots until it has ended or been killed (``ExecStream.aclose``)."""
        spawned, before = await self._spawn_held(sandbox_id, req, epoch)
        return ExecStream(
            spawned,
            req.timeout_s,
            oom_kills=lambda: self.oom_kills_of(sandbox_id),
            oom_kills_before=before,
            release=lambda: self.leave(sandbox_id),
        )

    async def _spawn_held(self, sandbox_id: str, req: ExecRequest, epoch: int | None) -> tuple[Spawned, int]:
        """Take one of the sandbox's command slots and start ``req`` in it: the command, and the
        sandbox's OOM kills before it. The slot is the caller's to hand back (:meth:`leave`)."""
        if sandbox_id not in self._live:
            raise AgentSandboxNotFound(message=f"no sandbox {sandbox_id!r} on this host")
        self._check_epoch(sandbox_id, epoch)
        self.enter(sandbox_id)
        try:
            env = self._exec_env(sandbox_id, req)
            before = await self.oom_kills_of(sandbox_id)
            with self._runtime_errors(sandbox_id):
                spawned = await self.runtime.spawn(sandbox_id, req.command, env=env, cwd=req.cwd)
        except BaseException:
            self.leave(sandbox_id)
            raise
        return spawned, before

    # -- background commands (see corral.agent.commands) --------------------------------------------

    async def start_command(self, sandbox_id: str, req: ExecRequest, epoch: int | None = None) -> CommandInfo:
        """Start a command that outlives this call: it holds one of the sandbox's command slots until
        it has ended (by itself, at its timeout, killed, or with its sandbox)."""
        spawned, before = await self._spawn_held(sandbox_id, req, epoch)
        if sandbox_id not in self._live:  # stopped while it was being spawned: nothing would end it
            spawned.signal(signal.SIGKILL)
            self.leave(sandbox_id)
            raise AgentSandboxNotFound(message=f"sandbox {sandbox_id!r} is gone")
        command = self.commands.start(
            sandbox_id,
            builtins.list(req.command),
            spawned,
            req.timeout_s,
            oom_kills=lambda: self.oom_kills_of(sandbox_id),
            oom_kills_before=before,
            release=lambda: self.leave(sandbox_id),
        )
        return command.info()

    def _commands_of(self, sandbox_id: str, epoch: int | None) -> None:
        self._check_epoch(sandbox_id, epoch)
        self._require(sandbox_id)

    def list_commands(self, sandbox_id: str, epoch: int | None = None) -> CommandList:
        self._commands_of(sandbox_id, epoch)
        return self.commands.list(sandbox_id)

    async def command(
        self, sandbox_id: str, pid: int, epoch: int | None = None, wait_s: float = 0.0
    ) -> CommandInfo:
        """Its state; with ``wait_s``, once it has ended or after that long."""
        self._commands_of(sandbox_id, epoch)
        return await self.commands.wait(sandbox_id, pid, wait_s)

    def command_output(self, sandbox_id: str, pid: int, epoch: int | None = None) -> CommandOutput:
        self._commands_of(sandbox_id, epoch)
        return self.commands.get(sandbox_id, pid).output()

    def follow_command(self, sandbox_id: str, pid: int, epoch: int | None = None) -> Follower:
        """Its kept output, then its output as it comes, then how it ended. Closing it never ends it."""
        self._commands_of(sandbox_id, epoch)
        return self.commands.follow(sandbox_id, pid)

    async def kill_command(self, sandbox_id: str, pid: int, epoch: int | None = None) -> CommandInfo:
        self._commands_of(sandbox_id, epoch)
        return await self.commands.kill(sandbox_id, pid)

    async def pause(self, sandbox_id: str, *, memory: bool = True) -> SandboxInfo:
        """Freeze the sandbox in place. It keeps its memory and its charge: resuming is not a start.
        Without ``memory``, its processes are ended first (its files kept): its resume is a reboot."""
        return await self._set_paused(sandbox_id, True, memory)

    async def resume(self, sandbox_id: str, *, memory: bool = True) -> SandboxInfo:
        """Thaw the sandbox; without ``memory``, as a boot from its files: its processes end first."""
        return await self._set_paused(sandbox_id, False, memory)

    async def _set_paused(self, sandbox_id: str, paused: bool, memory: bool) -> SandboxInfo:
        live = self._require(sandbox_id)
        if self._paused(sandbox_id) == paused:
            code = ErrorCode.SANDBOX_PAUSED if paused else ErrorCode.SANDBOX_NOT_PAUSED
            raise AgentConflict(code, f"sandbox {sandbox_id!r} is {'already' if paused else 'not'} paused")
        if not memory:
            await self._call_runtime(self._reboot, sandbox_id)
        await self._call_runtime(self.runtime.pause if paused else self.runtime.resume, sandbox_id)
        live.paused = paused
        return self._info(sandbox_id, live)

    async def _reboot(self, sandbox_id: str) -> None:
        if not isinstance(self.runtime, Reboots):
            raise RuntimeFailure(
                f"the {self.runtime.name} runtime cannot end a sandbox's processes and keep its files"
            )
        await self.runtime.reboot(sandbox_id)

    def _require(self, sandbox_id: str) -> Live:
        live = self._live.get(sandbox_id)
        if live is None:
            raise AgentSandboxNotFound(message=f"no sandbox {sandbox_id!r} on this host")
        return live

    def _paused(self, sandbox_id: str) -> bool:
        try:
            return self.runtime.paused(sandbox_id)
        except SandboxNotFound:
            return False

    async def _call_runtime(self, op: Callable[[str], Awaitable[None]], sandbox_id: str) -> None:
        try:
            await op(sandbox_id)
        except SandboxNotFound:
            self._live.pop(sandbox_id, None)
            raise AgentSandboxNotFound(message=f"sandbox {sandbox_id!r} is gone") from None
        except RuntimeFailure as exc:
            raise AgentRuntimeError(message=f"runtime {self.runtime.name}: {exc}") from exc

    async def samples(self, sandbox_id: str, start: float, end: float) -> SandboxSamples:
        """The sandbox's memory readings from ``start`` to ``end`` (unix seconds, both included). A
        running sandbox not read within the sampling interval is read now first, so a range that
        reaches the present ends with a reading of the present."""
        live = self._require(sandbox_id)
        if not live.paused and live.samples.due(self.clock.now()):
            await self.measure([sandbox_id])
        return SandboxSamples(
            samples=[MemorySample(at=s.at, memory_mb=s.memory_mb) for s in live.samples.between(start, end)]
        )

    def spec_of(self, sandbox_id: str) -> SandboxSpec:
        """What the sandbox was started as (its image, its user...)."""
        return self._require(sandbox_id).spec

    def get(self, sandbox_id: str) -> SandboxInfo:
        live = self._live.get(sandbox_id)
        if live is None:
            raise AgentSandboxNotFound(message=f"no sandbox {sandbox_id!r} on this host")
        return self._info(sandbox_id, live)

    async def read(self, sandbox_id: str) -> SandboxInfo:
        """:meth:`get` with what its disk holds, read now (a statfs: for one sandbox, never a list)."""
        info = self.get(sandbox_id)
        if self._live[sandbox_id].spec.image is None:
            return info
        try:
            used = await self.runtime.disk_used_mb(sandbox_id)
        except SandboxNotFound:
            used = None
        return info.model_copy(update={"disk_used_mb": used})

    def list(self) -> list[SandboxInfo]:
        return [self._info(i, s) for i, s in self._live.items()]

    def sandbox_ids(self) -> builtins.list[str]:
        return sorted(self._live)

    def _info(self, sandbox_id: str, s: Live) -> SandboxInfo:
        spec = s.spec
        return SandboxInfo.of(
            spec,
            started_at=s.started_at,
            resident_mb=s.resident_mb,
            oom_kills=s.oom_kills,
            paused=s.paused,
            charged_mb=charge_mb(spec.memory_mb, spec.stateful, self.admission, s.resident_mb, self.policy),
            role=self.warm.role(sandbox_id) or ROLE_OWNED,
        )

    # -- restart, measurement, heartbeats --------------------------------------------------------------

    async def adopt(self) -> int:
        """Account for what the runtime still runs (after a restart); forget what it no longer has.

        Adopted sandboxes are charged their reserve until a measurement sees them again. Returns how
        many sandboxes were newly adopted.
        """
        handles = await self.runtime.list()
        present = {h.id for h in handles}
        for sandbox_id in [i for i in self._live if i not in present and i not in self._stopping]:
            del self._live[sandbox_id]
            self.warm.forget(sandbox_id)
        adopted = 0
        for h in handles:
            if h.id not in self._live and h.id not in self._starting:
                live = Live(h.spec, h.started_at)
                live.paused = self._paused(h.id)  # a sandbox paused before the restart stays paused
                if h.spec.netns is not None and self.netslots is not None:
                    self.netslots.adopt(h.id, h.spec.netns)
                self._live[h.id] = live
                # It still runs from the image file it was started from: no eviction under it.
                if h.spec.image is not None and self.images is not None and self.images.hold(h.spec.image):
                    self._image_holders.add(h.id)
                # Its secrets were never on disk: the control plane sends them again.
                self._restore.add(h.id)
                adopted += 1
        if adopted:
            log.info("agent %s adopted %d running sandboxes", self.id, adopted)
        return adopted

    async def measure(self, ids: Iterable[str] | None = None) -> int:
        """Read every live sandbox's resident memory (or those of ``ids``), then feed the pressure gate
        once. Returns how many sandboxes this made trusted."""
        now = self.clock.now()
        newly = 0
        for sandbox_id in list(self._live if ids is None else ids):
            s = self._live.get(sandbox_id)
            if s is None:
                continue
            try:
                mb = await self.runtime.resident_mb(sandbox_id)
            except SandboxNotFound:
                if sandbox_id not in self._stopping:
                    self._live.pop(sandbox_id, None)  # died on its own (OOM, crash, kill -1 inside)
                    self.warm.forget(sandbox_id)
                    # What it left behind (its record, cgroups, host uid) goes now, not at some
                    # later listing: nothing else will ever ask the runtime about this id again. In
                    # the background: a teardown (runsc's takes seconds) must not hold up the
                    # heartbeat this reading is for.
                    self._in_background(self._reap(sandbox_id))
                continue
            except RuntimeFailure:
                continue  # no reading this round; keep the last one
            await self._count_oom_kills(sandbox_id, s)
            if mb is None:
                continue
            newly += self._live.measured(sandbox_id, mb, self.settle_rule, now)
        self.observe_pressure()
        return newly

    async def _count_oom_kills(self, sandbox_id: str, s: Live) -> None:
        try:
            kills = await self.runtime.oom_kills(sandbox_id)
        except RuntimeFailure:
            return  # gone or unreadable this round; the next measurement tells
        if kills > s.oom_kills:
            self._oom_ids.add(sandbox_id)
            self.oom_kills_total += kills - s.oom_kills
            log.info("agent %s: sandbox %s had %d OOM kills", self.id, sandbox_id, kills)
            s.oom_kills = kills

    def oom_kills(self) -> dict[str, int]:
        """Sandbox id -> OOM kills so far, for the sandboxes that had any."""
        self._oom_ids = {i for i in self._oom_ids if i in self._live}
        return {i: self._live[i].oom_kills for i in self._oom_ids if self._live[i].oom_kills}

    def capacity(self) -> Capacity:
        # Ready warm sandboxes are charged in the gate, but any real create may take their room (it
        # evicts them): the control plane sees that room as admittable, so a pool never refuses work.
        warm_mb, warm_cpus = self.keeper.charge()
        return Capacity(
            cpu_total=self.cpu_total,
            cpu_used=self._live.cpus - warm_cpus,
            memory_mb_total=self.memory_mb_total,
            memory_mb_used=self.memory_mb_used(),
            memory_admission=self.admission,
            memory_mb_admittable=self.admittable_mb() + warm_mb,
            templates=None if self.templates is None else sorted(self.templates),
            runtime=self.runtime.name,
            gpu=self.gpu,
            role=self.role,
            stream_restore=self.stream_restore,
            images=self.held_images(),
            intake_open=self.gate.is_open,
            starts_in_flight=self.limiter.in_flight,
            max_concurrent_starts=self.limiter.limit,
        )

    def heartbeat(self) -> AgentHeartbeat:
        """Build the next heartbeat from the current accounting (no I/O). Its listing is the whole set
        or the changes since the last acknowledged one: hand the reply to :meth:`acknowledge`."""
        cap = self.capacity()
        now = self.clock.now()
        self.early.published(cap, now)
        return self.beats.build(
            cap,
            self._live,
            roles=self.warm.roles(),
            restore=sorted(i for i in self._restore if i in self._live),
            oom_kills=self.oom_kills(),
            warm=self.warm.counts(),
            address=self.address,
            now=now,
        )

    def acknowledge(self, hb: AgentHeartbeat, reply: HeartbeatReply | None) -> None:
        """Take the control plane's reply to ``hb``, the last heartbeat built (None: none came)."""
        self.beats.acknowledge(hb.seq, reply.listed_seq if reply is not None else None)
        if reply is not None:
            self.set_warm_targets(reply.warm_targets)
            if reply.accepted:
                self._restore_secrets(hb.restore, reply.secrets)

    def _due_readings(self) -> builtins.list[str] | None:
        """Which sandboxes a heartbeat's measurement reads (None: all; see :class:`ReadingTurns`)."""
        share = int(getattr(self.runtime, "settled_readings_per_beat", 0))
        if share <= 0:
            return None
        return self._turns.due(share, self._live, self._settling())

    def _settling(self) -> set[str]:
        # From just before the settle time: that reading is the "previous" the first trusted one needs.
        return self._live.settling(self.clock.now() - (self.settle_s - SETTLE_SAMPLE_S))

    async def beat(self) -> AgentHeartbeat:
        """Measure, build one heartbeat and send it through the sink. Errors of the sink propagate."""
        await self.measure(self._due_readings())
        hb = self.heartbeat()
        if self.sink is not None:
            reply = None
            sent_at = self.fence.now()
            try:
                reply = await self.sink(hb)
            finally:
                # No reply is no acknowledgement: the next heartbeat carries the whole set.
                self.acknowledge(hb, reply)
            self.heartbeats_sent += 1
            if reply is not None:
                await self._stop_fenced(reply.stop)
                if reply.accepted:
                    # Renewed: what it did not say to stop is still this host's at its epoch.
                    self.fence.renewed(sent_at, reply.run_lease_s, reply.dead_after_s)
                    await self.fence.check(stopped=set(reply.stop))
        return hb

    async def _fence_stop(self, sandbox_id: str) -> None:
        with contextlib.suppress(AgentError):
            await self.stop(sandbox_id)

    def _restore_secrets(self, asked: Iterable[str], secrets: Mapping[str, Mapping[str, str]]) -> None:
        for sandbox_id in asked:
            self._restore.discard(sandbox_id)
            if sandbox_id in self._live and secrets.get(sandbox_id):
                self._secrets[sandbox_id] = dict(secrets[sandbox_id])

    async def _stop_fenced(self, ids: Iterable[str]) -> None:
        """Copies the control plane says are another host's now (their epoch moved on): stop them."""
        for sandbox_id in ids:
            if sandbox_id in self._live:
                log.warning("agent %s: stopping %s, now owned elsewhere", self.id, sandbox_id)
                with contextlib.suppress(AgentError):
                    await self.stop(sandbox_id)

    async def run_heartbeats(self, phase_s: float = 0.0) -> None:
        """Heartbeat every ``heartbeat_interval_s`` until cancelled, the first after ``phase_s`` (agents
        that start together are given different phases, so their heartbeats do not arrive at the
        control plane as one burst). A control plane that is down is logged and tried again next
        interval; starts never wait on this loop."""
        budget = max(1.0, 2 * self.heartbeat_interval_s)
        # The fence watches the lease on its own schedule: a heartbeat stuck in a dead connection
        # must not delay the freeze.
        fence = asyncio.get_running_loop().create_task(self.fence.run(), name=f"fence-{self.id}")
        try:
            if phase_s > 0:
                await asyncio.sleep(phase_s)
            while True:
                try:
                    async with asyncio.timeout(budget):
                        await self.beat()
                except Exception as exc:
                    self.heartbeat_failures += 1
                    log.warning("agent %s: heartbeat failed: %r", self.id, exc)
                await self.until_next_beat()
        finally:
            fence.cancel()
            await asyncio.gather(fence, return_exceptions=True)

    async def until_next_beat(self) -> None:
        """Wait one heartbeat interval. Meanwhile, sandboxes still charged their reserve and old enough
        to settle are read every ``SETTLE_SAMPLE_S``; the next heartbeat goes at once when
        :class:`EarlyBeat` says what changed is news."""
        loop = asyncio.get_running_loop()
        end = loop.time() + self.heartbeat_interval_s
        while (left := end - loop.time()) > 0:
            await asyncio.sleep(min(left, SETTLE_SAMPLE_S))
            due = builtins.list(self._settling())
            settled = bool(due) and await self.measure(due) > 0
            if self.early.gate_moved(self.gate.is_open) or (settled and self._roomier()):
                return

    def _roomier(self) -> bool:
        return self.early.roomier(self.capacity().memory_mb_admittable, self.clock.now())


_NO_RESOLVER = "host {} has no resolver for its sandboxes (no DNS upstream): hostnames cannot be enforced"


def _parse_egress(body: EgressPolicyBody | None) -> EgressPolicy:
    try:
        return NO_NETWORK if body is None else body.policy()
    except PolicyError as exc:
        code = ErrorCode.NETWORK_HOSTNAMES_UNSUPPORTED if exc.hostname else ErrorCode.INVALID_REQUEST
        raise AgentInvalid(code, str(exc), details={"field": f"egress.{exc.field}"}) from None


def _egress(req: StartSandbox) -> EgressPolicy:
    return _parse_egress(req.egress)


def _same(spec: SandboxSpec, req: StartSandbox) -> bool:
    return (
        spec.memory_mb == req.memory_mb
        and spec.cpus == req.cpus
        and spec.stateful == req.stateful
        and spec.template == req.spec().template
        and spec.network == req.network
    )
