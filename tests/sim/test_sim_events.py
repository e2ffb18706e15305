from corral.sim.baselines.events import EventLoop


def test_events_run_in_time_then_insertion_order() -> None:
    loop = EventLoop()
    seen: list[tuple[float, str]] = []
    loop.at(2.0, lambda: seen.append((loop.now(), "b")))
    loop.at(1.0, lambda: seen.append((loop.now(), "a")))
    loop.at(2.0, lambda: seen.append((loop.now(), "c")))
    loop.run(until=10.0)
    assert seen == [(1.0, "a"), (2.0, "b"), (2.0, "c")]
    assert loop.now() == 10.0


def test_run_stops_at_until_and_keeps_later_events() -> None:
    loop = EventLoop()
    seen: list[str] = []
    loop.at(1.0, seen.append, "early")
    loop.at(5.0, seen.append, "late")
    loop.run(until=3.0)
    assert seen == ["early"] and len(loop) == 1
    loop.run(until=6.0)
    assert seen == ["early", "late"]


def test_an_event_in_the_past_runs_now_not_before() -> None:
    loop = EventLoop()
    loop.run(until=4.0)
    times: list[float] = []
    loop.at(1.0, lambda: times.append(loop.now()))
    loop.after(-3.0, lambda: times.append(loop.now()))
    loop.run(until=5.0)
    assert times == [4.0, 4.0]
