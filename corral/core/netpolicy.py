"""A sandbox's egress policy as data, and the nftables chains that enforce it on the host side.

A policy is one of two modes:

* ``none`` (the default): the sandbox has no network interface at all, loopback only, as every
  sandbox had before slots. It is the default because it is the smallest surface there is (no route,
  no address, nothing to filter), it costs no slot, and nothing a create did not ask for appears.
* ``internet``: the sandbox gets a slot (a network namespace of its own, a veth pair, an address
  pair) and may reach public addresses, subject to ``allow_out`` and ``deny_out`` (CIDRs) with E2B's
  precedence: an address in ``allow_out`` is allowed even when ``deny_out`` covers it, so
  ``deny_out=["0.0.0.0/0"]`` with an ``allow_out`` list is an allow-list.

Whatever the policy, the slot's chains drop, before the policy is consulted: every packet to the
host itself (its addresses, its loopback services: the input hook, answered only for connections the
host opened), loopback and link-local destinations (169.254.0.0/16, the metadata address), every
sandbox of the machine (the whole slot range), IPv6, and sources other than the slot's own address
(spoofing); and private, shared, reserved and multicast ranges unless the operator's allow-list names
them. Nothing from outside reaches the sandbox through the host unless it answers the sandbox's own
connection.

Inbound, ``allow_public_traffic`` (E2B's ``allowPublicTraffic``, true by default) says whether a
sandbox's ports answer anyone who reaches a replica, or only requests carrying the sandbox's traffic
token. Ports need an interface, so it is false only beside mode ``internet``.

Hostnames in ``allow_out`` (``pypi.org``, or ``*.pythonhosted.org`` for every name under it) are
enforced by resolution the sandbox cannot bypass: its only resolver is corral's, on the slot's host
side (``corral.agent.dns``), which answers such a name and puts the addresses it answered into the
slot's ``resolved`` set, accepted beside ``allow_out`` (so, as for addresses, allow wins); DNS to any
other address is dropped, whatever the policy. :func:`dns_verdict` says what the resolver answers.
Hostnames in ``deny_out`` are refused (:class:`PolicyError`): a sandbox can reach a name's addresses
by number, so denying a name would be a silent "allow"; deny addresses, or deny ``0.0.0.0/0`` and
allow the names.

Pure: no I/O. The agent's slot pool (``corral.agent.netslots``) loads what :func:`render_table`
returns with ``nft -f``, one transaction, so a policy changes atomically on a running sandbox.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

NetworkMode = Literal["none", "internet"]
MODES: tuple[NetworkMode, ...] = ("none", "internet")
MAX_RULES = 1024  # entries per list: a table of that size still loads in milliseconds
# Addresses the resolver answered for allowed names: how many a slot keeps, and how long each stays
# reachable after its last answer (at least an hour whatever the record's TTL: a connection opened
# to it must outlive a short TTL, and the set is flushed at every change of policy anyway).
MAX_RESOLVED = 4096
RESOLVED_FLOOR_S = 3600
RESOLVED_CAP_S = 86400
DNS_PORT = 53

# The machine's slot range: one /30 per slot (network, host side, sandbox side, broadcast), 16,384
# slots in the /16. Inside 10.0.0.0/8, so it is private and always denied to every sandbox.
DEFAULT_SLOT_RANGE = ipaddress.IPv4Network("10.231.0.0/16")
SLOT_PREFIX = 30

# Destinations no sandbox reaches, whatever its policy or the operator's allow-list.
NEVER = (
    ipaddress.IPv4Network("0.0.0.0/8"),
    ipaddress.IPv4Network("127.0.0.0/8"),
    ipaddress.IPv4Network("169.254.0.0/16"),
    ipaddress.IPv4Network("255.255.255.255/32"),
)
# Destinations denied unless the operator's allow-list names them: RFC 1918, shared address space,
# IETF protocol assignments, benchmarking, multicast and the reserved block.
PRIVATE = (
    ipaddress.IPv4Network("10.0.0.0/8"),
    ipaddress.IPv4Network("100.64.0.0/10"),
    ipaddress.IPv4Network("172.16.0.0/12"),
    ipaddress.IPv4Network("192.0.0.0/24"),
    ipaddress.IPv4Network("192.168.0.0/16"),
    ipaddress.IPv4Network("198.18.0.0/15"),
    ipaddress.IPv4Network("224.0.0.0/4"),
    ipaddress.IPv4Network("240.0.0.0/4"),
)


class PolicyError(ValueError):
    """A policy that cannot be enforced as given; ``field`` names the part, ``hostname`` says whether
    a hostname (rather than malformed input) was the reason."""

    def __init__(self, message: str, field: str, *, hostname: bool = False) -> None:
        super().__init__(message)
        self.field = field
        self.hostname = hostname


@dataclass(frozen=True, slots=True)
class EgressPolicy:
    mode: NetworkMode = "none"
    allow_out: tuple[ipaddress.IPv4Network, ...] = ()
    deny_out: tuple[ipaddress.IPv4Network, ...] = ()
    public: bool = True  # ports without the traffic token
    allow_hosts: tuple[str, ...] = ()  # names in allow_out, lower case, "*." for every name under one

    @property
    def attached(self) -> bool:
        """Whether the sandbox needs a slot (an interface of its own) at all."""
        return self.mode != "none"

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "mode": self.mode,
            "allow_out": [*(str(n) for n in self.allow_out), *self.allow_hosts],
            "deny_out": [str(n) for n in self.deny_out],
        }
        if not self.public:  # left out when true: the records written before it keep their form
            out["allow_public_traffic"] = False
        return out


NO_NETWORK = EgressPolicy()
INTERNET = EgressPolicy("internet")


_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")


def hostname(text: str) -> str | None:
    """``text`` as a hostname rule (lower case, no trailing dot; ``*.`` first for every name under
    one), or None when it is not one."""
    name = text.lower().removesuffix(".")
    labels = name.removeprefix("*.").split(".")
    if len(name) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        return None
    return name


def parse_targets(
    entries: Iterable[object], field: str, *, names: bool
) -> tuple[tuple[ipaddress.IPv4Network, ...], tuple[str, ...]]:
    """IPv4 addresses or CIDRs (normalised: host bits cleared) and, where ``names``, hostnames;
    duplicates dropped, order kept."""
    nets: dict[ipaddress.IPv4Network, None] = {}
    hosts: dict[str, None] = {}
    for i, entry in enumerate(entries):
        where = f"{field}[{i}]"
        if not isinstance(entry, str) or not entry.strip():
            raise PolicyError(f"{where} must be an IPv4 address, a CIDR or a hostname", where)
        text = entry.strip()
        try:
            net = ipaddress.ip_network(text, strict=False)
        except ValueError:
            name = hostname(text)
            if name is None:
                raise PolicyError(
                    f"{where} is {text!r}: neither an address, a CIDR nor a hostname", where
                ) from None
            if not names:
                raise PolicyError(
                    f"{where} is {text!r}: a name cannot be denied (the sandbox can reach its addresses "
                    "by number); deny addresses, or deny 0.0.0.0/0 and allow the names it may reach",
                    where,
                    hostname=True,
                ) from None
            hosts[name] = None
        else:
            if not isinstance(net, ipaddress.IPv4Network):
                raise PolicyError(f"{where} is {text!r}: sandboxes have IPv4 only", where)
            nets[net] = None
        if len(nets) + len(hosts) > MAX_RULES:
            raise PolicyError(f"{field} has more than {MAX_RULES} entries", field)
    return tuple(nets), tuple(hosts)


def parse_networks(entries: Iterable[object], field: str) -> tuple[ipaddress.IPv4Network, ...]:
    """IPv4 addresses or CIDRs only (an operator's allow-list)."""
    return parse_targets(entries, field, names=False)[0]


def parse_policy(data: Mapping[str, object]) -> EgressPolicy:
    """A policy from its wire form (``mode``, ``allow_out``, ``deny_out``); :class:`PolicyError` when
    it is malformed or cannot be enforced."""
    unknown = sorted(set(data) - {"mode", "allow_out", "deny_out", "allow_public_traffic"})
    if unknown:
        raise PolicyError(f"unknown network field {unknown[0]!r}", unknown[0])
    mode = data.get("mode", "internet" if data.get("allow_out") or data.get("deny_out") else "none")
    if mode not in MODES:
        raise PolicyError(f"mode must be one of {', '.join(MODES)}, got {mode!r}", "mode")
    lists: dict[str, tuple[ipaddress.IPv4Network, ...]] = {}
    hosts: tuple[str, ...] = ()
    for field in ("allow_out", "deny_out"):
        value = data.get(field) or []
        if not isinstance(value, list | tuple):
            raise PolicyError(f"{field} must be a list", field)
        lists[field], named = parse_targets(value, field, names=field == "allow_out")
        if named:
            hosts = named
    if mode == "none" and (lists["allow_out"] or lists["deny_out"] or hosts):
        raise PolicyError(
            "allow_out and deny_out need mode 'internet' (mode 'none' has no interface)", "mode"
        )
    public = data.get("allow_public_traffic", True)
    if not isinstance(public, bool):
        raise PolicyError("allow_public_traffic must be a boolean", "allow_public_traffic")
    if mode == "none" and not public:
        raise PolicyError(
            "allow_public_traffic false needs mode 'internet' (mode 'none' has no interface, no ports)",
            "allow_public_traffic",
        )
    return EgressPolicy(mode, lists["allow_out"], lists["deny_out"], public, hosts)


# -- names -------------------------------------------------------------------------------------------

DnsVerdict = Literal["allow", "forward", "refuse"]


def names_match(rules: Iterable[str], qname: str) -> bool:
    """Whether ``qname`` is one of ``rules`` (``*.example.com``: every name under example.com, not
    example.com itself)."""
    name = qname.lower().removesuffix(".")
    return any(name == rule or (rule.startswith("*.") and name.endswith(rule[1:])) for rule in rules)


def denies_all(policy: EgressPolicy) -> bool:
    """Whether ``deny_out`` covers every IPv4 address (what is reachable is then only what is allowed)."""
    covered = sum(net.num_addresses for net in ipaddress.collapse_addresses(policy.deny_out))
    return covered == 1 << 32


def dns_verdict(policy: EgressPolicy, qname: str) -> DnsVerdict:
    """What the slot's resolver does with a query for ``qname``:

    * ``allow``: a name of ``allow_out``: forwarded, and the addresses answered become reachable;
    * ``forward``: any other name when the policy leaves some public addresses open: forwarded, and
      the filter holds each connection to what it answers as it holds any address;
    * ``refuse``: any other name when the policy denies everything it does not allow: answered
      REFUSED and never forwarded (a name sent upstream is a channel out of the sandbox)."""
    if not policy.attached:
        return "refuse"
    if names_match(policy.allow_hosts, qname):
        return "allow"
    return "refuse" if denies_all(policy) else "forward"


# -- slots -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SlotNet:
    """One slot's names and addresses, all derived from its index in the machine's slot range, so two
    agents on one machine holding different indices never collide on a name or an address."""

    index: int
    host_ip: ipaddress.IPv4Address
    sandbox_ip: ipaddress.IPv4Address
    slot_range: ipaddress.IPv4Network

    @property
    def tag(self) -> str:
        return f"{int(self.sandbox_ip):08x}"

    @property
    def netns(self) -> str:
        return f"corral-{self.tag}"

    @property
    def host_if(self) -> str:
        return f"crv{self.tag}"  # 11 characters: within the kernel's 15

    def own(self, kind: str) -> str:
        """The name of this slot's ``kind`` of chain or set in the machine's table (:data:`TABLE`)."""
        return f"{kind}_{self.tag}"


def slot_count(slot_range: ipaddress.IPv4Network = DEFAULT_SLOT_RANGE) -> int:
    return 1 << max(0, SLOT_PREFIX - slot_range.prefixlen)


def slot_net(index: int, slot_range: ipaddress.IPv4Network = DEFAULT_SLOT_RANGE) -> SlotNet:
    if not 0 <= index < slot_count(slot_range):
        raise ValueError(f"slot {index} is outside {slot_range}")
    base = int(slot_range.network_address) + 4 * index
    return SlotNet(index, ipaddress.IPv4Address(base + 1), ipaddress.IPv4Address(base + 2), slot_range)


# -- the table ---------------------------------------------------------------------------------------

# The machine's one table, shared by every slot of every agent: one set of hooks, which every packet
# of the host passes, dispatching by a slot's interface (leaving, by its address: the postrouting
# hook knows no input interface) to that slot's own chains. A table per slot hooked every packet of
# the host once per slot: 256 of them took a loopback round trip from 18 to 92 us.
TABLE = "corral"

_REJECT = "reject with icmpx type admin-prohibited"
_DNS = f"meta l4proto {{ tcp, udp }} th dport {DNS_PORT}"
_INTERVALS = "type ipv4_addr; flags interval; auto-merge;"
_Object = tuple[str, str, str]  # kind (chain, set, map), name, what it is declared with

_DISPATCH: tuple[_Object, ...] = (
    ("set", "slot_ifs", "type ifname;"),
    ("map", "host_by_if", "type ifname : verdict;"),
    ("map", "egress_by_if", "type ifname : verdict;"),
    ("map", "nat_by_addr", "type ipv4_addr : verdict;"),
    ("set", "never", _INTERVALS),
    ("set", "private", _INTERVALS),
)
# The base chains and their rules. Into a slot, only answers to what its sandbox (or the host) opened;
# out of it, its own chains. Every drop of every slot comes before any accept: a packet from one slot
# into another meets the second's inbound rule before the first's egress.
_HOOKS: dict[str, tuple[str, tuple[str, ...]]] = {
    "to_host": ("type filter hook input priority filter - 10; policy accept;", ("iifname vmap @host_by_if",)),
    "through_host": (
        "type filter hook forward priority filter - 10; policy accept;",
        ("oifname @slot_ifs ct state != established drop", "iifname vmap @egress_by_if"),
    ),
    "masquerade_out": (
        "type nat hook postrouting priority srcnat; policy accept;",
        ("ip saddr vmap @nat_by_addr",),
    ),
}


def _declare(objects: Iterable[_Object]) -> str:
    """Made where missing, left as they are where present (``nft``'s ``add``)."""
    inside = "".join(f"\t{kind} {name} {{ {spec} }}\n" for kind, name, spec in objects)
    return f"table inet {TABLE} {{\n{inside}}}\n"


def _elements(name: str, nets: Sequence[ipaddress.IPv4Network]) -> str:
    flush = f"flush set inet {TABLE} {name}\n"
    return flush + (f"add element inet {TABLE} {name} {{ {', '.join(map(str, nets))} }}\n" if nets else "")


def _rules(chain: str, rules: Iterable[str]) -> str:
    return f"flush chain inet {TABLE} {chain}\n" + "".join(
        f"add rule inet {TABLE} {chain} {r}\n" for r in rules
    )


def _base() -> str:
    """The machine's table, its dispatch and its fixed sets made where missing, its base chains'
    rules put back (flushed and added in one transaction: no packet meets them empty). What slots
    hold is left alone, so any agent may load it at any time."""
    hooks = [("chain", name, hook) for name, (hook, _) in _HOOKS.items()]
    return "".join(
        [
            _declare([*_DISPATCH, *hooks]),
            _elements("never", NEVER),
            _elements("private", PRIVATE),
            *(_rules(name, rules) for name, (_, rules) in _HOOKS.items()),
        ]
    )


def _own_objects(slot: SlotNet) -> list[_Object]:
    resolved = f"type ipv4_addr; flags timeout; size {MAX_RESOLVED};"
    sets = [("set", slot.own(kind), _INTERVALS) for kind in ("allow", "deny")]
    chains = [("chain", slot.own(kind), "") for kind in ("host", "egress", "policy", "nat")]
    return [*sets, ("set", slot.own("resolved"), resolved), *chains]


def _own_dispatch(slot: SlotNet) -> list[tuple[str, str]]:
    iface = f'"{slot.host_if}"'
    return [
        ("slot_ifs", iface),
        ("host_by_if", f"{iface} : goto {slot.own('host')}"),
        ("egress_by_if", f"{iface} : goto {slot.own('egress')}"),
        ("nat_by_addr", f"{slot.sandbox_ip} : goto {slot.own('nat')}"),
    ]


def _verdict(slot: SlotNet, policy: EgressPolicy) -> list[str]:
    """The rules of the slot's ``policy`` chain: what ``policy`` lets out of what the fixed rules
    before it did not already drop."""
    if not policy.attached:
        return [_REJECT]
    return [
        f"ip daddr @{slot.own('allow')} accept",
        f"ip daddr @{slot.own('resolved')} accept",
        f"ip daddr @{slot.own('deny')} {_REJECT}",
        "accept",
    ]


def render_policy(slot: SlotNet, policy: EgressPolicy) -> str:
    """The ``nft -f`` text that puts ``policy`` in force on ``slot``'s built chains (from
    :func:`render_table`), in one transaction: its two lists, its verdict, and no address resolved
    under an earlier policy. A few set and chain operations: nothing else is rebuilt."""
    return "".join(
        [
            _elements(slot.own("allow"), policy.allow_out),
            _elements(slot.own("deny"), policy.deny_out),
            f"flush set inet {TABLE} {slot.own('resolved')}\n",
            _rules(slot.own("policy"), _verdict(slot, policy)),
        ]
    )


def resolved_elements(slot: SlotNet, addresses: Iterable[ipaddress.IPv4Address], ttl_s: int) -> str:
    """The ``nft -f`` text that makes ``addresses`` (answered for an allowed name) reachable from
    ``slot`` for ``ttl_s`` within the floor and cap (an address answered again is refreshed)."""
    timeout = min(max(ttl_s, RESOLVED_FLOOR_S), RESOLVED_CAP_S)
    listed = ", ".join(f"{a} timeout {timeout}s" for a in addresses)
    # Deleting first refreshes an element already present (add alone keeps its old expiry); a
    # delete of an absent element fails, so each is added before it is deleted and added again.
    name = slot.own("resolved")
    return "".join(f"{op} element inet {TABLE} {name} {{ {listed} }}\n" for op in ("add", "delete", "add"))


def render_table(
    slot: SlotNet, policy: EgressPolicy, operator_allow: Sequence[ipaddress.IPv4Network] = ()
) -> str:
    """The ``nft -f`` text that replaces ``slot``'s chains and sets in the machine's table (made if
    missing) with ones enforcing ``policy``, and dispatches its packets to them, in one transaction.
    A policy of mode ``none`` on a slot renders chains that forward nothing (a slot in the pool, or
    one being scrubbed)."""
    iface, me, gateway = f'"{slot.host_if}"', str(slot.sandbox_ip), str(slot.host_ip)
    to_policy = f"goto {slot.own('policy')}"
    operator = f"ip daddr {{ {', '.join(map(str, operator_allow))} }} {to_policy}"
    chains = {
        # The host itself: only answers to connections the host opened (ports it forwards), and the
        # slot's resolver (corral.agent.dns) on the host side's address, to the sandbox alone.
        "host": [
            "ct state established accept",
            f"ip saddr {me} ip daddr {gateway} {_DNS} accept",
            f"meta nfproto ipv4 {_REJECT}",
            "drop",
        ],
        "egress": [
            "meta nfproto != ipv4 drop",
            f"ip saddr != {me} drop",
            # Names are answered by the slot's resolver only, or a name rule would be a suggestion.
            f"{_DNS} {_REJECT}",
            f"tcp dport 853 {_REJECT}",  # DNS over TLS
            f"ip daddr @never {_REJECT}",
            f"ip daddr {slot.slot_range} {_REJECT}",  # every sandbox of the machine
            *([operator] if operator_allow else []),
            f"ip daddr @private {_REJECT}",
            to_policy,
        ],
        "policy": _verdict(slot, policy),
        "nat": [f"oifname != {iface} masquerade"],
    }
    return "".join(
        [
            _base(),
            remove_slot(slot),
            _declare(_own_objects(slot)),
            _elements(slot.own("allow"), policy.allow_out),
            _elements(slot.own("deny"), policy.deny_out),
            *(_rules(slot.own(kind), rules) for kind, rules in chains.items()),
            *(f"add element inet {TABLE} {name} {{ {element} }}\n" for name, element in _own_dispatch(slot)),
        ]
    )


def remove_slot(slot: SlotNet) -> str:
    """The ``nft -f`` text that removes ``slot``'s chains, sets and dispatch whether or not they
    exist (each is made, if missing, before it is deleted: a delete of what is absent fails the
    transaction), and the table of its own an earlier corral gave a slot."""
    dispatch = _own_dispatch(slot)
    own = _own_objects(slot)
    legacy = f"corral_{slot.tag}"
    return "".join(
        [
            _declare([*_DISPATCH, *own]),
            *(f"add element inet {TABLE} {name} {{ {element} }}\n" for name, element in dispatch),
            *(f"delete element inet {TABLE} {name} {{ {element} }}\n" for name, element in dispatch),
            *(f"flush chain inet {TABLE} {name}\n" for kind, name, _ in own if kind == "chain"),
            *(f"delete {kind} inet {TABLE} {name}\n" for kind, name, _ in own),
            f"table inet {legacy}\ndelete table inet {legacy}\n",
        ]
    )
