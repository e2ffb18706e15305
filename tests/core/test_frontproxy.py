"""The front proxy's users mapped onto corral: the admin by group, else the one tenant their groups
name; anything else refused with a reason."""

from __future__ import annotations

from corral.core.frontproxy import FrontProxyPolicy, map_user

POLICY = FrontProxyPolicy(frozenset({"front-proxy-client"}), frozenset({"system:masters", "ops"}))


def test_an_admin_group_is_the_admin_whatever_else_it_names() -> None:
    assert map_user(POLICY, "root", ["ops", "corral:tenant:acme"]).role == "admin"
    assert map_user(FrontProxyPolicy(), "k", ["system:masters"]).role == "admin"
    assert map_user(POLICY, "x", ["system:master"]).role == "none"


def test_a_tenant_group_or_a_service_accounts_namespace_names_the_tenant() -> None:
    assert map_user(POLICY, "alice", ["system:authenticated", "corral:tenant:acme"]).tenant == "acme"
    sa = map_user(
        POLICY, "system:serviceaccount:acme:ci", ["system:serviceaccounts", "system:serviceaccounts:acme"]
    )
    assert (sa.role, sa.tenant) == ("tenant", "acme")
    # Both, naming the same tenant: that tenant.
    assert map_user(POLICY, "a", ["corral:tenant:acme", "system:serviceaccounts:acme"]).tenant == "acme"


def test_no_tenant_or_two_are_refused() -> None:
    for groups in ([], ["system:authenticated"], ["corral:tenant:"], ["corral:tenant:a", "corral:tenant:b"]):
        m = map_user(POLICY, "mallory", groups)
        assert m.role == "none" and m.tenant is None and "mallory" in m.refusal


def test_allowed_names() -> None:
    assert POLICY.trusts("front-proxy-client")
    assert not POLICY.trusts("someone-else") and not POLICY.trusts(None)
    assert FrontProxyPolicy().trusts("anyone")
