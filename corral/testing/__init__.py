"""Test doubles shipped with corral, for its own tests and benchmarks and for anyone testing against
it: a TCP proxy that can cut a connection path (a store or an agent "becomes unreachable" while the
real server stays up for everyone else)."""

from corral.testing.proxy import CuttableProxy

__all__ = ["CuttableProxy"]
