"""Background commands: started in a sandbox by one request, kept running after it by the agent, and
read, followed, waited for and killed by later ones (``/v1/sandboxes/{id}/commands``).

The choice between a command that stops when its caller goes and one that keeps running is the
caller's, made when it starts it: the streamed exec (:mod:`corral.agent.execstream`) is killed when its
reader leaves; a background command is not, and nothing a reader does (follow, leave) ends it. It ends
by itself, at its own timeout, by a kill, or with its sandbox, and until then holds one of its
sandbox's command slots (the bound the agent puts on every command a sandbox runs).

Nobody may be reading, so what it writes must not cost the host without bound:

- memory: only the last :data:`TAIL_BYTES` of each stream are kept (older chunks are dropped and
  counted), and a sandbox keeps at most :data:`MAX_ENDED` commands that have ended;
- CPU: its pipes are read at most :data:`READ_RATE_BYTES_S` (a token bucket, shared by both streams);
  past that its pipes fill and its writes block, so a command writing without pause is slowed down to
  that rate rather than read as fast as it writes (as a streamed exec's reader would read it), and
  still keeps its freshest output.

So the most one sandbox can make its host keep is (its command slots + MAX_ENDED) x 2 x TAIL_BYTES.
A follower reads the kept chunks from its own cursor and never holds the command back: one slower than
the command misses what was dropped before it got there.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import itertools
import logging
import signal
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import KW_ONLY, dataclass, field
from datetime import UTC, datetime

from corral.agent.errors import AgentBusy, AgentCommandNotFound
from corral.agent.execstream import DRAIN_GRACE_S, KILL_GRACE_S, KILLED_BY_SIGKILL, Stream, oom_verdict
from corral.codes import ErrorCode
from corral.core.clock import Clock
from corral.core.inflight import BUSY_RETRY_S
from corral.core.rates import Rate, TokenBucket
from corral.exec_result import KEEPALIVE_S, ExecEvent, ExecOutput, ExecResult
from corral.runtime.capture import close_reader
from corral.runtime.stream import Spawned
from corral.shapes.commands import CommandInfo, CommandList, CommandOutput

log = logging.getLogger("corral.commands")

CHUNK = 32 * 1024
TAIL_BYTES = 1024 * 1024  # kept per stream of each command
MAX_ENDED = 8  # ended commands a sandbox keeps (for their output and exit code), newest
READ_RATE_BYTES_S = 1024 * 1024  # of a command's output read, both streams together
READ_BURST_BYTES = 1024 * 1024
MAX_FOLLOWERS = 8  # readers following one command at once
ENDED_BY_SANDBOX = "its sandbox ended while it ran"


class OutputTail:
    """The last ``cap`` bytes one stream wrote, in the chunks they were read in, each numbered by the
    command's sequence (shared by its two streams, so a follower interleaves them as they came)."""

    def __init__(self, cap: int = TAIL_BYTES) -> None:
        self.cap = cap
        self.chunks: deque[tuple[int, bytes]] = deque()
        self.kept = 0
        self.written = 0

    @property
    def dropped(self) -> int:
        return self.written - self.kept

    def add(self, seq: int, data: bytes) -> None:
        self.chunks.append((seq, data))
        self.kept += len(data)
        self.written += len(data)
        while self.kept > self.cap:
            first_seq, first = self.chunks[0]
            over = self.kept - self.cap
            if len(first) <= over:
                self.chunks.popleft()
                self.kept -= len(first)
            else:  # keep exactly the last ``cap`` bytes: cut the oldest chunk's head
                self.chunks[0] = (first_seq, first[over:])
                self.kept -= over

    def since(self, seq: int) -> list[tuple[int, bytes]]:
        """The kept chunks numbered after ``seq``, oldest first."""
        found = []
        for item in reversed(self.chunks):
            if item[0] <= seq:
                break
            found.append(item)
        found.reverse()
        return found

    def text(self) -> str:
        return b"".join(c for _, c in self.chunks).decode("utf-8", errors="replace")


