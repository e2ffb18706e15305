"""A tenant's processes hold no privilege and reach nothing of the host or of other sandboxes: no
capabilities, no new privileges, a seccomp filter, no nested user namespaces, no signals across
sandboxes, no host ports, none of the host's accounts; and input execve would refuse is a 422."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from .runtime_serve import Serve

pytestmark = pytest.mark.process


_CONNECT = """
import socket, sys
for host in sys.argv[2:]:
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect((host, int(sys.argv[1])))
        print("connected", host)
    except OSError as exc:
        print("refused", host, type(exc).__name__)
"""


def _host_addresses() -> list[str]:
    addresses = {"127.0.0.1"}
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing address
            addresses.add(s.getsockname()[0])
    except OSError:
        pass
    return sorted(addresses)


def _uid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid for {pid}")


def _status(text: str) -> dict[str, str]:
    return {k: v.strip() for k, _, v in (line.partition(":") for line in text.splitlines())}


@pytest.mark.gvisor_subset
def test_an_exec_holds_no_privilege(serve: Serve) -> None:
    sid = serve.create()
    try:
        fields = _status(serve.exec(sid, ["cat", "/proc/self/status"])["stdout"])
        assert fields["CapBnd"] == fields["CapEff"] == fields["CapPrm"] == "0000000000000000"
        if serve.gvisor:
            # The filter and no-new-privileges bind what runs on the host's kernel: the Sentry and
            # its gofer, never the guest's processes (gVisor's kernel answers their system calls).
            for pid in serve.host_pids(sid):
                host = _status(Path(f"/proc/{pid}/status").read_text())
                assert host["NoNewPrivs"] == "1" and host["Seccomp"] == "2", (pid, host)
            # Nested user namespaces are gVisor's own: their root holds nothing of the host's.
            nested_root = "echo x >> /etc/passwd || echo refused; cat /etc/shadow || echo refused"
            result = serve.exec(sid, ["unshare", "-Ur", "sh", "-c", nested_root])
            assert result["stdout"].split() == ["refused", "refused"], result
            assert serve.exec(sid, ["unshare", "-n", "true"])["exit_code"] != 0
            return
        assert fields["NoNewPrivs"] == "1"
        assert fields["Seccomp"] == "2"
        for nested in (["unshare", "-U", "true"], ["unshare", "-Ur", "id"], ["unshare", "-n", "true"]):
            result = serve.exec(sid, nested)
            assert result["exit_code"] != 0 and "uid=0" not in result["stdout"], result
    finally:
        serve.delete(sid)


@pytest.mark.gvisor_subset
def test_a_sandbox_cannot_signal_another(serve: Serve) -> None:
    attacker, victim = serve.create(), serve.create()
    try:
        victim_init = serve.init_pid(victim)
        attacker_init = serve.init_pid(attacker)
        uids = {_uid(attacker_init), _uid(victim_init)}
        if serve.gvisor:
            assert uids == {65534}, uids  # runsc runs every Sentry as nobody; guest pids are gVisor's
        else:
            assert len(uids) == 2 and not uids & {0, 65534}, uids  # each its own host uid
        # By the victim's host pid (a number the attacker could guess), then everything it may signal.
        by_pid = serve.exec(attacker, ["sh", "-c", f"kill -KILL {victim_init}"])
        assert by_pid["exit_code"] != 0, by_pid
        serve.exec(attacker, ["sh", "-c", "kill -KILL -1"])
        assert Path(f"/proc/{victim_init}").exists()
        assert serve.exec(victim, ["echo", "alive"])["stdout"] == "alive\n"
    finally:
        serve.delete(attacker)
        serve.delete(victim)


def test_a_sandbox_reaches_no_host_port(serve: Serve) -> None:
    sid = serve.create()
    try:
        addresses = _host_addresses()
        with socket.create_connection(("127.0.0.1", serve.port), timeout=2):
            pass  # the control plane does listen there, as seen from the host
        result = serve.exec(sid, ["python3", "-c", _CONNECT, str(serve.port), *addresses])
        assert result["exit_code"] == 0, result
        assert [line.split()[0] for line in result["stdout"].splitlines()] == ["refused"] * len(addresses)
    finally:
        serve.delete(sid)


def test_the_hosts_accounts_are_not_visible(serve: Serve) -> None:
    sid = serve.create()
    try:
        shadow = serve.exec(sid, ["cat", "/etc/shadow"])
        assert shadow["exit_code"] != 0 and shadow["stdout"] == ""
        passwd = serve.exec(sid, ["cat", "/etc/passwd"])["stdout"]
        host_users = {line.split(":")[0] for line in Path("/etc/passwd").read_text().splitlines()}
        inside = {line.split(":")[0] for line in passwd.splitlines()}
        assert inside == {"root", "user", "nobody"}
        assert host_users - inside, "the host has accounts of its own that stay hidden"
        etc = set(serve.exec(sid, ["ls", "-A", "/etc"])["stdout"].split())
        assert len(etc) < len(os.listdir("/etc"))
    finally:
        serve.delete(sid)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"command": ["echo", "x" * 200_000]}, "command"),
        ({"command": ["true"], "env": {"BIG": "v" * 200_000}}, "env"),
        ({"command": ["true"], "env": {"A=B": "c"}}, "env"),
        ({"command": ["true"], "env": {"A": "nul\u0000here"}}, "env"),
        ({"command": ["true"], "cwd": "/tmp\u0000/etc"}, "cwd"),
    ],
)
def test_what_execve_would_refuse_is_a_422(serve: Serve, body: dict[str, object], field: str) -> None:
    sid = serve.create()
    try:
        r = serve.tenant.post(f"/v1/sandboxes/{sid}/exec", json=body)
        assert r.status_code == 422, r.text
        assert r.json()["error"]["code"] == "invalid_request"
        assert field in json.dumps(r.json()["error"]["details"])
        assert serve.exec(sid, ["true"])["exit_code"] == 0
    finally:
        serve.delete(sid)
