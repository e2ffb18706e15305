import json
from pathlib import Path

from typer.testing import CliRunner

from corral.sim.cli import sim_app

runner = CliRunner()


def test_burst_json_has_the_documented_shape() -> None:
    res = runner.invoke(
        sim_app, ["burst", "--hosts", "12", "--creates", "50", "--replicas", "4", "--seed", "1", "--json"]
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert set(out["per_host"]) == {f"h{i:02d}" for i in range(12)}
    assert out["max"] == max(out["per_host"].values())
    assert isinstance(out["median"], float) and isinstance(out["refusals"], dict)
    assert out["max"] <= 6 and out["max_to_median"] <= 1.5 and out["engine"] == "create_flow"
    assert out["scenario"]["heartbeat_s"] == 10.0 and out["scenario"]["view_ttl_s"] == 30.0


def test_naive_burst_bar() -> None:
    res = runner.invoke(sim_app, ["burst", "--replicas", "1", "--policy", "naive", "--seed", "1", "--json"])
    assert json.loads(res.stdout)["max"] >= 45


def test_density_json_bar() -> None:
    res = runner.invoke(sim_app, ["density", "--json"])
    out = json.loads(res.stdout)
    assert out["committed_per_host"] == 7
    assert out["working_set_per_host"] >= 70 and out["working_set_oom_events"] == 0


def test_the_table_shows_one_bar_per_host(tmp_path: Path) -> None:
    png = tmp_path / "burst.png"
    res = runner.invoke(sim_app, ["burst", "--policy", "naive", "--plot", str(png)])
    assert res.exit_code == 0, res.output
    assert "█" * 50 in res.stdout
    assert "max 50" in res.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_leak_and_scale_run_from_the_command_line() -> None:
    res = runner.invoke(sim_app, ["leak", "--json"])
    assert json.loads(res.stdout)["final_mb"] == {"lease": 0, "ttl_only": 0}
    res = runner.invoke(sim_app, ["scale", "--ns", "16,64", "--trials", "1", "--json"])
    assert {p["n"] for p in json.loads(res.stdout)["points"]} == {16, 64}


def test_bad_input_gets_a_stable_code_and_exit_status_2() -> None:
    res = runner.invoke(sim_app, ["burst", "--policy", "fastest", "--json"])
    assert res.exit_code == 2
    assert json.loads(res.stdout)["error"]["code"] == "invalid_scenario"
    res = runner.invoke(sim_app, ["staleness", "--view-ttls", "1,x"])
    assert res.exit_code == 2
    assert "invalid_scenario" in res.stderr
