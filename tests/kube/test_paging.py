"""Lists a page at a time, as kubectl asks for them (``limit``, then each page's ``continue``): through
the real kubectl's ``--chunk-size``; stable while sandboxes come and go between pages; tokens refused
(a 400 Status) when altered or presented for another list or namespace. The Table's rows, read from
the store's summaries, are the objects' own. And watches that share each change's encoded event still
get their own namespace, form and first row's columns."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.kube.kubectl import TOKEN, Kube, needs_kubectl, served

pytestmark = needs_kubectl

CORE = "/apis/agents.x-k8s.io/v1beta1"
EXT = "/apis/extensions.agents.x-k8s.io/v1beta1"
TABLE = {"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"}


@dataclass
class Env:
    k: Kube
    admin: Path
    tokens: dict[str, str]  # tenant (namespace) -> its token


def _sandbox(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}, "spec": {"memoryMB": 64}}


def _make(c: httpx.Client, ns: str, *names: str, **labels: str) -> None:
    for n in names:
        r = c.post(f"{CORE}/namespaces/{ns}/sandboxes", json=_sandbox(n, **labels))
        assert r.status_code == 201, r.text


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with served(tmp_path_factory.mktemp("paging")) as (k, admin, _proc):
        tokens = {}
        with k.http(TOKEN) as c:
            for t in ("acme", "umbrella", "churn"):
                tokens[t] = c.post("/v1/tenants", json={"name": t}).json()["token"]
        with k.http(tokens["acme"]) as c:
            for i in range(7):
                _make(c, "acme", f"p{i}", parity="odd" if i % 2 else "even")
        with k.http(tokens["umbrella"]) as c:
            _make(c, "umbrella", "u0", "u1")
        yield Env(k, admin, tokens)


def _pages(c: httpx.Client, path: str, limit: int, **params: str) -> list[dict[str, Any]]:
    out, token = [], ""
    while True:
        got = c.get(path, params={"limit": str(limit), **params, **({"continue": token} if token else {})})
        assert got.status_code == 200, got.text
        out.append(got.json())
        token = out[-1]["metadata"].get("continue", "")
        if not token:
            return out


def test_kubectl_follows_continue_through_pages(env: Env) -> None:
    k = env.k
    mine = k.config(env.tokens["acme"], "acme", "acme.kubeconfig")
    got = k.run(mine, "get", "sandboxes", "--chunk-size=3", "-o", "name", "-v=6")
    assert got.stdout.split() == [f"sandbox.agents.x-k8s.io/p{i}" for i in range(7)]
    asked = [line for line in got.stderr.splitlines() if "/namespaces/acme/sandboxes?" in line]
    assert len(asked) == 3 and sum("continue=" in line for line in asked) == 2, got.stderr
    printed = k.run(mine, "get", "sandboxes", "--chunk-size=2").stdout.splitlines()
    assert printed[0].split()[:3] == ["NAME", "READY", "REASON"]
    assert [line.split()[0] for line in printed[1:]] == [f"p{i}" for i in range(7)]
    items = json.loads(k.run(mine, "get", "sandboxes", "--chunk-size=2", "-o", "json").stdout)["items"]
    assert [i["metadata"]["name"] for i in items] == [f"p{i}" for i in range(7)]
    # A selector's matches fill each page; the others are passed over, not returned.
    odd = k.run(mine, "get", "sandboxes", "--chunk-size=2", "-l", "parity=odd", "-o", "name").stdout
    assert odd.split() == [f"sandbox.agents.x-k8s.io/p{i}" for i in (1, 3, 5)]
    # The admin's all-namespaces list pages across tenants.
    every = k.run(
        env.admin, "get", "sandboxes", "-A", "--chunk-size=2", "-o", "jsonpath={.items[*].metadata.name}"
    ).stdout.split()
    assert {f"p{i}" for i in range(7)} | {"u0", "u1"} <= set(every) and len(every) == len(set(every))


def test_pages_are_stable_while_sandboxes_come_and_go(env: Env) -> None:
    with env.k.http(env.tokens["churn"]) as c:
        base = f"{CORE}/namespaces/churn/sandboxes"
        _make(c, "churn", *(f"c{i}" for i in range(6)))
        first = c.get(base, params={"limit": "2"}, headers=TABLE).json()
        seen = [r["cells"][0] for r in first["rows"]]
        assert seen == ["c0", "c1"] and first["metadata"]["continue"]
        # Between pages: one already given goes, one not yet given goes, one comes.
        for gone in ("c0", "c3"):
            assert c.delete(f"{base}/{gone}").status_code == 200
        _make(c, "churn", "c6")
        token = first["metadata"]["continue"]
        while token:
            page = c.get(base, params={"limit": "2", "continue": token}, headers=TABLE).json()
            # Every page answers with the first page's version: a watch from it misses nothing.
            assert page["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
            seen += [r["cells"][0] for r in page["rows"]]
            token = page["metadata"].get("continue", "")
    assert seen == ["c0", "c1", "c2", "c4", "c5", "c6"]


def _refused(r: httpx.Response) -> None:
    assert r.status_code == 400, (r.status_code, r.text)
    status = r.json()
    assert (status["kind"], status["reason"], status["code"]) == ("Status", "BadRequest", 400)
    assert status["details"]["causes"][0]["reason"] == "bad_continue"
    assert "rows" not in status and "items" not in status


def test_altered_continue_tokens_are_refused(env: Env) -> None:
    base = f"{CORE}/namespaces/acme/sandboxes"
    with env.k.http(env.tokens["acme"]) as c:
        token = c.get(base, params={"limit": "2"}).json()["metadata"]["continue"]
        body, mac = token.split(".")
        payload = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        # A position of its own making, signed with the real token's MAC.
        forged = base64.urlsafe_b64encode(orjson.dumps([payload[0], 0.0, ""])).decode().rstrip("=")
        flipped = mac[:-1] + ("A" if mac[-1] != "A" else "B")
        for bad in (f"{forged}.{mac}", f"{body}.{flipped}", body, "garbage", "x" * 2000, "é.é", f"{body}."):
            for accept in ({}, TABLE):
                _refused(c.get(base, params={"limit": "2", "continue": bad}, headers=accept))
        # The shared kinds answer whole, yet refuse a bad token too.
        _refused(c.get(f"{EXT}/namespaces/acme/sandboxtemplates", params={"continue": "garbage"}))


def test_another_lists_token_is_refused(env: Env) -> None:
    k, t = env.k, env.tokens
    with k.http(t["acme"]) as acme, k.http(t["umbrella"]) as umbrella, k.http(TOKEN) as admin:
        mine = acme.get(f"{CORE}/namespaces/acme/sandboxes", params={"limit": "1"}).json()["metadata"][
            "continue"
        ]
        # Another tenant, in its own namespace: refused, and nothing of acme's is shown.
        r = umbrella.get(f"{CORE}/namespaces/umbrella/sandboxes", params={"limit": "1", "continue": mine})
        _refused(r)
        # In acme's namespace it may not act at all.
        r = umbrella.get(f"{CORE}/namespaces/acme/sandboxes", params={"limit": "1", "continue": mine})
        assert r.status_code == 403 and "p1" not in r.text
        # The same tenant, for another kind; the admin's all-namespaces token in one namespace.
        _refused(acme.get(f"{EXT}/namespaces/acme/sandboxclaims", params={"limit": "1", "continue": mine}))
        every = admin.get(f"{CORE}/sandboxes", params={"limit": "1"}).json()["metadata"]["continue"]
        _refused(acme.get(f"{CORE}/namespaces/acme/sandboxes", params={"limit": "1", "continue": every}))
        _refused(admin.get(f"{CORE}/namespaces/umbrella/sandboxes", params={"limit": "1", "continue": mine}))
        bad_limit = acme.get(f"{CORE}/namespaces/acme/sandboxes", params={"limit": "x"})
        assert bad_limit.status_code == 422 and bad_limit.json()["kind"] == "Status"


def test_table_rows_are_the_objects_own(env: Env) -> None:
    """The rows read from summaries (metadata only) and those of whole objects agree, cell for cell."""
    with env.k.http(env.tokens["acme"]) as c:
        base = f"{CORE}/namespaces/acme/sandboxes"
        lean = [r for p in _pages(c, base, 3, **{}) for r in p.get("items", [])]
        assert len(lean) == 7
        quick = c.get(base, headers=TABLE).json()
        whole = c.get(base, params={"includeObject": "Object"}, headers=TABLE).json()
        assert [r["cells"] for r in quick["rows"]] == [r["cells"] for r in whole["rows"]]
        assert [r["object"]["kind"] for r in quick["rows"]] == ["PartialObjectMetadata"] * 7
        assert [r["object"]["metadata"] for r in quick["rows"]] == [o["metadata"] for o in lean]
        assert [r["object"]["metadata"] for r in whole["rows"]] == [o["metadata"] for o in lean]
        one = c.get(f"{base}/p3", headers=TABLE).json()["rows"][0]
        assert one["cells"] == quick["rows"][3]["cells"]
        assert one["object"]["metadata"] == quick["rows"][3]["object"]["metadata"]


def _watch(c: httpx.Client, path: str, rv: str, **headers: str) -> list[dict[str, Any]]:
    got = c.get(path, params={"watch": "1", "resourceVersion": rv, "timeoutSeconds": "1"}, headers=headers)
    return [json.loads(line) for line in got.text.splitlines()]


def test_watches_share_each_event_yet_get_their_own(env: Env) -> None:
    k = env.k
    base = f"{CORE}/namespaces/acme/sandboxes"
    with k.http(env.tokens["acme"]) as c, k.http(TOKEN) as admin:
        rv = c.get(base).json()["metadata"]["resourceVersion"]
        _make(c, "acme", "w0", "w1")
        early = _watch(c, base, rv, **TABLE)
        assert {e["object"]["rows"][0]["cells"][0] for e in early} == {"w0", "w1"} and len(early) > 2
        assert early[0]["object"]["columnDefinitions"]
        assert not any(e["object"]["columnDefinitions"] for e in early[1:])
        # A watch whose first event another watch encoded as a later one: its first has the columns.
        later = _watch(c, base, early[0]["object"]["metadata"]["resourceVersion"], **TABLE)
        assert later[0]["object"]["columnDefinitions"]
        assert [e["object"]["rows"] for e in later] == [e["object"]["rows"] for e in early[1:]]
        plain = _watch(c, base, rv)
        assert [e["object"]["metadata"]["resourceVersion"] for e in plain] == [
            e["object"]["metadata"]["resourceVersion"] for e in early
        ]
        assert {(e["object"]["kind"], e["object"]["metadata"]["name"]) for e in plain} == {
            ("Sandbox", "w0"),
            ("Sandbox", "w1"),
        }
        rv = later[-1]["object"]["metadata"]["resourceVersion"]
        assert c.delete(f"{base}/w0").status_code == 200
        gone = [e for e in _watch(c, base, rv, **TABLE) if e["type"] == "DELETED"]
        assert gone and gone[-1]["object"]["rows"][0]["cells"] == ["w0", "", "", "", "", "", ""]
        # Pools are every namespace's: each watch sees the change in its own.
        admin.post(f"{EXT}/namespaces/default/sandboxtemplates", json=_sandbox("pw")).raise_for_status()
        pool = {"metadata": {"name": "pw"}, "spec": {"replicas": 0, "sandboxTemplateRef": {"name": "pw"}}}
        admin.post(f"{EXT}/namespaces/default/sandboxwarmpools", json=pool).raise_for_status()
        pools = f"{EXT}/namespaces/default/sandboxwarmpools"
        rv = admin.get(pools).json()["metadata"]["resourceVersion"]
        admin.patch(
            f"{pools}/pw",
            json={"spec": {"maxPerHost": 3}},
            headers={"Content-Type": "application/merge-patch+json"},
        ).raise_for_status()
        for client, ns in ((admin, "default"), (c, "acme"), (admin, "umbrella")):
            seen = _watch(client, f"{EXT}/namespaces/{ns}/sandboxwarmpools", rv)
            assert [e["object"]["metadata"]["namespace"] for e in seen] == [ns], seen
