"""Client-side commands: ``corral burst``, ``ps``, ``hosts``, ``tokens``, ``exec``, ``kill``.

Plain functions, registered by the main CLI (``app.command("burst")(burst_command)``; ``COMMANDS``
lists them all). They reach the server only through a ``ClientFactory`` found on the click context:
the main CLI passes none and gets real HTTP, tests pass one carrying an ``httpx.MockTransport``
(``CliRunner().invoke(app, args, obj=ClientFactory(...))``).

Exit codes: 0 success; 1 the server refused (the error's code is printed); 2 the server could not be
reached. ``exec`` exits with the command's own exit code.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sys
import time
from collections.abc import Awaitable, Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, NoReturn, TextIO, TypeVar

import httpx
import typer
from pydantic import BaseModel
from rich.console import Console, JustifyMethod, RenderableType
from rich.live import Live
from rich.table import Table

from corral.client.async_client import AsyncCorral
from corral.client.burst import BurstReport, run_burst
from corral.client.client import Corral
from corral.client.credentials import write_private
from corral.client.errors import CapacityUnavailable, CorralError, NotFound, Unauthorized, Unreachable
from corral.client.models import Host, SandboxRecord, TokenInfo
from corral.client.retry import RetryPolicy
from corral.client.top import DATA_PATH as TOP_DATA_PATH
from corral.client.top import render as render_top
from corral.exec_result import MAX_EXEC_TIMEOUT_S, ExecResult

M = TypeVar("M", bound=BaseModel)

EXIT_REFUSED = 1
EXIT_UNREACHABLE = 2


@dataclass(frozen=True)
class ClientFactory:
    """How the commands build clients. The defaults are real HTTP, the system clock and real sleep."""

    transport: httpx.BaseTransport | None = None
    async_transport: httpx.AsyncBaseTransport | None = None
    sleep: Callable[[float], None] = time.sleep
    async_sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    clock: Callable[[], float] = time.monotonic
    rng: random.Random | None = None
    retry: RetryPolicy | None = None

    def sync_client(self, url: str | None, token: str | None) -> Corral:
        return Corral(
            url,
            token,
            transport=self.transport,
            retry=self.retry,
            clock=self.clock,
            sleep=self.sleep,
            rng=self.rng,
        )

    def async_client(self, url: str | None, token: str | None) -> AsyncCorral:
        return AsyncCorral(
            url,
            token,
            transport=self.async_transport,
            retry=self.retry,
            clock=self.clock,
            sleep=self.async_sleep,
            rng=self.rng,
        )


def _factory(ctx: typer.Context) -> ClientFactory:
    found = ctx.find_object(ClientFactory)
    return found if found is not None else ClientFactory()


def _fail(err: CorralError) -> NoReturn:
    typer.echo(f"error: {err}", err=True)
    if isinstance(err, Unauthorized):
        typer.echo(
            "hint: set CORRAL_TOKEN (or pass --token): `corral serve` keeps its admin token in "
            "corral.admin-token beside its store, and printed where",
            err=True,
        )
    if isinstance(err, Unreachable) or (isinstance(err, CapacityUnavailable) and not err.reached_server):
        raise typer.Exit(EXIT_UNREACHABLE)
    raise typer.Exit(EXIT_REFUSED)


@contextlib.contextmanager
def server(ctx: typer.Context, url: str | None, token: str | None) -> Iterator[Corral]:
    """A command's client: a refusal or an unreachable server inside ends the command as ``_fail``
    says (the code and message printed, the exit code set)."""
    try:
        with _factory(ctx).sync_client(url, token) as client:
            yield client
    except CorralError as err:
        _fail(err)


DASHBOARD_LINK_PATH = "/dashboard/link"

# Piped, a table prints whole (rich would otherwise cut it to 80 columns); on a terminal it fits it.
PIPED_WIDTH = 4096


def console() -> Console:
    found = Console()
    return found if found.is_terminal else Console(width=PIPED_WIDTH)


def _print_json(obj: Any) -> None:
    typer.echo(json.dumps(obj, indent=None, sort_keys=False, default=str))


def print_listing(
    name: str,
    shown: Sequence[M],
    row: Callable[[M], Sequence[str]],
    columns: Sequence[str],
    *,
    as_json: bool,
    left: Collection[str] | None = None,
    no_wrap: bool = False,
    title: str | None = None,
) -> None:
    """A listing's answer: ``{name: [each as JSON]}``, or a table of one ``row`` each titled with their
    count. ``left``: the columns justified left, the rest right (None: all left)."""
    if as_json:
        _print_json({name: [m.model_dump(mode="json") for m in shown]})
        return
    table = Table(title=title or f"{len(shown)} {name}", title_justify="left")
    for column in columns:
        justify: JustifyMethod = "left" if left is None or column in left else "right"
        table.add_column(column, justify=justify, no_wrap=no_wrap)
    for m in shown:
        table.add_row(*row(m))
    console().print(table)


UrlOption = Annotated[
    str | None,
    typer.Option("--url", envvar="CORRAL_URL", help="Control-plane URL [default: http://127.0.0.1:8700]."),
]
TokenOption = Annotated[str | None, typer.Option("--token", envvar="CORRAL_TOKEN", help="API token.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")]


def burst_command(
    ctx: typer.Context,
    count: Annotated[int, typer.Option("-n", "--count", min=1, help="Concurrent creates to fire.")] = 50,
    url: UrlOption = None,
    token: TokenOption = None,
    template: Annotated[str, typer.Option("--template", help="Template to create.")] = "default",
    memory_mb: Annotated[int | None, typer.Option("--memory-mb", min=1, help="Memory per sandbox.")] = None,
    ttl_seconds: Annotated[int, typer.Option("--ttl", min=1, help="TTL, in case clean-up fails.")] = 300,
    deadline_s: Annotated[
        float, typer.Option("--deadline", min=0, help="Seconds each create may spend retrying refusals.")
    ] = 30.0,
    wait_s: Annotated[
        float | None,
        typer.Option(
            "--wait", min=0.001, help="Seconds each create may wait on the server for capacity (parked)."
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Fire N concurrent creates, show where they landed, then delete them."""
    factory = _factory(ctx)

    async def go() -> BurstReport:
        async with factory.async_client(url, token) as client:
            return await run_burst(
                client,
                count,
                template=template,
                memory_mb=memory_mb,
                ttl_seconds=ttl_seconds,
                deadline_s=deadline_s,
                wait_s=wait_s,
            )

    try:
        report = asyncio.run(go())
    except CorralError as err:
        _fail(err)
    if as_json:
        _print_json(report.to_json())
    else:
        _render_burst(report, console())
    if report.summary.refusals:
        # A create refused: say so through the exit code too, so scripts notice.
        codes = set(report.summary.refusals)
        raise typer.Exit(EXIT_UNREACHABLE if codes == {Unreachable.code} else EXIT_REFUSED)


