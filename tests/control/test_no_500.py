"""No input ever produces a 500: arbitrary bodies, headers and paths get a 4xx with a stable code."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.agent.protocol import AgentHeartbeat

from .conftest import ADMIN, make_cluster

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=40),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=12,
)
field_names = st.sampled_from(
    [
        "template",
        "memory_mb",
        "cpus",
        "stateful",
        "ttl_seconds",
        "name",
        "metadata",
        "env",
        "count",
        "spec",
        "command",
        "timeout_s",
        "cwd",
        "max_sandboxes",
        "x",
    ]
)
bodies = st.dictionaries(field_names, json_values, max_size=6) | json_values
# A heartbeat is probed from a valid one with some fields replaced, so the probe reaches its bounds.
heartbeat_fields = st.sampled_from(sorted(AgentHeartbeat.model_fields))
big_numbers = st.integers(-(2**80), 2**80) | st.floats() | st.sampled_from([2**63, 2**63 - 1, -1, 0])
heartbeat_changes = st.dictionaries(heartbeat_fields, json_values | big_numbers, max_size=4)
routes = st.sampled_from(
    [
        ("POST", "/v1/sandboxes"),
        ("POST", "/v1/sandboxes/batch"),
        ("POST", "/v1/sandboxes/sb-nope/exec"),
        ("GET", "/v1/sandboxes"),
        ("GET", "/v1/sandboxes/%00..%2F"),
        ("DELETE", "/v1/sandboxes/nope"),
        ("POST", "/v1/templates"),
        ("POST", "/v1/tenants"),
        ("POST", "/v1/hosts/nope/drain"),
        ("POST", "/v1/agent/heartbeat"),
        ("PUT", "/v1/sandboxes"),
        ("POST", "/v1/hosts/h-new/token"),
        ("POST", "/v1/hosts/%00bad/token"),
        ("DELETE", "/v1/hosts/nope"),
        ("GET", "/v1/tokens"),
        ("POST", "/v1/tokens/admin"),
        ("POST", "/v1/tenants/nope/tokens"),
        ("DELETE", "/v1/tokens/tok_nope"),
    ]
)
queries = st.dictionaries(
    st.sampled_from(["state", "limit", "cursor", "host_id"]), st.text(max_size=20), max_size=3
)


def test_no_input_produces_a_500(tmp_path: Path) -> None:
    seen: list[int] = []

    async def scenario() -> None:
        c = await make_cluster(tmp_path, hosts=2)
        host = c.fleet.agents[0]
        creds = await c.plane.enrol_host(host.id)
        valid_heartbeat = host.heartbeat().model_dump(mode="json")
        try:

            @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
            @given(
                route=routes,
                body=bodies,
                query=queries,
                raw=st.booleans(),
                key=st.text(max_size=10),
                changes=heartbeat_changes,
            )
            def probe(
                route: tuple[str, str],
                body: object,
                query: dict[str, str],
                raw: bool,
                key: str,
                changes: dict[str, object],
            ) -> None:
                method, path = route
                token = ADMIN
                if path == "/v1/agent/heartbeat":
                    token = creds.agent_token
                    body = {**valid_heartbeat, "seq": valid_heartbeat["seq"] + len(seen), **changes}
                headers = {**c.as_(token), "Content-Type": "application/json"}
                if key.isprintable() and key.isascii():
                    headers["Idempotency-Key"] = key
                content = json.dumps(body).encode() if not raw else json.dumps(body).encode()[:-1]
                r = asyncio.run_coroutine_threadsafe(
                    c.http.request(method, path, content=content, params=query, headers=headers), loop
                ).result(30)
                seen.append(r.status_code)
                assert r.status_code < 500 or r.status_code == 503, (r.status_code, r.text)
                if r.status_code >= 400:
                    assert isinstance(r.json()["error"]["code"], str)

            await asyncio.to_thread(probe)
            assert len(seen) >= 100 and any(s == 422 for s in seen)
        finally:
            await c.http.aclose()
            await c.plane.stop()
            await c.plane.store.close()

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(scenario())
    finally:
        loop.close()