class ReadRate:
    """The bytes one command's pipes may be read at: the core's token bucket, a byte a token. A read
    waits until the bucket is out of debt, then pays for what it got (at most a chunk of debt)."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._bucket = TokenBucket(Rate(rate, max(1, int(burst))), clock())
        self._clock = clock

    async def allowance(self, most: int) -> int:
        """How many bytes the next read may take, once the bucket is out of debt: ``most`` (reads a
        byte at a time would cost the host more than the reading they bound)."""
        while (held := self._bucket.tokens(self._clock())) <= 0:
            await asyncio.sleep(-held / self._bucket.rate.rate_per_s)
        return most

    def spend(self, n: int) -> None:
        # Both streams read at once: together they may read past what is held; the debt is paid
        # before either reads again.
        self._bucket.spend(self._clock(), n)


class Command:
    """One background command, from its start until its sandbox forgets it."""

    def __init__(
        self,
        pid: int,
        sandbox_id: str,
        argv: list[str],
        spawned: Spawned,
        timeout_s: float,
        *,
        started_at: float,
        oom_kills: Callable[[], Awaitable[int]],
        oom_kills_before: int,
        release: Callable[[], None],
        rate: ReadRate,
        tail_bytes: int = TAIL_BYTES,
        on_end: Callable[[Command], None] | None = None,
    ) -> None:
        self.pid = pid
        self.sandbox_id = sandbox_id
        self.argv = argv
        self.timeout_s = timeout_s
        self.started_at = started_at  # the agent's clock (wall time), for the record
        self._started = time.monotonic()  # for its duration
        self._spawned = spawned
        self._oom_kills = oom_kills
        self._oom_before = oom_kills_before
        self._release: Callable[[], None] | None = release
        self._rate = rate
        self._on_end = on_end
        self.tails: dict[Stream, OutputTail] = {
            "stdout": OutputTail(tail_bytes),
            "stderr": OutputTail(tail_bytes),
        }
        self._seq = itertools.count(1)
        self.last_seq = 0
        self.followers = 0
        self.exit_code: int | None = None
        self.ended_at: float | None = None
        self.duration_ms: float | None = None
        self.timed_out = self.killed = self.oom_killed = False
        self.note: str | None = None
        self.ended = asyncio.Event()
        # Set and replaced on every change (new output, the end): what a follower waits on.
        self._changed = asyncio.Event()
        self._pumps = [
            asyncio.create_task(self._pump(spawned.stdout, "stdout")),
            asyncio.create_task(self._pump(spawned.stderr, "stderr")),
        ]
        self._task = asyncio.create_task(self._run(), name=f"command-{sandbox_id}-{pid}")

    @property
    def changed(self) -> asyncio.Event:
        return self._changed

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _pump(self, reader: asyncio.StreamReader, name: Stream) -> None:
        tail = self.tails[name]
        while True:
            chunk = await reader.read(await self._rate.allowance(CHUNK))
            if not chunk:
                return
            self._rate.spend(len(chunk))
            self.last_seq = next(self._seq)
            tail.add(self.last_seq, chunk)
            self._notify()

    async def _run(self) -> None:
        try:
            waiter = asyncio.ensure_future(self._spawned.wait())
            done, _ = await asyncio.wait({waiter}, timeout=self.timeout_s)
            if not done:
                self.timed_out = True
                self._spawned.signal(signal.SIGKILL)
            # A frozen sandbox's command dies of its SIGKILL when it thaws: its slot is held till then.
            code = await waiter
            # What is still in its pipes comes in, unless a child it left keeps them open and writing.
            _, pending = await asyncio.wait(self._pumps, timeout=DRAIN_GRACE_S)
            self._stop_pumps(pending)
            result = ExecResult(exit_code=code, timed_out=self.timed_out)
            verdict = oom_verdict(result, self._oom_before, await self._oom_kills())
            self.oom_killed, self.note = verdict.oom_killed, verdict.note
            self._end(code)
        except Exception as exc:  # the runtime lost it: say so, rather than leave followers waiting
            log.warning("command %d in %s: %r", self.pid, self.sandbox_id, exc)
            self._spawned.signal(signal.SIGKILL)
            self._stop_pumps(self._pumps)
            self.note = f"its host lost track of it: {exc!r}"
            self._end(KILLED_BY_SIGKILL)
        except asyncio.CancelledError:
            # Its sandbox is gone (or the agent is stopping): what it ran went with it.
            self._spawned.signal(signal.SIGKILL)
            self._stop_pumps(self._pumps)
            if self.exit_code is None:
                self.killed = True
                self.note = ENDED_BY_SANDBOX
                self._end(KILLED_BY_SIGKILL)
            raise
        finally:
            release, self._release = self._release, None
            if release is not None:
                release()

    def _stop_pumps(self, pumps: Iterable[asyncio.Task[None]]) -> None:
        for pump in pumps:
            pump.cancel()
        close_reader(self._spawned.stdout)  # a child that kept the pipe gets EPIPE, not a reader
        close_reader(self._spawned.stderr)

    def _end(self, code: int) -> None:
        self.exit_code = code
        self.duration_ms = (time.monotonic() - self._started) * 1000.0
        self.ended_at = self.started_at + self.duration_ms / 1000.0
        self.ended.set()
        self._notify()
        if self._on_end is not None:
            self._on_end(self)

    def kill(self) -> None:
        """SIGKILL it and everything it started (a no-op once it has ended)."""
        if self.exit_code is None:
            self.killed = True
            self._spawned.signal(signal.SIGKILL)

    def cancel(self) -> None:
        self._task.cancel()

    def info(self) -> CommandInfo:
        out, err = self.tails["stdout"], self.tails["stderr"]
        ended = self.exit_code is not None
        return CommandInfo(
            pid=self.pid,
            sandbox_id=self.sandbox_id,
            command=self.argv,
            started_at=_at(self.started_at),
            state="ended" if ended else "running",
            timeout_s=self.timeout_s,
            exit_code=self.exit_code,
            ended_at=None if self.ended_at is None else _at(self.ended_at),
            duration_ms=self.duration_ms,
            timed_out=self.timed_out,
            killed=self.killed,
            oom_killed=self.oom_killed,
            note=self.note,
            stdout_bytes=out.written,
            stderr_bytes=err.written,
            stdout_dropped_bytes=out.dropped,
            stderr_dropped_bytes=err.dropped,
        )

    def output(self) -> CommandOutput:
        return CommandOutput(
            command=self.info(), stdout=self.tails["stdout"].text(), stderr=self.tails["stderr"].text()
        )


class Follower:
    """A reader of one command's output: what its host kept, then what comes, then how it ended
    (the streamed exec's events, :class:`~corral.agent.execstream.ExecEvents`). Closing it only
    stops the reading: the command runs on."""

    def __init__(self, command: Command, keepalive_s: float = KEEPALIVE_S) -> None:
        self._command = command
        self._keepalive_s = keepalive_s
        self._open = True
        command.followers += 1

    async def events(self) -> AsyncIterator[ExecEvent | None]:
        command = self._command
        cursor = 0
        decoders = {name: codecs.getincrementaldecoder("utf-8")(errors="replace") for name in command.tails}
        while True:
            changed = command.changed  # taken before reading: a change while we yield still wakes us
            ended = command.ended.is_set()  # set only once its pipes are drained: nothing comes after
            chunks = sorted(
                (seq, name, data) for name, tail in command.tails.items() for seq, data in tail.since(cursor)
            )
            for seq, name, data in chunks:
                cursor = seq
                text = decoders[name].decode(data)
                if text:
                    yield ExecOutput(stream=name, text=text)
            if ended:
                for name, decoder in decoders.items():
                    if rest := decoder.decode(b"", final=True):
                        yield ExecOutput(stream=name, text=rest)
                result = command.info().result()
                assert result is not None
                yield result
                return
            try:
                await asyncio.wait_for(changed.wait(), self._keepalive_s)
            except TimeoutError:
                yield None

    async def aclose(self) -> None:
        if self._open:
            self._open = False
            self._command.followers -= 1


@dataclass(eq=False)
class Commands:
    """The background commands of every sandbox on this host, by sandbox id then pid."""

    clock: Clock
    _: KW_ONLY
    tail_bytes: int = TAIL_BYTES
    max_ended: int = MAX_ENDED
    read_rate_bytes_s: float = READ_RATE_BYTES_S
    read_burst_bytes: float = READ_BURST_BYTES
    max_followers: int = MAX_FOLLOWERS
    _by_sandbox: dict[str, dict[int, Command]] = field(default_factory=dict, init=False, repr=False)
    _next_pid: dict[str, int] = field(default_factory=dict, init=False, repr=False)
    # The pids of each sandbox's ended commands, as they ended.
    _ended_order: dict[str, deque[int]] = field(default_factory=dict, init=False, repr=False)

    def start(
        self,
        sandbox_id: str,
        argv: list[str],
        spawned: Spawned,
        timeout_s: float,
        *,
        oom_kills: Callable[[], Awaitable[int]],
        oom_kills_before: int,
        release: Callable[[], None],
    ) -> Command:
        """Track a command just spawned; ``release`` hands its slot back once it has ended."""
        pid = self._next_pid.get(sandbox_id, 1)
        self._next_pid[sandbox_id] = pid + 1
        command = Command(
            pid,
            sandbox_id,
            argv,
            spawned,
            timeout_s,
            started_at=self.clock.now(),
            oom_kills=oom_kills,
            oom_kills_before=oom_kills_before,
            release=release,
            rate=ReadRate(self.read_rate_bytes_s, self.read_burst_bytes),
            tail_bytes=self.tail_bytes,
            on_end=self._ended,
        )
        self._by_sandbox.setdefault(sandbox_id, {})[pid] = command
        return command

    def _ended(self, command: Command) -> None:
        """Keep the sandbox's newest ``max_ended`` ended commands; the older ones are forgotten."""
        commands = self._by_sandbox.get(command.sandbox_id)
        if commands is None or commands.get(command.pid) is not command:
            return  # its sandbox is gone, and it with it
        ended = self._ended_order.setdefault(command.sandbox_id, deque())
        ended.append(command.pid)
        while len(ended) > self.max_ended:
            commands.pop(ended.popleft(), None)

    def list(self, sandbox_id: str) -> CommandList:
        return CommandList(commands=[c.info() for c in self._by_sandbox.get(sandbox_id, {}).values()])

    def get(self, sandbox_id: str, pid: int) -> Command:
        command = self._by_sandbox.get(sandbox_id, {}).get(pid)
        if command is None:
            raise AgentCommandNotFound(
                ErrorCode.NOT_FOUND, f"no command {pid} in sandbox {sandbox_id!r}", details={"pid": pid}
            )
        return command

    async def wait(self, sandbox_id: str, pid: int, wait_s: float) -> CommandInfo:
        """Its state once it has ended, or after ``wait_s`` if it has not."""
        command = self.get(sandbox_id, pid)
        if wait_s > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(command.ended.wait(), wait_s)
        return command.info()

    async def kill(self, sandbox_id: str, pid: int) -> CommandInfo:
        """SIGKILL it; its state once it has ended (or after a grace, if its sandbox is frozen)."""
        command = self.get(sandbox_id, pid)
        command.kill()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(command.ended.wait(), KILL_GRACE_S)
        return command.info()

    def follow(self, sandbox_id: str, pid: int, keepalive_s: float = KEEPALIVE_S) -> Follower:
        command = self.get(sandbox_id, pid)
        if command.followers >= self.max_followers:
            raise AgentBusy(
                ErrorCode.TOO_MANY_CONCURRENT,
                f"{command.followers} readers follow command {pid} (limit {self.max_followers})",
                BUSY_RETRY_S,
                {"scope": "command", "limit": self.max_followers, "in_flight": command.followers},
            )
        return Follower(command, keepalive_s)

    def forget(self, sandbox_id: str) -> None:
        """The sandbox is gone: its commands are killed (if anything of them is left) and forgotten."""
        for command in self._by_sandbox.pop(sandbox_id, {}).values():
            command.kill()
            command.cancel()
        self._next_pid.pop(sandbox_id, None)
        self._ended_order.pop(sandbox_id, None)


def _at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)
