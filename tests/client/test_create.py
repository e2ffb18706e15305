"""Creates through the SDK against a fake API: retries, Retry-After, idempotency, deadline, typed errors."""

from __future__ import annotations

import json
import random

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.client import (
    AsyncCorral,
    CapacityUnavailable,
    Corral,
    CorralError,
    Forbidden,
    InvalidRequest,
    Misdirected,
    NameConflict,
    NotFound,
    OverQuota,
    RetryPolicy,
    SandboxOrphaned,
    Unauthorized,
    Unreachable,
)

from .conftest import POLICY
from .fakes import FakeApi, FakeTime, refusal


def test_create_returns_a_sandbox_and_sends_the_spec(client: Corral, api: FakeApi) -> None:
    sandbox = client.sandboxes.create(
        "python", memory_mb=2048, ttl_seconds=60, metadata={"team": "a"}, env={"X": "1"}
    )
    assert sandbox.id == "sb-1"
    assert sandbox.host_id == "h1"
    assert sandbox.state == "running"
    assert sandbox.memory_mb == 2048
    assert sandbox.metadata == {"team": "a"}
    assert sandbox.created_at is not None and sandbox.created_at.tzinfo is not None
    assert sandbox.create_stats is not None and sandbox.create_stats.attempts == 1
    assert sandbox.create_stats.refusal_to_success_s is None
    (request,) = api.create_requests()
    assert request.headers["Authorization"] == "Bearer t0k"
    body = json.loads(request.content)
    assert body == {
        "template": "python",
        "memory_mb": 2048,
        "ttl_seconds": 60,
        "metadata": {"team": "a"},
        "env": {"X": "1"},
    }


def test_refusals_are_retried_with_full_jitter(client: Corral, api: FakeApi, fake_time: FakeTime) -> None:
    api.create_script.extend(refusal(503, "no_capacity") for _ in range(6))
    sandbox = client.sandboxes.create("python")

    assert len(api.create_requests()) == 7
    assert len(fake_time.sleeps) == 6
    for n, delay in enumerate(fake_time.sleeps):
        assert 0.0 <= delay <= POLICY.window(n)
    assert len(set(fake_time.sleeps)) == 6  # jittered, not a fixed schedule
    assert sum(fake_time.sleeps) <= POLICY.deadline_s
    stats = sandbox.create_stats
    assert stats is not None
    assert stats.attempts == 7
    assert stats.refusals == {"no_capacity": 6}
    assert stats.refusal_to_success_s == pytest.approx(sum(fake_time.sleeps))


def test_retry_after_is_honoured(client: Corral, api: FakeApi, fake_time: FakeTime) -> None:
    api.create_script.append(refusal(503, "no_capacity", retry_after=3, header=True))
    api.create_script.append(refusal(503, "store_unavailable", retry_after=1.5))
    client.sandboxes.create("python")
    first, second = fake_time.sleeps
    assert 3.0 <= first <= 3.0 + POLICY.window(0)
    assert 1.5 <= second <= 1.5 + POLICY.window(1)


def test_retry_after_header_alone_is_honoured(client: Corral, api: FakeApi, fake_time: FakeTime) -> None:
    api.create_script.append(httpx.Response(503, headers={"Retry-After": "4"}))
    client.sandboxes.create("python")
    (delay,) = fake_time.sleeps
    assert 4.0 <= delay <= 4.0 + POLICY.window(0)


def test_one_idempotency_key_across_retries_and_lost_responses(client: Corral, api: FakeApi) -> None:
    api.create_script.append(refusal(503, "no_capacity"))
    api.create_script.append(httpx.ConnectError("connection refused"))
    api.create_script.append(refusal(502, None))
    api.create_script.append(httpx.ReadTimeout("response lost"))
    client.sandboxes.create("python")
    client.sandboxes.create("python")

    keys = [r.headers["Idempotency-Key"] for r in api.create_requests()]
    assert len(keys) == 6
    assert len(set(keys[:5])) == 1  # the first create, across all its retries
    assert keys[5] != keys[0]  # a new logical create gets a new key
    assert len(api.sandboxes) == 2


