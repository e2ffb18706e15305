"""The sandbox handle and the listing iterator."""

from __future__ import annotations

import json

import httpx
import pytest

from corral.client import AsyncCorral, Corral, CorralError, NotFound, SandboxOrphaned

from .fakes import FakeApi, refusal


def test_exec_sends_the_command_and_returns_the_result(client: Corral, api: FakeApi) -> None:
    sandbox = client.sandboxes.create("python")
    result = sandbox.exec(["echo", "hi"], timeout_s=5, cwd="/tmp", env={"A": "b"})
    assert (result.exit_code, result.stdout, result.stderr, result.duration_ms) == (
        3,
        "echo hi\n",
        "err\n",
        12.5,
    )
    assert not result.ok
    request = api.requests[-1]
    assert request.url.path == f"/v1/sandboxes/{sandbox.id}/exec"
    assert json.loads(request.content) == {
        "command": ["echo", "hi"],
        "timeout_s": 5,
        "env": {"A": "b"},
        "cwd": "/tmp",
    }
    sandbox.exec("uname -a")
    assert json.loads(api.requests[-1].content) == {"command": "uname -a"}


def test_refresh_reads_the_current_record(client: Corral, api: FakeApi) -> None:
    sandbox = client.sandboxes.create("python")
    api.sandboxes[sandbox.id]["state"] = "stopped"
    assert sandbox.state == "running"
    assert sandbox.refresh() is sandbox
    assert sandbox.state == "stopped"


def test_the_handle_shows_its_record_and_cannot_be_written(client: Corral, api: FakeApi) -> None:
    sandbox = client.sandboxes.create("python")
    record = sandbox.record
    assert (sandbox.id, sandbox.template, sandbox.state, sandbox.stateful, sandbox.expires_at) == (
        record.id,
        record.template,
        record.state,
        record.stateful,
        record.expires_at,
    )
    with pytest.raises(AttributeError, match="read-only"):
        sandbox.state = "stopped"  # type: ignore[assignment]
    assert sandbox.state == record.state


def test_kill_deletes_and_a_second_kill_is_not_found(client: Corral, api: FakeApi) -> None:
    sandbox = client.sandboxes.create("python")
    sandbox.kill()
    assert api.deleted == [sandbox.id]
    with pytest.raises(NotFound):
        sandbox.kill()


def test_context_manager_kills_on_exit_even_after_an_error(client: Corral, api: FakeApi) -> None:
    with pytest.raises(RuntimeError), client.sandboxes.create("python") as sandbox:
        raise RuntimeError("the work failed")
    assert api.deleted == [sandbox.id]


def test_context_manager_ignores_a_sandbox_already_gone(client: Corral, api: FakeApi) -> None:
    with client.sandboxes.create("python") as sandbox:
        sandbox.kill()
    assert api.deleted == [sandbox.id]


def test_context_manager_surfaces_other_kill_failures(client: Corral, api: FakeApi) -> None:
    api.delete_script.append(refusal(410, "sandbox_orphaned"))
    with pytest.raises(SandboxOrphaned), client.sandboxes.create("python"):
        pass


def test_get_unknown_sandbox_is_not_found(client: Corral) -> None:
    with pytest.raises(NotFound) as info:
        client.sandboxes.get("sb-404")
    assert info.value.code == "not_found" and info.value.status == 404


def test_ids_that_would_change_the_path_are_refused(client: Corral, api: FakeApi) -> None:
    with pytest.raises(CorralError) as info:
        client.sandboxes.get("../hosts")
    assert info.value.code == "invalid_request"
    assert api.requests == []


def test_list_follows_every_page(client: Corral, api: FakeApi) -> None:
    created = [client.sandboxes.create("python").id for _ in range(5)]
    seen = [s.id for s in client.sandboxes.list()]
    assert seen == created
    listing = [r for r in api.requests if r.method == "GET"]
    assert [r.url.params.get("cursor") for r in listing] == [None, "2", "4"]


def test_list_passes_filters_and_page_size(client: Corral, api: FakeApi) -> None:
    for _ in range(4):
        client.sandboxes.create("python")
    on_h2 = list(client.sandboxes.list(host_id="h2", state="running", page_size=1))
    assert [s.host_id for s in on_h2] == ["h2"]
    params = next(r for r in api.requests if r.method == "GET").url.params
    assert (params["host_id"], params["state"], params["limit"]) == ("h2", "running", "1")


def test_list_is_lazy(client: Corral, api: FakeApi) -> None:
    for _ in range(5):
        client.sandboxes.create("python")
    iterator = client.sandboxes.list()
    next(iterator)
    assert sum(1 for r in api.requests if r.method == "GET") == 1


def test_a_page_missing_fields_is_a_bad_response(api: FakeApi) -> None:
    transport = httpx.MockTransport(lambda r: httpx.Response(200, json={"sandboxes": [{"id": 1}]}))
    with Corral("http://corral.test", "t0k", transport=transport) as c, pytest.raises(CorralError) as info:
        list(c.sandboxes.list())
    assert info.value.code == "bad_response"


def test_hosts_list_and_drain(client: Corral, api: FakeApi) -> None:
    client.sandboxes.create("python")
    hosts = client.hosts.list()
    assert [h.id for h in hosts] == ["h1", "h2", "h3"]
    assert hosts[0].sandboxes == 1 and hosts[0].memory_admission == "working-set"
    client.hosts.drain("h1")
    client.hosts.drain("h2")
    client.hosts.undrain("h1")
    assert api.drained == {"h1": False, "h2": True}
    with pytest.raises(NotFound):
        client.hosts.drain("h9")


async def test_async_handle_and_context_manager(aclient: AsyncCorral, api: FakeApi) -> None:
    async with await aclient.sandboxes.create("python") as sandbox:
        result = await sandbox.exec(["true"])
        assert result.exit_code == 3
        api.sandboxes[sandbox.id]["state"] = "stopped"
        await sandbox.refresh()
        assert sandbox.state == "stopped"
    assert api.deleted == [sandbox.id]
    async with await aclient.sandboxes.create("python") as other:
        await other.kill()  # gone before exit: exit still succeeds
    assert api.deleted == [sandbox.id, other.id]


async def test_async_list_follows_every_page(aclient: AsyncCorral, api: FakeApi) -> None:
    created = [(await aclient.sandboxes.create("python")).id for _ in range(5)]
    assert [s.id async for s in aclient.sandboxes.list()] == created
    hosts = await aclient.hosts.list()
    assert len(hosts) == 3
