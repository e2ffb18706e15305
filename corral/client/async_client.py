"""``AsyncCorral``: the asyncio client, its sandbox handle and its admin verbs.

The blocking client (``client.py``) is generated from this file by ``scripts/unasync.py``: edit this one,
then run ``make unasync``."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import dataclasses
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

import httpx

from corral.client import wire
from corral.client.errors import CorralError, NotFound, Unreachable
from corral.client.fields import Shown
from corral.client.models import (
    BatchCreated,
    CommandInfo,
    CommandList,
    CommandOutput,
    E2bKey,
    Host,
    HostCredentials,
    HostList,
    IssuedToken,
    SandboxPage,
    SandboxRecord,
    Tenant,
    TenantList,
    TokenInfo,
    TokenList,
    parse,
)
from corral.client.pools import Pool, PoolList, pool_path
from corral.client.retry import CreateStats, RetryBudget, RetryPolicy, TimeSource, retryable_for_create
from corral.client.sandbox import SandboxView
from corral.client.templates import (
    FOLLOW_WAIT_S,
    UPLOAD_TIMEOUT_S,
    Build,
    Template,
    TemplateList,
    sizes_params,
    template_build_body,
    template_path,
)
from corral.client.wire import OutputCallback
from corral.exec_result import ANSWER_MARGIN_S, KEEPALIVE_S, ExecOutput, ExecResult


class AsyncCorral:
    """An asyncio connection to a corral control plane.

    ``url`` defaults to ``$CORRAL_URL`` then ``http://127.0.0.1:8700``; ``token`` to ``$CORRAL_TOKEN``.
    ``transport`` is the seam for tests (``httpx.MockTransport``) and for custom networking; ``clock``,
    ``sleep`` and ``rng`` drive the retry policy, so tests can make backoff instant and deterministic.
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout_s: float = wire.DEFAULT_TIMEOUT_S,
        retry: RetryPolicy | None = None,
        clock: TimeSource = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self.url = wire.resolve_url(url)
        self.timeout_s = timeout_s
        self.retry = retry or RetryPolicy()
        self._clock = clock
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._http = httpx.AsyncClient(
            base_url=self.url,
            headers=wire.headers(wire.resolve_token(token)),
            transport=transport,
            timeout=timeout_s,
            limits=wire.LIMITS,
        )
        self.sandboxes = AsyncSandboxes(self)
        self.hosts = AsyncHosts(self)
        self.tokens = AsyncTokens(self)
        self.pools = AsyncPools(self)
        self.tenants = AsyncTenants(self)
        self.templates = AsyncTemplates(self)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncCorral:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, str | int | float] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        content: bytes | None = None,
    ) -> Any:
        """One request, no retries: the decoded JSON body, or a typed ``CorralError``. ``content``: a
        raw body (an archive) instead of ``json``."""
        extra: dict[str, Any] = {} if timeout_s is None else {"timeout": timeout_s}
        if content is not None:
            extra["content"] = content
        try:
            response = await self._http.request(
                method, path, json=json, params=params, headers=wire.with_request_id(headers), **extra
            )
        except httpx.TransportError as exc:
            raise Unreachable.from_transport(exc, self.url) from exc
        return wire.body_of(response)

    async def stream_lines(
        self, method: str, path: str, *, json: Any = None, timeout_s: float | None = None
    ) -> AsyncIterator[str]:
        """One request whose answer is read a line at a time as it comes; a failed one raises its typed
        ``CorralError`` before any line. Leaving the loop early closes the connection."""
        extra: dict[str, Any] = {} if timeout_s is None else {"timeout": timeout_s}
        try:
            async with self._http.stream(
                method, path, json=json, headers=wire.with_request_id(None), **extra
            ) as response:
                if not response.is_success:
                    await response.aread()
                    wire.body_of(response)
                async for line in response.aiter_lines():
                    yield line
        except httpx.TransportError as exc:
            raise Unreachable.from_transport(exc, self.url) from exc

    async def create_with_retry(
        self,
        path: str,
        body: Mapping[str, Any],
        *,
        idempotency_key: str | None,
        policy: RetryPolicy,
        timeout_s: float | None = None,
    ) -> tuple[Any, CreateStats]:
        """POST a create, retrying refusals under ``policy`` with one idempotency key throughout."""
        key = idempotency_key or str(uuid.uuid4())
        budget = RetryBudget(policy, self._clock, self._rng)
        while True:
            budget.attempt()
            try:
                data = await self.request(
                    "POST", path, json=body, headers={wire.IDEMPOTENCY_HEADER: key}, timeout_s=timeout_s
                )
            except CorralError as exc:
                if not retryable_for_create(exc):
                    raise
                await self._sleep(budget.after_refusal(exc))
                continue
            return data, budget.stats()


