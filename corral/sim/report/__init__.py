"""What the simulator's results are shown as: readable terminal output (:mod:`~corral.sim.report.render`),
charts (:mod:`~corral.sim.report.plots`), and ``docs/simulation.md`` regenerated from one run of every
experiment (:mod:`~corral.sim.report.document`; ``python -m corral.sim.report docs``)."""
