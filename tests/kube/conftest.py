from __future__ import annotations

from tests.control.conftest import ADMIN, Cluster, cluster, make_cluster

__all__ = ["ADMIN", "Cluster", "cluster", "make_cluster"]