def test_a_lost_response_does_not_make_a_second_sandbox(fake_time: FakeTime) -> None:
    api = FakeApi(time=fake_time)
    delivered = []

    def lossy(request: httpx.Request) -> httpx.Response:
        response = api.handle(request)
        if request.method == "POST" and not delivered:
            delivered.append(response)
            raise httpx.ReadError("connection reset after the server answered")
        return response

    with Corral(
        "http://corral.test",
        "t0k",
        transport=httpx.MockTransport(lossy),
        clock=fake_time.clock,
        sleep=fake_time.sleep,
    ) as c:
        sandbox = c.sandboxes.create("python")
    assert len(api.create_requests()) == 2
    assert list(api.sandboxes) == [sandbox.id]


def test_caller_supplied_idempotency_key_is_sent(client: Corral, api: FakeApi) -> None:
    client.sandboxes.create("python", idempotency_key="job-42")
    first = client.sandboxes.create("python", idempotency_key="job-42")
    assert [r.headers["Idempotency-Key"] for r in api.create_requests()] == ["job-42", "job-42"]
    assert first.id == "sb-1" and len(api.sandboxes) == 1


def test_deadline_raises_capacity_unavailable(client: Corral, api: FakeApi, fake_time: FakeTime) -> None:
    api.create_script.extend(refusal(503, "no_capacity", retry_after=2) for _ in range(100))
    started = fake_time.now
    with pytest.raises(CapacityUnavailable) as info:
        client.sandboxes.create("python", deadline_s=9.0)
    err = info.value
    assert sum(fake_time.sleeps) == pytest.approx(9.0)  # never slept past the deadline
    assert all(d <= 9.0 for d in fake_time.sleeps)
    assert err.code == "no_capacity"
    assert err.attempts == len(api.create_requests()) == len(fake_time.sleeps) + 1
    assert err.elapsed_s == pytest.approx(9.0)
    assert err.first_refusal_at == started
    assert err.refusals == {"no_capacity": err.attempts}
    assert err.retryable and not err.needs_operator and err.reached_server
    assert isinstance(err.__cause__, CorralError)


def test_no_healthy_hosts_stays_distinguishable(client: Corral, api: FakeApi, fake_time: FakeTime) -> None:
    api.create_script.extend(refusal(503, "no_healthy_hosts", retry_after=5) for _ in range(10))
    with pytest.raises(CapacityUnavailable) as info:
        client.sandboxes.create("python", deadline_s=6.0)
    assert info.value.code == "no_healthy_hosts"
    assert info.value.needs_operator


def test_deadline_counts_time_spent_in_requests(fake_time: FakeTime) -> None:
    api = FakeApi(time=fake_time, request_cost_s=4.0)
    api.create_script.extend(refusal(503, "no_capacity") for _ in range(10))
    with (
        Corral(
            "http://corral.test", "t0k", transport=api.transport, clock=fake_time.clock, sleep=fake_time.sleep
        ) as c,
        pytest.raises(CapacityUnavailable) as info,
    ):
        c.sandboxes.create("python", deadline_s=10.0)
    # 4 s per refused request: attempts at t=0, ~4, ~8, then the deadline is spent.
    assert info.value.attempts == 3
    assert info.value.elapsed_s >= 10.0


PERMANENT = [
    (429, "tenant_over_quota", OverQuota),
    (422, "invalid_request", InvalidRequest),
    (401, "unauthorized", Unauthorized),
    (403, "forbidden", Forbidden),
    (404, "not_found", NotFound),
    (409, "name_conflict", NameConflict),
    (410, "sandbox_orphaned", SandboxOrphaned),
    (421, "misdirected", Misdirected),
]


@pytest.mark.parametrize(("status", "code", "cls"), PERMANENT)
def test_permanent_errors_are_typed_and_not_retried(
    client: Corral, api: FakeApi, fake_time: FakeTime, status: int, code: str, cls: type[CorralError]
) -> None:
    api.create_script.append(refusal(status, code, details={"field": "memory_mb"}))
    with pytest.raises(cls) as info:
        client.sandboxes.create("python")
    assert info.value.code == code
    assert info.value.status == status
    assert not info.value.retryable
    assert len(api.create_requests()) == 1
    assert fake_time.sleeps == []


