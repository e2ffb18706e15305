"""Who a Kubernetes front proxy (the aggregator of a real apiserver) says is asking, as corral sees
them: its client certificate's name checked against the allowed names, then the user's groups mapped
onto the admin or one tenant. Pure: the certificate itself is verified by the TLS layer, and the
tenant's name is looked up by the caller.

The mapping (docs/kubernetes.md): a group of ``admin_groups`` is corral's admin (by default
``system:masters``, the group the aggregator itself asks discovery as); otherwise the groups
``corral:tenant:NAME`` and ``system:serviceaccounts:NAME`` (every service account of namespace NAME
has it) name the tenant NAME, and must all name the same one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

TENANT_GROUP = "corral:tenant:"
SERVICE_ACCOUNTS_GROUP = "system:serviceaccounts:"
DEFAULT_ADMIN_GROUPS = frozenset({"system:masters"})


@dataclass(frozen=True, slots=True)
class FrontProxyPolicy:
    # The client certificate's common names trusted to send identity headers; empty: any the
    # request-header CA signed (as Kubernetes' --requestheader-allowed-names).
    allowed_names: frozenset[str] = frozenset()
    admin_groups: frozenset[str] = DEFAULT_ADMIN_GROUPS

    def trusts(self, common_name: str | None) -> bool:
        return not self.allowed_names or common_name in self.allowed_names


@dataclass(frozen=True, slots=True)
class Mapped:
    """A user mapped: ``admin``, or ``tenant`` named ``tenant``; ``refusal`` says why neither."""

    user: str
    role: Literal["admin", "tenant", "none"]
    tenant: str | None = None
    refusal: str = ""


def map_user(policy: FrontProxyPolicy, user: str, groups: list[str]) -> Mapped:
    if policy.admin_groups & set(groups):
        return Mapped(user, "admin")
    named = sorted(
        {
            g.removeprefix(prefix)
            for g in groups
            for prefix in (TENANT_GROUP, SERVICE_ACCOUNTS_GROUP)
            if g.startswith(prefix) and len(g) > len(prefix)
        }
    )
    if not named:
        return Mapped(
            user,
            "none",
            refusal=f'user "{user}" is in no group naming a corral tenant '
            f"({TENANT_GROUP}NAME or {SERVICE_ACCOUNTS_GROUP}NAME)",
        )
    if len(named) > 1:
        return Mapped(
            user,
            "none",
            refusal=f'user "{user}" is in groups naming more than one tenant: {", ".join(named)}',
        )
    return Mapped(user, "tenant", named[0])
