"""What every experiment's result says first: which experiment it is, its seed and its scenario."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

S = TypeVar("S", bound="DataclassInstance")
P = TypeVar("P", bound="DataclassInstance")


def result_json(experiment: str, seed: int, scenario: DataclassInstance, **measured: Any) -> dict[str, Any]:
    """An experiment's result as JSON: its name, seed and scenario, then what it measured."""
    return {"experiment": experiment, "seed": seed, "scenario": asdict(scenario), **measured}


@dataclass(frozen=True, slots=True)
class PointsResult(Generic[S, P]):
    """The result of an experiment that measures a list of points over one scenario."""

    experiment: ClassVar[str]
    scenario: S
    seed: int
    points: list[P]

    def as_json(self) -> dict[str, Any]:
        return result_json(self.experiment, self.seed, self.scenario, points=[asdict(p) for p in self.points])
