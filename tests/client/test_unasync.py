"""The blocking client is generated from the asyncio one (``scripts/unasync.py``): a hand edit to
``client.py``, or an edit to ``async_client.py`` without regenerating, fails here."""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path
from types import ModuleType

import corral.client.async_client as async_client
import corral.client.client as sync_client

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "unasync.py"


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("unasync", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_blocking_client_is_what_the_async_one_generates() -> None:
    unasync = _load_script()
    wanted = unasync.generate(unasync.SOURCE.read_text())
    assert unasync.TARGET.read_text() == wanted, "corral/client/client.py is out of date: run `make unasync`"


def test_the_generated_client_has_no_coroutine_left() -> None:
    source = Path(sync_client.__file__).read_text()
    assert "async " not in source and "await " not in source


def test_both_clients_offer_the_same_verbs() -> None:
    pairs = [
        (async_client.AsyncCorral, sync_client.Corral),
        (async_client.AsyncSandboxes, sync_client.Sandboxes),
        (async_client.AsyncHosts, sync_client.Hosts),
        (async_client.AsyncTokens, sync_client.Tokens),
        (async_client.AsyncPools, sync_client.Pools),
        (async_client.AsyncSandbox, sync_client.Sandbox),
        (async_client.AsyncCommands, sync_client.Commands),
        (async_client.AsyncCommandHandle, sync_client.CommandHandle),
    ]
    renamed = {"aclose": "close", "__aenter__": "__enter__", "__aexit__": "__exit__"}
    for a, s in pairs:
        verbs = {renamed.get(n, n) for n, _ in inspect.getmembers(a, inspect.isfunction)}
        assert verbs == {n for n, _ in inspect.getmembers(s, inspect.isfunction)}, (a, s)