def _render_burst(report: BurstReport, console: Console) -> None:
    s = report.summary
    widest = max(s.per_host.values(), default=0)
    scale = 50 / widest if widest > 50 else 1.0
    table = Table(title=f"{s.placed}/{s.requested} placed on {len(s.per_host)} hosts", title_justify="left")
    table.add_column("host")
    table.add_column("n", justify="right")
    table.add_column("")
    for host, n in s.per_host.items():
        table.add_row(host, str(n), "#" * max(1 if n else 0, round(n * scale)))
    console.print(table)
    ratio = "inf" if s.max_to_median is None and s.max > 0 else f"{s.max_to_median or 0:.2f}"
    console.print(f"max {s.max}  median {s.median:g}  max/median {ratio}  mean {s.mean:.2f}", highlight=False)
    if s.p50_ms is not None:
        console.print(f"latency p50 {s.p50_ms:.1f} ms  p99 {s.p99_ms:.1f} ms", highlight=False)
    for code, n in s.refusals.items():
        why = s.reasons.get(code)
        console.print(f"refused: {n} {code}" + (f": {why}" if why else ""), highlight=False, markup=False)
    if s.retried:
        console.print(
            "retried after: " + ", ".join(f"{n} {code}" for code, n in s.retried.items()), highlight=False
        )
    console.print(f"deleted {report.deleted}", highlight=False)
    if report.delete_failures:
        failures = ", ".join(f"{n} {code}" for code, n in report.delete_failures.items())
        console.print(f"[yellow]not deleted[/]: {failures}", highlight=False)


def ps_command(
    ctx: typer.Context,
    url: UrlOption = None,
    token: TokenOption = None,
    state: Annotated[str | None, typer.Option("--state", help="Only sandboxes in this state.")] = None,
    host_id: Annotated[str | None, typer.Option("--host", help="Only sandboxes on this host.")] = None,
    as_json: JsonOption = False,
) -> None:
    """List sandboxes (all pages)."""
    with server(ctx, url, token) as client:
        records = [s.record for s in client.sandboxes.list(state=state, host_id=host_id)]

    def row(s: SandboxRecord) -> tuple[str, ...]:
        created = s.created_at.isoformat(timespec="seconds") if s.created_at else ""
        memory = "" if s.memory_mb is None else str(s.memory_mb)
        return (s.id, s.name or "", s.template, s.host_id or "", s.state, memory, created)

    columns = ("id", "name", "template", "host", "state", "memory_mb", "created")
    print_listing("sandboxes", records, row, columns, as_json=as_json)


