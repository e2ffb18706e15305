"""The experiments behind ``corral sim``: each is a frozen scenario, a ``run(scenario, seed)`` and a
result with ``as_json()``. Every parameter lives on the scenario and is echoed in the result."""

from corral.sim.experiments.burst import BurstResult, BurstScenario
from corral.sim.experiments.density import DensityResult, DensityScenario
from corral.sim.experiments.fleet_scale import FleetResult, FleetScenario
from corral.sim.experiments.leak import LeakResult, LeakScenario
from corral.sim.experiments.scale import ScaleResult, ScaleScenario
from corral.sim.experiments.staleness import StalenessResult, StalenessScenario
from corral.sim.experiments.warm import WarmResult, WarmScenario

__all__ = [
    "BurstResult",
    "BurstScenario",
    "DensityResult",
    "DensityScenario",
    "FleetResult",
    "FleetScenario",
    "LeakResult",
    "LeakScenario",
    "ScaleResult",
    "ScaleScenario",
    "StalenessResult",
    "StalenessScenario",
    "WarmResult",
    "WarmScenario",
]
