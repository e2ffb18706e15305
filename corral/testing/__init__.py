"""Test doubles shipped with corral, for its own tests and benchmarks and for anyone testing against
it: a TCP proxy that can cut a connection path (a store or an agent "becomes unreachable" while the
real server stays up for everyone else); and in :mod:`corral.testing.placement`, a harness that runs the
placement step over a store and agents that record and can refuse what it asks."""

from corral.testing.proxy import CuttableProxy

__all__ = ["CuttableProxy"]
