"""Attacks through the public API. The in-process cluster of the control-plane tests serves the input
attacks (fast, exact); the identity attacks run against real ``corral api`` and ``corral agent``
processes (see ``tests.e2e.procs``)."""

from __future__ import annotations

from tests.control.conftest import ADMIN, Cluster, cluster

__all__ = ["ADMIN", "Cluster", "cluster"]
