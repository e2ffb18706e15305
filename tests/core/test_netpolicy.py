"""Egress policies from their wire form, and the chains each renders to (pure)."""

from __future__ import annotations

import ipaddress

import pytest

from corral.core.netpolicy import (
    DEFAULT_SLOT_RANGE,
    INTERNET,
    NO_NETWORK,
    TABLE,
    EgressPolicy,
    PolicyError,
    SlotNet,
    denies_all,
    dns_verdict,
    names_match,
    parse_policy,
    remove_slot,
    render_policy,
    render_table,
    resolved_elements,
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
        ({"deny_out": ["10.0.0.0/8", "metadata.google.internal"]}, "deny_out[1]", True),
        ({"allow_out": ["not a name"]}, "allow_out[0]", False),
        ({"allow_out": ["-bad.example"]}, "allow_out[0]", False),
        ({"allow_out": ["a." * 130 + "com"]}, "allow_out[0]", False),
        ({"allow_out": ["ex*ample.com"]}, "allow_out[0]", False),
        ({"mode": "none", "allow_out": ["example.com"]}, "mode", False),
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


def test_names_in_allow_out_are_kept_apart_from_addresses_and_round_trip() -> None:
    policy = parse_policy({"allow_out": ["PyPI.org.", "*.pythonhosted.org", "198.51.100.7", "pypi.org"]})
    assert policy.allow_hosts == ("pypi.org", "*.pythonhosted.org")
    assert [str(n) for n in policy.allow_out] == ["198.51.100.7/32"]
    assert parse_policy(policy.to_dict()) == policy


def test_a_wildcard_covers_the_names_under_it_and_not_itself_nor_lookalikes() -> None:
    rules = ("pypi.org", "*.pythonhosted.org")
    assert names_match(rules, "PYPI.ORG.")
    assert names_match(rules, "files.pythonhosted.org")
    assert names_match(rules, "a.b.pythonhosted.org")
    assert not names_match(rules, "pythonhosted.org")
    assert not names_match(rules, "evilpythonhosted.org")
    assert not names_match(rules, "pypi.org.evil.com")
    assert not names_match(rules, "xpypi.org")


def test_what_the_resolver_answers_follows_the_policy() -> None:
    closed = parse_policy({"allow_out": ["pypi.org"], "deny_out": ["0.0.0.0/0"]})
    halves = parse_policy({"allow_out": ["pypi.org"], "deny_out": ["0.0.0.0/1", "128.0.0.0/1"]})
    open_ = parse_policy({"allow_out": ["pypi.org"], "deny_out": ["203.0.113.0/24"]})
    assert denies_all(closed) and denies_all(halves) and not denies_all(open_)
    for policy in (closed, halves, open_):
        assert dns_verdict(policy, "pypi.org") == "allow"
    # An unlisted name is never sent upstream when nothing unlisted is reachable anyway.
    assert dns_verdict(closed, "exfiltrate.attacker.example") == "refuse"
    assert dns_verdict(halves, "example.com") == "refuse"
    assert dns_verdict(open_, "example.com") == "forward"
    assert dns_verdict(INTERNET, "example.com") == "forward"
    assert dns_verdict(NO_NETWORK, "pypi.org") == "refuse"


def _rules(text: str, slot: SlotNet, kind: str) -> list[str]:
    """The rules ``text`` adds to ``slot``'s ``kind`` of chain, in order."""
    head = f"add rule inet {TABLE} {slot.own(kind)} "
    return [line.removeprefix(head) for line in text.splitlines() if line.startswith(head)]


def test_a_policy_update_touches_the_lists_and_verdict_only() -> None:
    slot = slot_net(3)
    text = render_policy(slot, parse_policy({"allow_out": ["198.51.100.0/24", "pypi.org"]}))
    assert "delete" not in text and "table" not in text and slot.own("egress") not in text
    assert f"flush set inet {TABLE} {slot.own('resolved')}" in text  # names of the last policy forgotten
    assert f"add element inet {TABLE} {slot.own('allow')} {{ 198.51.100.0/24 }}" in text
    closed = render_policy(slot, NO_NETWORK)
    assert "accept" not in closed and "add element" not in closed
    added = resolved_elements(slot, [ipaddress.IPv4Address("198.51.100.9")], 5)
    assert "198.51.100.9 timeout 3600s" in added  # a short TTL is held to the floor
    assert f"inet {TABLE} {slot.own('resolved')} {{" in added


def test_dns_goes_to_the_slots_resolver_only() -> None:
    slot = slot_net(3)
    table = render_table(slot, INTERNET)
    accepted = (
        f"ip saddr {slot.sandbox_ip} ip daddr {slot.host_ip} meta l4proto {{ tcp, udp }} th dport 53 accept"
    )
    assert accepted in _rules(table, slot, "host")
    egress = _rules(table, slot, "egress")
    assert egress.index("meta l4proto { tcp, udp } th dport 53 reject with icmpx type admin-prohibited") < (
        egress.index(f"goto {slot.own('policy')}")
    )


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
    egress = "\n".join(_rules(text, slot, "egress"))
    order = ["ip saddr != 10.231.0.14 drop", "@never", str(DEFAULT_SLOT_RANGE), "10.1.0.0/16", "@private"]
    positions = [egress.index(rule) for rule in order]
    assert positions == sorted(positions)
    assert egress.endswith(f"goto {slot.own('policy')}")
    policy = "\n".join(_rules(text, slot, "policy"))
    assert policy.index(f"@{slot.own('allow')} accept") < policy.index(f"@{slot.own('deny')} reject")
    assert "169.254.0.0/16" in text
    # The host itself answers only what it opened; nothing from outside is forwarded in.
    assert _rules(text, slot, "host")[0] == "ct state established accept"
    assert _rules(text, slot, "host")[-1] == "drop"
    assert "oifname @slot_ifs ct state != established drop" in text
    # Mode none on a slot forwards nothing at all.
    closed = render_table(slot, NO_NETWORK)
    assert _rules(closed, slot, "policy") == ["reject with icmpx type admin-prohibited"]


def test_a_slot_is_dispatched_to_its_own_chains_and_removed_whole() -> None:
    one, two = slot_net(3), slot_net(4)
    text = render_table(one, INTERNET)
    for name, element in [
        ("slot_ifs", f'"{one.host_if}"'),
        ("host_by_if", f'"{one.host_if}" : goto {one.own("host")}'),
        ("egress_by_if", f'"{one.host_if}" : goto {one.own("egress")}'),
        ("nat_by_addr", f"{one.sandbox_ip} : goto {one.own('nat')}"),
    ]:
        added = f"add element inet {TABLE} {name} {{ {element} }}"
        # Replaced in one transaction: whatever was there removed first, then made again.
        assert text.rindex(added) > text.index(f"delete element inet {TABLE} {name} {{ {element} }}")
    assert two.tag not in text
    # The machine's hooks are the table's alone: a slot adds no base chain of its own.
    assert text.count("hook ") == 3
    removed = remove_slot(one)
    kinds = ("\tset ", "\tchain ")
    owned = {line.split()[1] for line in text.splitlines() if line.startswith(kinds) and one.tag in line}
    deleted = {
        line.split()[-1] for line in removed.splitlines() if line.startswith(("delete set", "delete chain"))
    }
    assert len(owned) == 7 and deleted == owned
    assert "hook" not in removed and "flush chain inet corral to_host" not in removed
