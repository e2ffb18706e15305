"""corral's real flows on virtual time: the harness (:mod:`~corral.sim.flow.harness`: replicas built by
:func:`~corral.control.plane.build_replica`, real agents on the ``sim`` runtime, a guarded store), the
event loop with a virtual clock (:mod:`~corral.sim.flow.vtime`), the fleet the experiments run through
the real create flow (:mod:`~corral.sim.flow.real_fleet`), and the deterministic simulation with faults
(:mod:`~corral.sim.flow.chaos`)."""
