"""The client commands, driven through typer's CliRunner with the fake API behind a ClientFactory."""

from __future__ import annotations

import json
import random
import socket

import httpx
import pytest
import typer
from typer.testing import CliRunner

from corral.client import RetryPolicy
from corral.client.cli import COMMANDS, EXIT_REFUSED, EXIT_UNREACHABLE, ClientFactory, _exit_as
from corral.exec_result import ExecResult

from .fakes import FakeApi, FakeTime, refusal

ARGS = ["--url", "http://corral.test", "--token", "t0k"]


@pytest.fixture
def app() -> typer.Typer:
    # Registered exactly as the main CLI does.
    app = typer.Typer()
    for name, command in COMMANDS.items():
        app.command(name)(command)
    return app


@pytest.fixture
def factory(api: FakeApi, fake_time: FakeTime) -> ClientFactory:
    return ClientFactory(
        transport=api.transport,
        async_transport=api.transport,
        sleep=fake_time.sleep,
        async_sleep=fake_time.async_sleep,
        clock=fake_time.clock,
        rng=random.Random(3),
    )


def invoke(app: typer.Typer, factory: ClientFactory, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args), obj=factory)
    return result.exit_code, result.stdout, result.stderr


def test_burst_json_shape(app: typer.Typer, factory: ClientFactory, api: FakeApi) -> None:
    api.create_script.append(refusal(503, "no_capacity", retry_after=1))
    code, out, _ = invoke(
        app, factory, "burst", "-n", "9", *ARGS, "--template", "python", "--memory-mb", "256", "--json"
    )
    assert code == 0, out
    data = json.loads(out)
    assert data["per_host"] == {"h1": 3, "h2": 3, "h3": 3}
    assert (data["max"], data["median"], data["max_to_median"]) == (3, 3.0, 1.0)
    assert data["refusals"] == {}
    assert data["retried"] == {"no_capacity": 1}
    assert isinstance(data["p50_ms"], float) and isinstance(data["p99_ms"], float)
    assert data["placed"] == 9 and data["deleted"] == 9
    assert api.sandboxes == {}  # cleaned up
    sent = json.loads(api.create_requests()[-1].content)
    assert (sent["template"], sent["memory_mb"]) == ("python", 256)


def test_burst_human_output_has_the_histogram(
    app: typer.Typer, factory: ClientFactory, fake_time: FakeTime
) -> None:
    piled = FakeApi(hosts=("h1", "h2", "h3", "h4"), place=lambda i: "h1", time=fake_time)
    factory = ClientFactory(transport=piled.transport, async_transport=piled.transport)
    code, out, _ = invoke(app, factory, "burst", "-n", "6", *ARGS)
    assert code == 0, out
    assert "h1" in out and "######" in out
    assert "max 6" in out and "median 0" in out and "max/median inf" in out
    assert "deleted 6" in out


def test_burst_with_every_create_refused_exits_nonzero(
    app: typer.Typer, factory: ClientFactory, api: FakeApi
) -> None:
    api.create_script.extend(refusal(429, "tenant_over_quota") for _ in range(3))
    code, out, _ = invoke(app, factory, "burst", "-n", "3", *ARGS, "--json")
    assert code == EXIT_REFUSED
    assert json.loads(out)["refusals"] == {"tenant_over_quota": 3}


def test_burst_with_a_create_refused_says_why_and_exits_nonzero(
    app: typer.Typer, factory: ClientFactory, api: FakeApi
) -> None:
    api.create_script.append(refusal(422, "invalid_request"))  # one of the three: the rest are placed
    code, out, _ = invoke(app, factory, "burst", "-n", "3", *ARGS)
    assert code == EXIT_REFUSED, out
    assert "refused: 1 invalid_request: invalid_request (fake)" in out
    code, out, _ = invoke(app, factory, "burst", "-n", "1", *ARGS, "--json")
    assert code == 0 and json.loads(out)["reasons"] == {}


def test_unreachable_server_is_a_clear_nonzero_exit(app: typer.Typer) -> None:
    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused")

    factory = ClientFactory(
        transport=httpx.MockTransport(down),
        async_transport=httpx.MockTransport(down),
        retry=RetryPolicy(deadline_s=0),
    )
    for args in (["burst", "-n", "2"], ["ps"], ["hosts"], ["kill", "sb-1"], ["exec", "sb-1", "--", "true"]):
        code, _, err = invoke(app, factory, args[0], *ARGS, *args[1:])
        assert code == EXIT_UNREACHABLE, args
        assert "cannot reach corral" in err and "corral.test" in err


def test_ps_json_lists_every_page(app: typer.Typer, factory: ClientFactory, api: FakeApi) -> None:
    api.create_script.clear()
    for i in range(5):
        api.handle(
            httpx.Request(
                "POST",
                "http://corral.test/v1/sandboxes",
                headers={"Authorization": "Bearer t0k"},
                json={"template": f"t{i}"},
            )
        )
    code, out, _ = invoke(app, factory, "ps", *ARGS, "--json")
    assert code == 0
    rows = json.loads(out)["sandboxes"]
    assert [r["template"] for r in rows] == [f"t{i}" for i in range(5)]
    assert rows[0]["created_at"].startswith("2026-11-30T08:00:00")
    code, out, _ = invoke(app, factory, "ps", *ARGS, "--host", "h2")
    assert code == 0 and "sb-2" in out and "sb-1" not in out


