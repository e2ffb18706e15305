from __future__ import annotations

import pytest

from corral.core import AdmissionMode, HostView


def make_host(
    id: str = "h1",
    *,
    now: float = 0.0,
    total: int = 32768,
    admittable: int | None = None,
    used: int = 0,
    cpu_total: float = 16.0,
    cpu_used: float = 0.0,
    mode: AdmissionMode = AdmissionMode.WORKING_SET,
    **kw: object,
) -> HostView:
    return HostView(
        id=id,
        heartbeat_at=now,
        cpu_total=cpu_total,
        cpu_used=cpu_used,
        memory_mb_total=total,
        memory_mb_used=used,
        memory_mb_admittable=total - 2048 - used if admittable is None else admittable,
        memory_admission=mode,
        **kw,  # type: ignore[arg-type]
    )


@pytest.fixture
def host_factory():  # type: ignore[no-untyped-def]
    return make_host
