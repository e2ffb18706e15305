from __future__ import annotations

from tests.control.conftest import ADMIN, Cluster, cluster
from tests.control.test_failover import small

__all__ = ["ADMIN", "Cluster", "cluster", "small"]
