"""E2B's egress options onto corral's egress policy (corral.core.netpolicy), for creates and for
``PUT /sandboxes/{id}/network`` (the SDK's ``update_network``).

* ``allow_internet_access: true`` is mode ``internet``; ``false`` is ``internet`` with ``deny_out``
  ``0.0.0.0/0`` (what E2B says it is), so ``allowOut`` still opens what it lists and a later
  ``update_network`` can open more. Neither it nor ``network`` given: corral's default, ``none``.
* ``network.allowOut`` / ``denyOut``: IPv4 addresses and CIDRs, allow winning; hostnames in
  ``allowOut``, enforced by the slot's resolver (corral.agent.dns). Hostnames in ``denyOut`` are
  refused (422 ``network_hostnames_unsupported``): a name's addresses are reachable by number.
* ``network.allowPublicTraffic: false``: the sandbox's ports answer only requests carrying its
  ``e2b-traffic-access-token`` (``trafficAccessToken`` in the create's answer); else 403.
* What corral does not enforce is refused rather than dropped: ``maskRequestHost``, ``dnsServers``, ``egressProxy``, ``rules``, ``httpsPorts``.
"""

from __future__ import annotations

from typing import Any

from corral.control.errors import InvalidRequest

_UNENFORCED = ("maskRequestHost", "dnsServers", "egressProxy", "rules", "httpsPorts")


def policy_body(body: dict[str, Any], network: object) -> dict[str, object] | None:
    """corral's wire form of the policy an E2B body asks for; None when it asks for none."""
    internet = body.get("allow_internet_access")
    if internet is not None and not isinstance(internet, bool):
        raise InvalidRequest("allow_internet_access", "allow_internet_access: must be a boolean")
    if network is None and internet is None:
        return None
    if network is None:
        network = {}
    if not isinstance(network, dict):
        raise InvalidRequest("network", "network: must be an object")
    for key in _UNENFORCED:
        if network.get(key) not in (None, [], {}, False):
            raise InvalidRequest(f"network.{key}", f"network.{key}: not enforced by corral")
    public = network.get("allowPublicTraffic", True)
    if not isinstance(public, bool):
        raise InvalidRequest("network.allowPublicTraffic", "network.allowPublicTraffic: must be a boolean")
    allow, deny = network.get("allowOut") or [], network.get("denyOut") or []
    if not isinstance(allow, list) or not isinstance(deny, list):
        raise InvalidRequest("network", "network.allowOut and network.denyOut: lists of addresses or CIDRs")
    if internet is False:
        deny = [*deny, "0.0.0.0/0"]
    out: dict[str, object] = {"mode": "internet", "allow_out": allow, "deny_out": deny}
    if not public:
        out["allow_public_traffic"] = False
    return out
