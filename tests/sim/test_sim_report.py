from pathlib import Path

from corral.sim.experiments import DensityScenario, ScaleScenario, StalenessScenario
from corral.sim.experiments.density import run as run_density
from corral.sim.report.document import ReportConfig, generate


def test_the_report_is_written_from_the_run(tmp_path: Path) -> None:
    density = DensityScenario(duration_s=120.0)
    cfg = ReportConfig(
        burst_seeds=2,
        gaps_mb=(0, 300),
        density=density,
        staleness=StalenessScenario(hosts=10, view_ttls_s=(0.0, 10.0), warmup_s=20.0, measure_s=20.0),
        scale=ScaleScenario(ns=(16, 64), trials=1, full_scan_max_n=64),
    )
    path = generate(tmp_path, cfg)
    text = path.read_text()
    for name in ("burst", "density", "staleness", "scale", "leak", "warm"):
        assert f"(sim/{name}.png)" in text
        assert (tmp_path / "sim" / f"{name}.png").stat().st_size > 1000
    d = run_density(density, 1)
    assert f"| committed | {d.committed.per_host:g} | {d.committed.oom_events} |" in text
    assert f"| working-set | {d.working_set.per_host:g} | {d.working_set.oom_events} |" in text
    assert "`duration_s=120.0`" in text  # every scenario's parameters are stated
    # The corral policy's numbers come from its own create flow, set beside the fleet model's.
    assert "| `corral` | create_flow |" in text and "| `naive` | model |" in text
    assert "## corral on the fleet model and on its own create flow" in text
    # Density and warm name their engine too, and are set beside the model in the comparison.
    assert "Engine: `create_flow`" in text and "| corral | create_flow | 1 |" in text
    assert "| argmax | model | 1 |" in text
    assert (
        f"| density: working-set, per host | {run_density(density, 1, on_model=True).working_set.per_host:g} | "
        in text
    )
    assert "seed's" not in text and "Seed 000" not in text
