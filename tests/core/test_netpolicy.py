"""Egress policies from their wire form, and the table each renders to (pure)."""

from __future__ import annotations

import ipaddress

import pytest

from corral.core.netpolicy import (
    DEFAULT_SLOT_RANGE,
    INTERNET,
    NO_NETWORK,
    EgressPolicy,
    PolicyError,
    parse_policy,
    render_table,
    slot_count,
    slot_net,
)


def test_the_default_is_no_network_and_lists_imply_internet() -> None:
    assert parse_policy({}) == NO_NETWORK
    assert not NO_NETWORK.attached
    assert parse_policy({"mode": "internet"}) == INTERNET
    listed = parse_policy({"deny_out": ["0.0.0.0/0"], "allow_out": ["198.51.100.7", "198.51.100.0/24"]})
    assert listed.mode == "internet"
    assert [str(n) for n in listed.allow_out] == ["198.51.100.7/32", "198.51.100.0/24"]
    assert parse_policy(listed.to_dict()) == listed


@pytest.mark.parametrize(
    ("body", "field", "hostname"),
    [
        ({"allow_out": ["example.com"]}, "allow_out[0]", True),
        ({"deny_out": ["10.0.0.0/8", "metadata.google.internal"]}, "deny_out[1]", True),
        ({"allow_out": ["2001:db8::/32"]}, "allow_out[0]", False),
        ({"allow_out": [7]}, "allow_out[0]", False),
        ({"allow_out": "1.2.3.4"}, "allow_out", False),
        ({"mode": "none", "allow_out": ["1.2.3.4"]}, "mode", False),
        ({"mode": "everything"}, "mode", False),
        ({"allowOut": []}, "allowOut", False),
        ({"allow_out": [f"198.51.{i // 256}.{i % 256}" for i in range(2000)]}, "allow_out", False),
    ],
)
def test_what_cannot_be_enforced_is_refused(body: dict[str, object], field: str, hostname: bool) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(body)
    assert (caught.value.field, caught.value.hostname) == (field, hostname)


def test_slots_tile_the_range_without_overlap() -> None:
    assert slot_count() == 16384
    first, last = slot_net(0), slot_net(slot_count() - 1)
    assert (str(first.host_ip), str(first.sandbox_ip)) == ("10.231.0.1", "10.231.0.2")
    assert str(last.sandbox_ip) == "10.231.255.254"
    names = {slot_net(i).host_if for i in range(0, slot_count(), 97)}
    assert len(names) == len(range(0, slot_count(), 97)) and all(len(n) <= 15 for n in names)
    with pytest.raises(ValueError):
        slot_net(slot_count())


def test_the_table_denies_the_fixed_set_before_the_policy() -> None:
    slot = slot_net(3)
    text = render_table(
        slot,
        EgressPolicy(
            "internet", (ipaddress.IPv4Network("10.1.2.3/32"),), (ipaddress.IPv4Network("0.0.0.0/0"),)
        ),
        [ipaddress.IPv4Network("10.1.0.0/16")],
    )
    egress = text[text.index("chain egress") :]
    order = ["ip saddr != 10.231.0.14 drop", "@never", "@sandboxes", "@operator_allow", "@private"]
    positions = [egress.index(rule) for rule in order]
    assert positions == sorted(positions)
    policy = text[text.index("chain tenant_policy") :]
    assert policy.index("@allow_out accept") < policy.index("@deny_out reject")
    assert "169.254.0.0/16" in text and str(DEFAULT_SLOT_RANGE) in text
    # The host itself answers only what it opened; nothing from outside is forwarded in.
    assert f'iifname "{slot.host_if}" ct state established accept' in text
    assert f'oifname "{slot.host_if}" drop' in text
    # Mode none on a slot forwards nothing at all.
    closed = render_table(slot, NO_NETWORK)
    assert "accept\n\t}\n\tchain masquerade_out" not in closed
    assert closed.count("table inet corral_") == 3  # create, delete, define: one transaction
