"""The simulator: corral on virtual time, deterministic from a seed (a failing seed replays exactly).

Its rooms, each importing only those listed before it:

- :mod:`corral.sim.scenario`: what a scenario is made of, whichever engine runs it (hosts, the load
  balancer, the clients' backoff).
- :mod:`corral.sim.flow`: a harness over corral's real flows (replicas built as the server builds
  them, real agents on the ``sim`` runtime, the store model), on an event loop with a virtual clock;
  the fleet the experiments run through the real create flow, and the fault simulation
  (``corral sim chaos``).
- :mod:`corral.sim.baselines`: a discrete-event model fleet over the core, for the policies of other
  schedulers corral is compared with.
- :mod:`corral.sim.experiments`: the experiments behind ``corral sim ...``, each run on the real flows
  and on the baselines side by side.
- :mod:`corral.sim.report`: terminal tables, charts, and ``docs/simulation.md``
  (``python -m corral.sim.report docs``).
"""