def hosts_command(
    ctx: typer.Context,
    action: Annotated[
        str | None, typer.Argument(metavar="[token|forget]", help="Enrol (or re-enrol) a host; forget one.")
    ] = None,
    host_id: Annotated[str | None, typer.Argument(metavar="[ID]", help="The host.")] = None,
    out: Annotated[
        Path | None, typer.Option("--out", help="With `token`: write the credentials here, mode 0600.")
    ] = None,
    url: UrlOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """List hosts with their admission verdict and load; `hosts token ID` enrols a host (or rotates
    its credentials), `hosts forget ID` forgets one with no live sandboxes (admin token)."""
    if action is not None:
        _host_action(ctx, action, host_id, out, url, token)
        return
    with server(ctx, url, token) as client:
        hosts = client.hosts.list()

    def row(h: Host) -> tuple[str, ...]:
        return (
            h.id,
            h.state,
            h.memory_admission or "",
            "" if h.heartbeat_age_s is None else f"{h.heartbeat_age_s:.1f}",
            f"{h.cpu_used:g}/{h.cpu_total:g}",
            f"{h.memory_mb_used}/{h.memory_mb_total}",
            str(h.memory_mb_admittable),
            str(h.reserved_mb),
            str(h.sandboxes),
            str(sum(w.get("ready", 0) for w in h.warm.values())),
        )

    columns = ("id", "state", "mode", "hb_s", "cpu", "mem_mb", "admit_mb", "resv_mb", "n", "warm")
    print_listing("hosts", hosts, row, columns, as_json=as_json, left={"id", "state", "mode"}, no_wrap=True)


def _host_action(
    ctx: typer.Context, action: str, host_id: str | None, out: Path | None, url: str | None, token: str | None
) -> None:
    if action not in ("token", "forget") or not host_id:
        raise typer.BadParameter("expected `hosts token ID` or `hosts forget ID`")
    with server(ctx, url, token) as client:
        if action == "forget":
            client.hosts.forget(host_id)
            typer.echo(f"forgot {host_id}")
            return
        creds = client.hosts.enrol(host_id)
    text = creds.model_dump_json() + "\n"
    if out is None:
        typer.echo(text, nl=False)
        return
    write_private(out, text)
    typer.echo(f"credentials for {host_id} in {out}: run `corral agent --token-file {out} ...`", err=True)


def tokens_command(
    ctx: typer.Context,
    action: Annotated[
        str, typer.Argument(metavar="list|admin|metrics|tenant|revoke", help="What to do.")
    ] = "list",
    target: Annotated[
        str | None, typer.Argument(metavar="[NAME|ID]", help="The tenant (tenant) or token id (revoke).")
    ] = None,
    url: UrlOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Tokens (admin token): `list`; `admin` issues another admin token; `metrics` a token that only
    reads /metrics (a scraper's); `tenant NAME` another token for a tenant; `revoke ID` revokes one.
    Rotate = issue, switch users over, revoke the old one."""
    if action not in ("list", "admin", "metrics", "tenant", "revoke") or (
        action in ("tenant", "revoke") and not target
    ):
        raise typer.BadParameter(
            "expected `tokens list`, `tokens admin`, `tokens metrics`, `tokens tenant NAME` or `tokens revoke ID`"
        )
    with server(ctx, url, token) as client:
        if action == "revoke":
            assert target is not None
            client.tokens.revoke(target)
            typer.echo(f"revoked {target}")
            return
        if action == "list":
            columns = ("id", "role", "tenant", "host", "source", "created")
            print_listing("tokens", client.tokens.list(), _token_row, columns, as_json=as_json, no_wrap=True)
            return
        if action == "admin":
            issued = client.tokens.issue_admin()
        elif action == "metrics":
            issued = client.tokens.issue_metrics()
        else:
            issued = client.tokens.issue_tenant(target or "")
    _print_json(issued.model_dump(mode="json"))


def _token_row(t: TokenInfo) -> tuple[str, ...]:
    created = t.created_at.isoformat(timespec="seconds") if t.created_at else ""
    return (t.id, t.role, t.tenant or "", t.host_id or "", t.source or "", created)


def exec_command(
    ctx: typer.Context,
    sandbox_id: Annotated[str, typer.Argument(metavar="ID", help="Sandbox id.")],
    command: Annotated[list[str], typer.Argument(metavar="-- CMD...", help="Command and arguments.")],
    url: UrlOption = None,
    token: TokenOption = None,
    timeout_s: Annotated[
        float,
        typer.Option(
            "--timeout",
            min=0.001,
            max=MAX_EXEC_TIMEOUT_S,
            help="Seconds before the command is killed (typed at a terminal, a command runs until it "
            "ends, an hour at most, or Ctrl-C).",
        ),
    ] = MAX_EXEC_TIMEOUT_S,
    cwd: Annotated[str | None, typer.Option("--cwd", help="Working directory.")] = None,
    detach: Annotated[
        bool,
        typer.Option(
            "--detach",
            "-d",
            help="Start it in the background and print its pid: it runs on after this command "
            "(`corral logs ID PID -f` follows it).",
        ),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Run a command in a sandbox, its output printed as it is written; exit with its exit code.
    Interrupting it (Ctrl-C) kills the command; with --detach it keeps running on its own."""
    try:
        with _factory(ctx).sync_client(url, token) as client:
            if detach:
                handle = client.sandboxes.commands(sandbox_id).start(command, timeout_s=timeout_s, cwd=cwd)
                if as_json:
                    _print_json(handle.info.model_dump(mode="json"))
                else:
                    typer.echo(handle.pid)
                return
            if as_json:
                result = client.sandboxes.exec(sandbox_id, command, timeout_s=timeout_s, cwd=cwd)
                _print_json(result.model_dump(mode="json"))
                raise typer.Exit(result.exit_code)
            result = client.sandboxes.exec(
                sandbox_id,
                command,
                timeout_s=timeout_s,
                cwd=cwd,
                on_stdout=lambda text: _write(sys.stdout, text),
                on_stderr=lambda text: _write(sys.stderr, text),
            )
    except CorralError as err:
        _fail(err)
    except KeyboardInterrupt:
        typer.echo("interrupted: the command was killed", err=True)
        raise typer.Exit(130) from None
    _exit_as(result)


def _exit_as(result: ExecResult) -> NoReturn:
    """End as the command ended: its exit code, and on stderr why it ended early when it did."""
    if result.timed_out:
        typer.echo(
            f"corral: the command timed out after {result.duration_ms / 1000:.1f} s and was killed", err=True
        )
    elif result.note:
        typer.echo(f"corral: {result.note}", err=True)
    raise typer.Exit(result.exit_code)


def _write(stream: TextIO, text: str) -> None:
    stream.write(text)
    stream.flush()


def create_command(
    ctx: typer.Context,
    template: Annotated[str, typer.Option("--template", help="Template to create.")] = "default",
    memory_mb: Annotated[int | None, typer.Option("--memory-mb", min=1, help="Memory, MiB.")] = None,
    cpus: Annotated[float | None, typer.Option("--cpus", min=0.01)] = None,
    ttl_seconds: Annotated[int | None, typer.Option("--ttl", min=1, help="Seconds until it expires.")] = None,
    name: Annotated[str | None, typer.Option("--name", help="A name unique among your sandboxes.")] = None,
    env: Annotated[
        list[str] | None, typer.Option("--env", "-e", help="KEY=VALUE in its environment (repeatable).")
    ] = None,
    wait_s: Annotated[
        float | None,
        typer.Option("--wait", min=0.001, help="Seconds it may wait on the server for capacity (parked)."),
    ] = None,
    url: UrlOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Create a sandbox and print its id (then `corral exec ID -- CMD`, `corral explain ID`, `corral rm
    ID`)."""
    pairs = [e.partition("=") for e in env or []]
    if any(not sep or not key for key, sep, _ in pairs):
        raise typer.BadParameter("expected KEY=VALUE", param_hint="--env")
    with server(ctx, url, token) as client:
        sandbox = client.sandboxes.create(
            template,
            memory_mb=memory_mb,
            cpus=cpus,
            ttl_seconds=ttl_seconds,
            name=name,
            env={key: value for key, _, value in pairs} or None,
            wait=wait_s,
        )
    if as_json:
        _print_json(sandbox.record.model_dump(mode="json"))
    else:
        typer.echo(sandbox.id)


def kill_command(
    ctx: typer.Context,
    sandbox_id: Annotated[str, typer.Argument(metavar="ID", help="Sandbox id.")],
    url: UrlOption = None,
    token: TokenOption = None,
    missing_ok: Annotated[bool, typer.Option("--missing-ok", help="Succeed if it is already gone.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Delete a sandbox."""
    existed = True
    try:
        with _factory(ctx).sync_client(url, token) as client:
            client.sandboxes.delete(sandbox_id)
    except NotFound as err:
        if not missing_ok:
            _fail(err)
        existed = False
    except CorralError as err:
        _fail(err)
    if as_json:
        _print_json({"id": sandbox_id, "deleted": existed})
        return
    typer.echo(f"killed {sandbox_id}")


def explain_command(
    ctx: typer.Context,
    sandbox_id: Annotated[str, typer.Argument(metavar="ID", help="Sandbox id.")],
    url: UrlOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Why a sandbox went where it went: candidates, scores, rejections, the store's choice."""
    with server(ctx, url, token) as client:
        doc = client.sandboxes.placement(sandbox_id)
    if as_json:
        _print_json(doc)
        return
    render_explanation(doc, console())


def render_explanation(doc: dict[str, Any], console: Console) -> None:
    req = doc.get("request", {})
    console.print(
        f"[bold]{doc.get('outcome', '?')}[/] on {doc.get('host') or '-'}: "
        f"{req.get('memory_mb')} MiB, {req.get('cpus')} cpu{', stateful' if req.get('stateful') else ''}"
    )
    if doc.get("why"):
        console.print(doc["why"])
    for n, a in enumerate(doc.get("attempts", []), 1):
        table = Table(
            title=f"attempt {n}: {a.get('checked')} hosts checked, view {a.get('view_age_s')} s old, "
            f"outcome {a.get('outcome', '-')}",
            title_justify="left",
        )
        for column in ("host", "score", "verdict"):
            table.add_column(column, no_wrap=True)
        offered = set(a.get("offered_to_store", []))
        for c in a.get("candidates", []):
            verdict = (
                "store chose"
                if c["host"] == a.get("store_choice")
                else ("offered to store" if c["host"] in offered else "sampled")
            )
            if c["host"] == a.get("placer_choice"):
                verdict += ", placer's first"
            table.add_row(c["host"], f"{c['score']:.4f}", verdict)
        for r in a.get("rejected", []):
            table.add_row(r["host"], "", f"rejected: {r['filter']}")
        console.print(table)
    refusal = doc.get("refusal")
    if refusal:
        console.print(f"refused {refusal.get('code')}: {refusal.get('reasons')}")
        for r in refusal.get("rejected", []):
            console.print(f"  {r['host']}: {r['filter']}")
    console.print(f"store rule: {doc.get('store_rule', '')}")


def dashboard_command(
    ctx: typer.Context,
    url: UrlOption = None,
    token: TokenOption = None,
    open_it: Annotated[bool, typer.Option("--open", help="Open it in a browser too.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Print a sign-in link to the dashboard (admin token), good for five minutes."""
    with server(ctx, url, token) as client:
        answer = client.request("POST", DASHBOARD_LINK_PATH)
    link = str(answer["url"])
    if as_json:
        _print_json(answer)
    else:
        typer.echo(link)
    if open_it:
        import webbrowser

        webbrowser.open(link)


def top_command(
    ctx: typer.Context,
    url: UrlOption = None,
    token: TokenOption = None,
    interval: Annotated[float, typer.Option("--interval", min=0.2, help="Seconds between refreshes.")] = 2.0,
    once: Annotated[bool, typer.Option("--once", help="Print one frame and exit.")] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the data behind one frame (the dashboard's) and exit.")
    ] = False,
) -> None:
    """The fleet live: per-host load, memory and latency, refusals (admin token)."""
    try:
        with _factory(ctx).sync_client(url, token) as client:
            if as_json:
                _print_json(client.request("GET", TOP_DATA_PATH))
                return

            def frame() -> RenderableType:
                return render_top(client.request("GET", TOP_DATA_PATH))

            out = console()
            if once or not out.is_terminal:
                # Not on a terminal (piped, logged): a plain frame after frame, nothing redrawn.
                while True:
                    out.print(frame())
                    if once:
                        return
                    out.file.flush()
                    time.sleep(interval)
            with Live(frame(), auto_refresh=False) as live:
                while True:
                    time.sleep(interval)
                    live.update(frame(), refresh=True)
    except CorralError as err:
        _fail(err)
    except KeyboardInterrupt:
        pass


COMMANDS: dict[str, Callable[..., None]] = {
    "burst": burst_command,
    "ps": ps_command,
    "hosts": hosts_command,
    "tokens": tokens_command,
    "exec": exec_command,
    "kill": kill_command,
    "create": create_command,
    "dashboard": dashboard_command,
    "rm": kill_command,
    "explain": explain_command,
    "top": top_command,
}
