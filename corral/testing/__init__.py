"""Test doubles shipped with corral, for its own tests, the simulator and benchmarks and for anyone
testing against it: the store in memory (:mod:`corral.testing.store`, split by aggregate as the SQL
store is), the in-memory agent client (:mod:`corral.testing.agents`), a harness that runs the
placement step over a store and agents that record and can refuse what it asks
(:mod:`corral.testing.placement`), and a TCP proxy that can cut a connection path (a store or an
agent "becomes unreachable" while the real server stays up for everyone else). Import the first
three from their modules: this package's root loads only the proxy."""

from corral.testing.proxy import CuttableProxy

__all__ = ["CuttableProxy"]
