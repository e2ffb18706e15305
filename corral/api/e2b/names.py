"""The templates a tenant builds through E2B's Template SDK live in a namespace of its own: the corral
template ``<tenant id>.<name>``. A tenant's build can then never replace another tenant's template
nor one of the operator's (``default``, ``python``...), and a create that names ``<name>`` finds the
caller's own template first. A name in another tenant's namespace is unknown to the caller."""

from __future__ import annotations

import re

# E2B's template names as corral takes them: what a corral template name may hold, short enough that
# the namespaced name stays within corral's 128 characters.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"
_NAMESPACED = re.compile(r"^tn_[0-9a-f]{16}\.")


def owned(tenant_id: str, name: str) -> str:
    """The corral template a tenant's E2B template ``name`` is."""
    return f"{tenant_id}.{name}"


def foreign(tenant_id: str | None, name: str) -> bool:
    """Whether ``name`` is in a tenant's namespace other than ``tenant_id``'s."""
    return bool(_NAMESPACED.match(name)) and (tenant_id is None or not name.startswith(f"{tenant_id}."))
