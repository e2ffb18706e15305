"""The host-side commands that make, scrub and remove one network slot (iproute2, nftables,
conntrack), run as root. Blocking: the slot pool runs them off the event loop.

A slot is a named network namespace (``/run/netns/corral-<tag>``) holding ``eth0`` with the
sandbox's address and a default route to the host side of a veth pair (``crv<tag>``), which
forwards (only that interface: the host's global forwarding switch is left alone) through the
slot's own chains in the machine's one nftables table (:func:`corral.core.netpolicy.render_table`).
The chains are loaded before the link comes up, so a slot is never reachable unfiltered.
"""

from __future__ import annotations

import contextlib
import ipaddress
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from corral.agent import nftlib
from corral.core.netpolicy import NO_NETWORK, SlotNet, remove_slot, render_policy, render_table

NETNS_DIR = Path("/run/netns")
_SYSCTL = Path("/proc/sys/net")
_TIMEOUT_S = 10.0


class SlotCommandFailed(Exception):
    """A command building, scrubbing or removing a slot failed; its stderr is the message."""


def tools_missing() -> list[str]:
    """The commands slots need that this host lacks (``make system-deps`` installs them)."""
    missing = [tool for tool in ("ip", "nft", "conntrack") if shutil.which(tool) is None]
    return missing if nftlib.available() else [*missing, "libnftables"]


def netns_path(slot: SlotNet) -> str:
    return str(NETNS_DIR / slot.netns)


def _run(argv: list[str], stdin: str = "", *, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)
    if check and done.returncode != 0:
        raise SlotCommandFailed(f"{' '.join(argv[:3])}: {done.stderr.strip() or done.returncode}")
    return done


def load(text: str) -> None:
    """Load an ``nft -f`` text in one transaction (all of it or none), in this process."""
    try:
        nftlib.run(text)
    except nftlib.NftError as exc:
        raise SlotCommandFailed(f"nft: {exc}") from None


def load_if_free(text: str) -> bool:
    """:func:`load` now, or False (nothing loaded) while another thread's transaction is running."""
    try:
        return nftlib.run_if_free(text) is not None
    except nftlib.NftError as exc:
        raise SlotCommandFailed(f"nft: {exc}") from None


def _write_sysctl(path: Path, value: str, *, required: bool) -> None:
    try:
        path.write_text(value)
    except OSError:
        if required:
            raise


def build(slot: SlotNet, operator_allow: Sequence[ipaddress.IPv4Network] = ()) -> None:
    """Make ``slot`` from nothing (whatever a crashed owner left under its names goes first), its
    chains closed: nothing leaves it until a policy is applied (``operator_allow``: the private ranges
    policies may reach, fixed for the slot's life)."""
    destroy(slot)
    load(render_table(slot, NO_NETWORK, operator_allow))
    host, sandbox = f"{slot.host_ip}/30", f"{slot.sandbox_ip}/30"
    _run(
        ["ip", "-batch", "-"],
        f"netns add {slot.netns}\n"
        f"link add {slot.host_if} type veth peer name eth0 netns {slot.netns}\n"
        f"addr add {host} dev {slot.host_if}\n",
    )
    conf = _SYSCTL / "ipv4" / "conf" / slot.host_if
    # Only packets arriving on this interface are forwarded; strict reverse-path filtering drops any
    # whose source the host would not route back through it (a second lock beside the table's).
    _write_sysctl(conf / "forwarding", "1", required=True)
    _write_sysctl(conf / "rp_filter", "1", required=False)
    _write_sysctl(_SYSCTL / "ipv6" / "conf" / slot.host_if / "disable_ipv6", "1", required=False)
    _run(["ip", "link", "set", slot.host_if, "up"])
    _run(
        ["ip", "-n", slot.netns, "-batch", "-"],
        f"link set lo up\naddr add {sandbox} dev eth0\nlink set eth0 up\nroute add default via {slot.host_ip}\n",
    )


def pids_inside(slot: SlotNet) -> list[int]:
    done = _run(["ip", "netns", "pids", slot.netns], check=False)
    return [int(p) for p in done.stdout.split() if p.isdigit()]


def scrub(slot: SlotNet) -> None:
    """Make a returned slot carry nothing of its last sandbox: its chains closed again, its
    connection-tracking entries and neighbour entries gone. Refuses (:class:`SlotCommandFailed`)
    while any process is still inside: such a slot is destroyed, never reused."""
    inside = pids_inside(slot)
    if inside:
        raise SlotCommandFailed(f"slot {slot.netns} still holds processes {inside[:5]}")
    load(render_policy(slot, NO_NETWORK))
    for direction in ("-s", "-d"):
        # Exit status 1 only says there was nothing to delete.
        _run(["conntrack", "-D", direction, str(slot.sandbox_ip)], check=False)
    _run(["ip", "neigh", "flush", "dev", slot.host_if], check=False)
    _run(["ip", "-n", slot.netns, "neigh", "flush", "all"], check=False)


def destroy(slot: SlotNet) -> None:
    """Remove everything of ``slot`` that exists (its link, namespace, chains and sets); silent about
    what does not."""
    _run(["ip", "link", "del", slot.host_if], check=False)
    _run(["ip", "netns", "del", slot.netns], check=False)
    with contextlib.suppress(SlotCommandFailed):
        load(remove_slot(slot))
    _run(["conntrack", "-D", "-s", str(slot.sandbox_ip)], check=False)