class AsyncSandboxes:
    """``client.sandboxes``: create, find, list, exec and delete sandboxes."""

    def __init__(self, client: AsyncCorral) -> None:
        self._client = client

    async def create(
        self,
        template: str,
        *,
        memory_mb: int | None = None,
        cpus: float | None = None,
        stateful: bool | None = None,
        ttl_seconds: int | None = None,
        name: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        deadline_s: float | None = None,
        secrets: Mapping[str, str] | None = None,
        failover: str | None = None,
        wait: float | None = None,
        disk_mb: int | None = None,
    ) -> AsyncSandbox:
        """Create a sandbox, retrying "not now" refusals until ``deadline_s`` (default: the client's
        policy). Raises ``CapacityUnavailable`` at the deadline (transient: park the work, do not record
        it as failed) and a typed error at once for anything permanent.

        ``wait``: seconds the server may hold the create, parked in ``waiting_capacity``, until room
        appears (one request, retried under the same idempotency key if the connection drops);
        ``secrets`` are delivered like ``env`` and never shown again; ``failover``: ``"recreate"``
        or ``"orphan"`` when its host dies; ``disk_mb``: its own disk over its template's image, in MiB."""
        body = wire.create_body(
            template,
            memory_mb=memory_mb,
            cpus=cpus,
            stateful=stateful,
            ttl_seconds=ttl_seconds,
            name=name,
            metadata=metadata,
            env=env,
            secrets=secrets,
            failover=failover,
            wait_s=wait,
            disk_mb=disk_mb,
        )
        data, stats = await self._client.create_with_retry(
            "/v1/sandboxes",
            body,
            idempotency_key=idempotency_key,
            policy=self._policy(deadline_s),
            timeout_s=None if wait is None else wait + wire.WAIT_MARGIN_S,
        )
        return AsyncSandbox(parse(SandboxRecord, data), self, stats)

    async def create_batch(
        self,
        count: int,
        template: str,
        *,
        memory_mb: int | None = None,
        cpus: float | None = None,
        stateful: bool | None = None,
        ttl_seconds: int | None = None,
        metadata: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        deadline_s: float | None = None,
    ) -> builtins.list[AsyncSandbox]:
        """Create ``count`` sandboxes all or nothing, with the same retry behaviour as ``create``."""
        spec = wire.create_body(
            template,
            memory_mb=memory_mb,
            cpus=cpus,
            stateful=stateful,
            ttl_seconds=ttl_seconds,
            metadata=metadata,
            env=env,
        )
        data, stats = await self._client.create_with_retry(
            "/v1/sandboxes/batch",
            {"count": count, "spec": spec},
            idempotency_key=idempotency_key,
            policy=self._policy(deadline_s),
        )
        return [AsyncSandbox(r, self, stats) for r in parse(BatchCreated, data).sandboxes]

    async def get(self, sandbox_id: str) -> AsyncSandbox:
        data = await self._client.request("GET", wire.sandbox_path(sandbox_id))
        return AsyncSandbox(parse(SandboxRecord, data), self)

    async def page(
        self,
        *,
        state: str | None = None,
        host_id: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> tuple[builtins.list[AsyncSandbox], str | None]:
        """One page of sandboxes and the cursor of the next (``None`` on the last page)."""
        params = wire.list_params(state=state, host_id=host_id, limit=limit, cursor=cursor)
        page = parse(SandboxPage, await self._client.request("GET", "/v1/sandboxes", params=params))
        return [AsyncSandbox(r, self) for r in page.sandboxes], page.next_cursor

    async def list(
        self, *, state: str | None = None, host_id: str | None = None, page_size: int | None = None
    ) -> AsyncIterator[AsyncSandbox]:
        """Every matching sandbox, following cursors page by page as the iterator is consumed."""
        cursor: str | None = None
        while True:
            sandboxes, cursor = await self.page(state=state, host_id=host_id, limit=page_size, cursor=cursor)
            for sandbox in sandboxes:
                yield sandbox
            if cursor is None:
                return

    async def delete(self, sandbox_id: str) -> None:
        await self._client.request("DELETE", wire.sandbox_path(sandbox_id))

    async def placement(self, sandbox_id: str) -> dict[str, Any]:
        """Why the sandbox went where it went: its create's recorded decision."""
        data: dict[str, Any] = await self._client.request("GET", wire.sandbox_path(sandbox_id) + "/placement")
        return data

    async def exec(
        self,
        sandbox_id: str,
        command: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> ExecResult:
        """Run a command; its result once it has ended. With ``on_stdout`` or ``on_stderr`` its output
        is streamed to them as it is written (and also kept in the result). The wait for the answer
        follows ``timeout_s`` (the command's own timeout, 30 s when not given, at most 3,600 s)."""
        body = wire.exec_body(command, timeout_s=timeout_s, env=env, cwd=cwd)
        wait_s = max(self._client.timeout_s, wire.exec_wait_s(timeout_s))
        if on_stdout is None and on_stderr is None:
            data = await self._client.request(
                "POST", wire.sandbox_path(sandbox_id) + "/exec", json=body, timeout_s=wait_s
            )
            return parse(ExecResult, data)
        output = wire.ExecOutputs(on_stdout, on_stderr)
        async for event in self.exec_stream(sandbox_id, command, timeout_s=timeout_s, env=env, cwd=cwd):
            output.take(event)
        return output.result()

    async def exec_stream(
        self,
        sandbox_id: str,
        command: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> AsyncIterator[ExecOutput | ExecResult]:
        """A command's output (``ExecOutput``: its stream and text) as it is written, and last its
        ``ExecResult`` (which carries no output: it has all been yielded). Leaving the loop before the
        result (``break``, an exception, Ctrl-C) closes the connection, and the command is killed."""
        body = wire.exec_body(command, timeout_s=timeout_s, env=env, cwd=cwd)
        wait_s = max(self._client.timeout_s, wire.exec_wait_s(timeout_s))
        path = wire.sandbox_path(sandbox_id) + "/exec/stream"
        async for line in self._client.stream_lines("POST", path, json=body, timeout_s=wait_s):
            event = wire.exec_event(line)
            if event is not None:
                yield event
                if isinstance(event, ExecResult):
                    return
        raise wire.answer_cut_short(self._client.url)

    def commands(self, sandbox_id: str) -> AsyncCommands:
        """The sandbox's background commands (``sandbox.commands`` on a handle)."""
        return AsyncCommands(self._client, sandbox_id)

    def _policy(self, deadline_s: float | None) -> RetryPolicy:
        policy = self._client.retry
        return policy if deadline_s is None else dataclasses.replace(policy, deadline_s=deadline_s)


class AsyncCommands:
    """``sandbox.commands``: commands that keep running after the call that started them, until they
    end, their ``timeout_s``, a kill or their sandbox's end. Nothing the client does (leaving a
    ``follow`` loop, exiting, crashing) stops one: that is the choice ``exec`` makes the other way."""

    def __init__(self, client: AsyncCorral, sandbox_id: str) -> None:
        self._client = client
        self.sandbox_id = sandbox_id

    async def start(
        self,
        command: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> AsyncCommandHandle:
        """Start it and return its handle at once. ``timeout_s``: when it is killed if still running
        (an hour, the most, when not given)."""
        body = wire.exec_body(command, timeout_s=timeout_s, env=env, cwd=cwd)
        data = await self._client.request("POST", wire.commands_path(self.sandbox_id), json=body)
        return AsyncCommandHandle(parse(CommandInfo, data), self._client)

    async def list(self) -> builtins.list[AsyncCommandHandle]:
        """Those running and the last few that ended, by pid."""
        data = await self._client.request("GET", wire.commands_path(self.sandbox_id))
        return [AsyncCommandHandle(c, self._client) for c in parse(CommandList, data).commands]

    async def get(self, pid: int) -> AsyncCommandHandle:
        data = await self._client.request("GET", wire.commands_path(self.sandbox_id, pid))
        return AsyncCommandHandle(parse(CommandInfo, data), self._client)


class AsyncCommandHandle:
    """A background command: ``info`` is its state as last read (``refresh`` reads it again)."""

    __slots__ = ("_client", "info")

    def __init__(self, info: CommandInfo, client: AsyncCorral) -> None:
        self.info = info
        self._client = client

    pid = Shown[int]("info")
    sandbox_id = Shown[str]("info")
    running = Shown[bool]("info")
    exit_code = Shown[int | None]("info")

    def _path(self, tail: str = "") -> str:
        return wire.commands_path(self.sandbox_id, self.pid) + tail

    async def refresh(self) -> CommandInfo:
        self.info = parse(CommandInfo, await self._client.request("GET", self._path()))
        return self.info

    async def wait(self, timeout_s: float | None = None) -> ExecResult:
        """Once it has ended: its result, with the output its host kept (``truncated`` when some of
        it was dropped). ``timeout_s``: raise ``TimeoutError`` if it still runs after that long (it
        keeps running)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self.info.running:
            left = wire.COMMAND_WAIT_S if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"command {self.pid} in {self.sandbox_id} still runs")
            wait_s = min(left, wire.COMMAND_WAIT_S)
            data = await self._client.request(
                "GET",
                self._path(),
                params={"wait_s": f"{wait_s:g}"},
                timeout_s=max(self._client.timeout_s, wait_s + 2 * ANSWER_MARGIN_S),
            )
            self.info = parse(CommandInfo, data)
        kept = await self.output()
        result = kept.command.result(kept.stdout, kept.stderr)
        assert result is not None  # it had ended before its output was read
        return result

    async def output(self) -> CommandOutput:
        """What its host kept of its output (the last MiB of each stream), and its state then."""
        kept = parse(CommandOutput, await self._client.request("GET", self._path("/output")))
        self.info = kept.command
        return kept

    async def follow(self) -> AsyncIterator[ExecOutput | ExecResult]:
        """Its kept output, then its output as it is written (``ExecOutput``), and last its
        ``ExecResult`` once it has ended (without output: it has all been yielded). Leaving the loop
        early stops following; the command runs on."""
        wait_s = max(self._client.timeout_s, KEEPALIVE_S + 2 * ANSWER_MARGIN_S)
        async for line in self._client.stream_lines(
            "GET", self._path("/output?follow=true"), timeout_s=wait_s
        ):
            event = wire.exec_event(line)
            if event is not None:
                yield event
                if isinstance(event, ExecResult):
                    return
        raise wire.answer_cut_short(self._client.url)

    async def kill(self) -> CommandInfo:
        """SIGKILL it and everything it started; its state once it has ended."""
        self.info = parse(CommandInfo, await self._client.request("POST", self._path("/kill")))
        return self.info

    def __repr__(self) -> str:
        return f"{type(self).__name__}(pid={self.pid}, sandbox_id={self.sandbox_id!r}, state={self.info.state!r})"


class AsyncHosts:
    """``client.hosts``: the fleet as the admin API sees it."""

    def __init__(self, client: AsyncCorral) -> None:
        self._client = client

    async def list(self) -> builtins.list[Host]:
        return parse(HostList, await self._client.request("GET", "/v1/hosts")).hosts

    async def drain(self, host_id: str) -> None:
        await self._client.request("POST", wire.host_path(host_id) + "/drain")

    async def undrain(self, host_id: str) -> None:
        await self._client.request("POST", wire.host_path(host_id) + "/undrain")

    async def enrol(self, host_id: str) -> HostCredentials:
        """Enrol a host, or rotate its credentials (the previous ones stop working)."""
        return parse(HostCredentials, await self._client.request("POST", wire.host_path(host_id) + "/token"))

    async def forget(self, host_id: str) -> None:
        """Forget a host with no live sandboxes and revoke its credentials."""
        await self._client.request("DELETE", wire.host_path(host_id))


class AsyncTokens:
    """``client.tokens``: issue, list and revoke API tokens (admin token). Rotating is issuing a new
    token, moving its users to it, then revoking the old one; a revoked token stops working on every
    replica within about a second."""

    def __init__(self, client: AsyncCorral) -> None:
        self._client = client

    async def list(self) -> builtins.list[TokenInfo]:
        return parse(TokenList, await self._client.request("GET", wire.TOKENS_PATH)).tokens

    async def issue_admin(self) -> IssuedToken:
        return parse(IssuedToken, await self._client.request("POST", wire.TOKENS_PATH + "/admin"))

    async def issue_metrics(self) -> IssuedToken:
        """A token that reads /metrics and nothing else."""
        return parse(IssuedToken, await self._client.request("POST", wire.TOKENS_PATH + "/metrics"))

    async def issue_tenant(self, tenant: str) -> IssuedToken:
        return parse(IssuedToken, await self._client.request("POST", wire.tenant_tokens_path(tenant)))

    async def revoke(self, token_id: str) -> None:
        await self._client.request("DELETE", wire.token_path(token_id))


class AsyncTenants:
    """``client.tenants``: tenants, their limits and their keys (admin token), each named by its name."""

    def __init__(self, client: AsyncCorral) -> None:
        self._client = client

    async def create(
        self,
        name: str,
        *,
        max_sandboxes: int | None = None,
        max_memory_mb: int | None = None,
        max_cpus: float | None = None,
    ) -> Tenant:
        """A new tenant; its first token's secret is in ``token``, shown this once."""
        body = wire.tenant_body(name, max_sandboxes, max_memory_mb, max_cpus)
        return parse(Tenant, await self._client.request("POST", wire.TENANTS_PATH, json=body))

    async def list(self) -> builtins.list[Tenant]:
        return parse(TenantList, await self._client.request("GET", wire.TENANTS_PATH)).tenants

    async def e2b_key(self, name: str) -> E2bKey:
        """A key for the tenant in the form every e2b SDK version accepts (a tenant token like any other)."""
        return parse(E2bKey, await self._client.request("POST", wire.tenant_path(name) + "/e2b-keys"))

    async def delete(self, name: str) -> None:
        """Remove the tenant and revoke every token of it (its E2B keys too). Raises :class:`TenantBusy`
        while any of its sandboxes is live: delete those first."""
        await self._client.request("DELETE", wire.tenant_path(name))


class AsyncPools:
    """``client.pools``: warm pools (admin token)."""

    def __init__(self, client: AsyncCorral) -> None:
        self._client = client

    async def create(self, template: str, size: int, *, max_per_host: int | None = None) -> Pool:
        body: dict[str, Any] = {"template": template, "size": size}
        if max_per_host is not None:
            body["max_per_host"] = max_per_host
        return parse(Pool, await self._client.request("POST", "/v1/pools", json=body))

    async def list(self) -> builtins.list[Pool]:
        return parse(PoolList, await self._client.request("GET", "/v1/pools")).pools

    async def get(self, template: str) -> Pool:
        return parse(Pool, await self._client.request("GET", pool_path(template)))

    async def resize(self, template: str, size: int) -> Pool:
        return parse(Pool, await self._client.request("PATCH", pool_path(template), json={"size": size}))

    async def delete(self, template: str) -> None:
        await self._client.request("DELETE", pool_path(template))


class AsyncTemplates:
    """``client.templates``: templates, their images and their builds. Listing takes any token (a tenant
    sees the operator's templates and its own); the rest an admin token."""

    def __init__(self, client: AsyncCorral) -> None:
        self._client = client

    async def list(self) -> builtins.list[Template]:
        return parse(TemplateList, await self._client.request("GET", "/v1/templates")).templates

    async def delete(self, name: str) -> None:
        """Remove the template; its sandboxes keep running on their image."""
        await self._client.request("DELETE", template_path(name))

    async def build(
        self,
        name: str,
        recipe: str,
        *,
        context: bytes | None = None,
        cpus: float | None = None,
        memory_mb: int | None = None,
        disk_mb: int | None = None,
    ) -> Build:
        """Start a build of ``recipe`` (a Dockerfile subset) as the template's next version; ``context``:
        a tar archive of the files its COPY steps name. Follow it with :meth:`build_status`."""
        body = template_build_body(recipe, context is not None, cpus, memory_mb, disk_mb)
        path = template_path(name) + "/builds"
        build = parse(Build, await self._client.request("POST", path, json=body))
        if context is None:
            return build
        path = f"{path}/{build.id}/context"
        return parse(
            Build, await self._client.request("PUT", path, content=context, timeout_s=UPLOAD_TIMEOUT_S)
        )

    async def import_image(
        self,
        name: str,
        archive: bytes,
        *,
        cpus: float | None = None,
        memory_mb: int | None = None,
        disk_mb: int | None = None,
    ) -> Build:
        """Start an import of ``archive`` (an OCI image layout, a ``docker save`` archive or a rootfs
        tarball) as the template's next version."""
        params = sizes_params(cpus, memory_mb, disk_mb)
        path = template_path(name) + "/imports"
        answer = await self._client.request(
            "POST", path, content=archive, params=params, timeout_s=UPLOAD_TIMEOUT_S
        )
        return parse(Build, answer)

    async def build_status(self, name: str, build_id: str, *, offset: int = 0, wait_s: float = 0.0) -> Build:
        """Its state and its log from ``offset``; with ``wait_s``, once there is more or after that long."""
        path = f"{template_path(name)}/builds/{build_id}"
        params = {"offset": offset, "wait_s": wait_s}
        return parse(Build, await self._client.request("GET", path, params=params, timeout_s=wait_s + 30))

    async def cancel(self, name: str, build_id: str) -> Build:
        path = f"{template_path(name)}/builds/{build_id}/cancel"
        return parse(Build, await self._client.request("POST", path, timeout_s=60))

    async def follow(self, name: str, build: Build) -> AsyncIterator[str | Build]:
        """Its log lines as they come, and last the build as it ended."""
        offset = 0
        current = build
        while True:
            for line in current.logs:
                yield line
            offset = current.next_offset
            if current.done:
                yield current
                return
            current = await self.build_status(name, build.id, offset=offset, wait_s=FOLLOW_WAIT_S)


class AsyncSandbox(SandboxView):
    """A sandbox, for the asyncio client. ``async with`` kills it on exit (already gone is fine)."""

    __slots__ = ("_api",)

    def __init__(
        self, record: SandboxRecord, api: AsyncSandboxes, create_stats: CreateStats | None = None
    ) -> None:
        super().__init__(record, create_stats)
        self._api = api

    async def exec(
        self,
        command: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> ExecResult:
        return await self._api.exec(
            self.id, command, timeout_s=timeout_s, env=env, cwd=cwd, on_stdout=on_stdout, on_stderr=on_stderr
        )

    def exec_stream(
        self,
        command: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> AsyncIterator[ExecOutput | ExecResult]:
        return self._api.exec_stream(self.id, command, timeout_s=timeout_s, env=env, cwd=cwd)

    @property
    def commands(self) -> AsyncCommands:
        """Its background commands: ``sandbox.commands.start([...])`` returns a handle at once."""
        return self._api.commands(self.id)

    async def kill(self) -> None:
        await self._api.delete(self.id)

    async def refresh(self) -> AsyncSandbox:
        self._record = (await self._api.get(self.id)).record
        return self

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        with contextlib.suppress(NotFound):  # already gone: the goal of the exit is reached
            await self.kill()