def test_a_piped_table_prints_whole(app: typer.Typer, factory: ClientFactory, api: FakeApi) -> None:
    long = "a-template-whose-name-alone-is-wider-than-most-terminals-are-" + "x" * 40
    api.handle(
        httpx.Request(
            "POST",
            "http://corral.test/v1/sandboxes",
            headers={"Authorization": "Bearer t0k"},
            json={"template": long},
        )
    )
    code, out, _ = invoke(app, factory, "ps", *ARGS)  # CliRunner's output is not a terminal
    assert code == 0 and long in out and "…" not in out


def test_hosts_json_and_table(app: typer.Typer, factory: ClientFactory) -> None:
    code, out, _ = invoke(app, factory, "hosts", *ARGS, "--json")
    assert code == 0
    hosts = json.loads(out)["hosts"]
    assert [h["id"] for h in hosts] == ["h1", "h2", "h3"]
    assert hosts[0]["memory_mb_admittable"] == 30000
    code, out, _ = invoke(app, factory, "hosts", *ARGS)
    assert code == 0 and "3 hosts" in out and "h3" in out


def test_hosts_with_a_tenant_token_is_refused(app: typer.Typer, factory: ClientFactory, api: FakeApi) -> None:
    api.hosts_status = 403
    code, _, err = invoke(app, factory, "hosts", *ARGS)
    assert code == EXIT_REFUSED and "forbidden" in err


def test_exec_passes_the_command_and_exits_with_its_code(
    app: typer.Typer, factory: ClientFactory, api: FakeApi
) -> None:
    api.handle(
        httpx.Request(
            "POST",
            "http://corral.test/v1/sandboxes",
            headers={"Authorization": "Bearer t0k"},
            json={"template": "t"},
        )
    )
    code, out, err = invoke(app, factory, "exec", "sb-1", *ARGS, "--", "ls", "-la", "/")
    assert code == 3
    assert out == "ls -la /\n" and err == "err\n"
    # Typed at a terminal, a command runs until it ends (an hour at most) or Ctrl-C.
    assert json.loads(api.requests[-1].content) == {"command": ["ls", "-la", "/"], "timeout_s": 3600.0}
    code, out, _ = invoke(app, factory, "exec", "sb-1", *ARGS, "--json", "--", "true")
    assert code == 3 and json.loads(out)["duration_ms"] == 12.5


@pytest.mark.parametrize(
    ("result", "said"),
    [
        (ExecResult(exit_code=137, duration_ms=2500, timed_out=True, note="n"), "timed out after 2.5 s"),
        (ExecResult(exit_code=1, note="its sandbox was paused"), "corral: its sandbox was paused"),
        (ExecResult(exit_code=0), ""),
    ],
)
def test_a_command_ends_the_cli_with_its_code_and_why_it_ended_early(
    result: ExecResult, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(typer.Exit) as ended:
        _exit_as(result)
    assert ended.value.exit_code == result.exit_code
    err = capsys.readouterr().err
    assert said in err and (err == "") == (said == "")
    assert "corral: n\n" not in err  # a timeout is said instead of the note


def test_kill_and_missing(app: typer.Typer, factory: ClientFactory, api: FakeApi) -> None:
    api.handle(
        httpx.Request(
            "POST",
            "http://corral.test/v1/sandboxes",
            headers={"Authorization": "Bearer t0k"},
            json={"template": "t"},
        )
    )
    code, out, _ = invoke(app, factory, "kill", "sb-1", *ARGS)
    assert code == 0 and "killed sb-1" in out
    code, _, err = invoke(app, factory, "kill", "sb-1", *ARGS)
    assert code == EXIT_REFUSED and "not_found" in err
    code, _, _ = invoke(app, factory, "kill", "sb-1", *ARGS, "--missing-ok")
    assert code == 0


def test_bad_token_is_reported_with_its_code(app: typer.Typer, factory: ClientFactory) -> None:
    code, _, err = invoke(app, factory, "ps", "--url", "http://corral.test", "--token", "wrong")
    assert code == EXIT_REFUSED and "unauthorized" in err


def test_url_and_token_from_the_environment(app: typer.Typer, factory: ClientFactory, api: FakeApi) -> None:
    result = CliRunner().invoke(
        app, ["ps", "--json"], obj=factory, env={"CORRAL_URL": "http://env-host:1", "CORRAL_TOKEN": "t0k"}
    )
    assert result.exit_code == 0, result.stderr
    assert api.requests[-1].url.host == "env-host"


def test_a_real_closed_port_is_reported_as_unreachable(app: typer.Typer) -> None:
    # No factory: the commands build real clients, and the port on loopback has nobody listening.

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = CliRunner().invoke(app, ["hosts", "--url", f"http://127.0.0.1:{port}", "--token", "x"])
    assert result.exit_code == EXIT_UNREACHABLE
    assert "cannot reach corral" in result.stderr


def test_burst_with_a_bad_token_fails_before_creating(
    app: typer.Typer, factory: ClientFactory, api: FakeApi
) -> None:
    code, _, err = invoke(app, factory, "burst", "-n", "5", "--url", "http://corral.test", "--token", "wrong")
    assert code == EXIT_REFUSED and "unauthorized" in err
    assert api.create_requests() == []