def test_invalid_request_names_the_field(client: Corral, api: FakeApi) -> None:
    api.create_script.append(refusal(422, "invalid_request", details={"field": "memory_mb"}))
    with pytest.raises(InvalidRequest) as info:
        client.sandboxes.create("python", memory_mb=-1)
    assert info.value.field == "memory_mb"


def test_unknown_codes_fall_back_to_the_base_error(client: Corral, api: FakeApi, fake_time: FakeTime) -> None:
    api.create_script.append(refusal(418, "teapot_mode"))
    with pytest.raises(CorralError) as info:
        client.sandboxes.create("python")
    assert type(info.value) is CorralError
    assert info.value.code == "teapot_mode" and info.value.status == 418
    assert fake_time.sleeps == []


def test_unknown_code_on_a_503_is_retried(client: Corral, api: FakeApi, fake_time: FakeTime) -> None:
    api.create_script.append(refusal(503, "fleet_resizing"))
    api.create_script.append(refusal(504, None))
    client.sandboxes.create("python")
    assert len(fake_time.sleeps) == 2


def test_a_malformed_success_is_a_bad_response(client: Corral, api: FakeApi) -> None:
    api.create_script.append(httpx.Response(201, json={"id": "sb-x"}))
    with pytest.raises(CorralError) as info:
        client.sandboxes.create("python")
    assert info.value.code == "bad_response"
    assert "template" in str(info.value)


def test_unreachable_server_on_a_plain_call(fake_time: FakeTime) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    with Corral("http://corral.test", "t0k", transport=httpx.MockTransport(refuse)) as c:
        with pytest.raises(Unreachable) as info:
            c.sandboxes.get("sb-1")
        assert "corral.test" in str(info.value)


def test_create_against_an_unreachable_server_says_so(fake_time: FakeTime) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    with (
        Corral(
            "http://corral.test",
            "t0k",
            transport=httpx.MockTransport(refuse),
            clock=fake_time.clock,
            sleep=fake_time.sleep,
        ) as c,
        pytest.raises(Unreachable) as info,
    ):
        c.sandboxes.create("python", deadline_s=2.0)
    # A server that is down is not a fleet that is full: never CapacityUnavailable.
    assert not isinstance(info.value, CapacityUnavailable)
    assert info.value.code == "unreachable" and "corral.test" in info.value.message
    assert "gave up after" in info.value.message


def test_url_and_token_come_from_the_environment(monkeypatch: pytest.MonkeyPatch, api: FakeApi) -> None:
    monkeypatch.setenv("CORRAL_URL", "http://from-env:9/")
    monkeypatch.setenv("CORRAL_TOKEN", "t0k")
    with Corral(transport=api.transport) as c:
        assert c.url == "http://from-env:9"
        c.sandboxes.create("python")
    assert api.create_requests()[0].url.host == "from-env"


def test_a_url_without_scheme_is_refused() -> None:
    with pytest.raises(InvalidRequest) as info:
        Corral("corral.test:8700")
    assert info.value.field == "url"


async def test_async_create_retries_under_the_same_policy(
    aclient: AsyncCorral, api: FakeApi, fake_time: FakeTime
) -> None:
    api.create_script.append(refusal(503, "no_capacity", retry_after=1))
    api.create_script.append(httpx.ConnectError("refused"))
    sandbox = await aclient.sandboxes.create("python")
    assert sandbox.host_id == "h1"
    first, second = fake_time.sleeps
    assert 1.0 <= first <= 1.0 + POLICY.window(0)
    assert 0.0 <= second <= POLICY.window(1)
    keys = {r.headers["Idempotency-Key"] for r in api.create_requests()}
    assert len(keys) == 1


async def test_async_deadline_and_permanent_errors(aclient: AsyncCorral, api: FakeApi) -> None:
    api.create_script.extend(refusal(503, "store_unavailable", retry_after=1) for _ in range(50))
    with pytest.raises(CapacityUnavailable) as info:
        await aclient.sandboxes.create("python", deadline_s=3.0)
    assert info.value.code == "store_unavailable"
    assert info.value.elapsed_s == pytest.approx(3.0)
    api.create_script.clear()
    api.create_script.append(refusal(429, "tenant_over_quota"))
    before = len(api.create_requests())
    with pytest.raises(OverQuota):
        await aclient.sandboxes.create("python")
    assert len(api.create_requests()) == before + 1


@settings(max_examples=60, deadline=None)
@given(
    script=st.lists(
        st.tuples(
            st.sampled_from(
                [(503, "no_capacity"), (503, "store_unavailable"), (502, None), (503, "no_healthy_hosts")]
            ),
            st.one_of(st.none(), st.floats(min_value=0, max_value=20)),
        ),
        max_size=40,
    ),
    seed=st.integers(0, 2**32 - 1),
    deadline=st.floats(min_value=0, max_value=60),
    cost=st.floats(min_value=0, max_value=3),
)
def test_any_refusal_sequence_respects_window_hint_and_deadline(
    script: list[tuple[tuple[int, str | None], float | None]], seed: int, deadline: float, cost: float
) -> None:
    fake_time = FakeTime()
    api = FakeApi(time=fake_time, request_cost_s=cost)
    api.create_script.extend(refusal(status, code, retry_after=hint) for (status, code), hint in script)
    policy = RetryPolicy(deadline_s=deadline)
    start = fake_time.now
    with Corral(
        "http://corral.test",
        "t0k",
        transport=api.transport,
        retry=policy,
        clock=fake_time.clock,
        sleep=fake_time.sleep,
        rng=random.Random(seed),
    ) as c:
        try:
            sandbox = c.sandboxes.create("python")
        except CapacityUnavailable as exc:
            assert exc.attempts == len(api.create_requests())
            assert exc.elapsed_s >= deadline
            assert exc.code == (script[exc.attempts - 1][0][1] or "bad_gateway")
        else:
            assert sandbox.create_stats is not None
            assert sandbox.create_stats.attempts == len(script) + 1
    keys = {r.headers["Idempotency-Key"] for r in api.create_requests()}
    assert len(keys) == 1
    # Every sleep began before the deadline and none reached past it.
    t = start
    for n, delay in enumerate(fake_time.sleeps):
        t += cost
        assert t + delay <= start + deadline + 1e-9
        hint = script[n][1]
        floor = hint or 0.0
        if t + delay < start + deadline - 1e-9:  # not clamped: within [hint, hint + window]
            # 1e-4: a bare 502 carries its hint only in the header, printed to 6 significant digits.
            assert floor - 1e-4 <= delay <= floor + policy.window(n) + 1e-4
        t += delay


def test_a_tenant_rate_refusal_is_retried_like_a_503(
    client: Corral, api: FakeApi, fake_time: FakeTime
) -> None:
    # 429 tenant_rate_limited is "not now" (the tenant's bucket refills), unlike tenant_over_quota.
    api.create_script.append(refusal(429, "tenant_rate_limited", retry_after=0.4))
    api.create_script.append(refusal(429, "tenant_rate_limited", retry_after=0.2))
    sandbox = client.sandboxes.create("python")
    first, second = fake_time.sleeps
    assert 0.4 <= first <= 0.4 + POLICY.window(0)  # the bucket's Retry-After is a floor, jitter on top
    assert 0.2 <= second <= 0.2 + POLICY.window(1)
    assert sandbox.create_stats is not None and sandbox.create_stats.refusals == {"tenant_rate_limited": 2}


def test_a_tenant_rate_refusal_past_the_deadline_is_transient(client: Corral, api: FakeApi) -> None:
    api.create_script.extend(refusal(429, "tenant_rate_limited", retry_after=1) for _ in range(200))
    with pytest.raises(CapacityUnavailable) as info:
        client.sandboxes.create("python")  # POLICY's 30 s deadline, on the fake clock
    assert info.value.code == "tenant_rate_limited" and info.value.status == 429
    assert 1 < info.value.attempts < 200 and info.value.refusals == {
        "tenant_rate_limited": info.value.attempts
    }
