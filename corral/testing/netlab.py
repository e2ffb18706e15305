"""An "internet" for network tests, on this machine only: a network namespace of the test's own,
joined to the host by a veth pair, holding HTTP servers on addresses that exist nowhere else
(documentation ranges, TEST-NET-2 and -3, and one private address), routed by the host to it alone.
Nothing a test sends through it leaves the machine.

Each server answers ``GET /`` with the address it was reached at, and ``GET /stream`` with one line
every 50 ms for as long as the client reads (for changes of policy under an open connection).

A DNS server at :data:`DNS` (port 53, UDP and TCP) answers ``allowed.lab`` with :data:`ALLOWED`,
``denied.lab`` with :data:`DENIED`, every other name NXDOMAIN, and ``count.lab`` (TXT) with how many
queries it has had. Needs root, ``ip`` and ``python3`` with dnslib (the test run's own).
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

ALLOWED = ipaddress.IPv4Address("198.51.100.10")
DENIED = ipaddress.IPv4Address("198.51.100.11")
PRIVATE = ipaddress.IPv4Address("10.98.0.10")
DNS = ipaddress.IPv4Address("198.51.100.53")
NAMES = {"allowed.lab": ALLOWED, "denied.lab": DENIED}
PORT = 8080
_LINK_HOST = "203.0.113.1/30"
_LINK_LAB = "203.0.113.2/30"

_SERVER = r"""
import http.server, socketserver, sys, time

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        me = self.connection.getsockname()[0].encode()
        if self.path == "/stream":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                while True:
                    line = me + b"\n"
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                    self.wfile.flush()
                    time.sleep(0.05)
            except OSError:
                return
        self.send_response(200)
        self.send_header("Content-Length", str(len(me)))
        self.end_headers()
        self.wfile.write(me)

    def log_message(self, *args):
        pass

class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True

server = Server(("0.0.0.0", int(sys.argv[1])), Handler)
print("ready", flush=True)
server.serve_forever()
"""


_DNS_SERVER = r"""
import socket, sys, threading
from dnslib import A, QTYPE, RCODE, RR, TXT, DNSRecord

names = dict(arg.split("=") for arg in sys.argv[2:])
count = 0

def answer(data):
    global count
    query = DNSRecord.parse(data)
    name = str(query.q.qname).rstrip(".")
    reply = query.reply()
    if name == "count.lab":
        reply.add_answer(RR(query.q.qname, QTYPE.TXT, rdata=TXT(str(count)), ttl=0))
    else:
        count += 1
        if name in names and query.q.qtype == QTYPE.A:
            reply.add_answer(RR(query.q.qname, QTYPE.A, rdata=A(names[name]), ttl=5))
        elif name not in names:
            reply.header.rcode = RCODE.NXDOMAIN
    return reply.pack()

def stream(conn):
    with conn:
        while len(size := conn.recv(2, socket.MSG_WAITALL)) == 2:
            out = answer(conn.recv(int.from_bytes(size, "big"), socket.MSG_WAITALL))
            conn.sendall(len(out).to_bytes(2, "big") + out)

def streams(listener):
    while True:
        threading.Thread(target=stream, args=(listener.accept()[0],), daemon=True).start()

tcp = socket.create_server((sys.argv[1], 53))
threading.Thread(target=streams, args=(tcp,), daemon=True).start()
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.bind((sys.argv[1], 53))
print("ready", flush=True)
while True:
    data, peer = udp.recvfrom(4096)
    try:
        udp.sendto(answer(data), peer)
    except Exception:
        pass
"""


@dataclass(frozen=True)
class Lab:
    netns: str
    host_if: str
    addresses: tuple[ipaddress.IPv4Address, ...]

    def url(self, address: ipaddress.IPv4Address, path: str = "/") -> str:
        return f"http://{address}:{PORT}{path}"

    def dns_queries(self) -> int:
        """How many queries the lab's DNS server has had (asked from the host, not counted)."""
        from dnslib import DNSRecord

        answer = DNSRecord.question("count.lab", "TXT").send(str(DNS), 53, timeout=5)
        return int(str(DNSRecord.parse(answer).rr[0].rdata).strip('"'))


def _ip(*args: str, stdin: str | None = None) -> None:
    subprocess.run(["ip", *args], input=stdin, text=True, check=True, capture_output=True)


def _serve(servers: list[subprocess.Popen[str]], netns: str, what: str, code: str, *args: str) -> None:
    """Start ``code`` in the lab's namespace (noted in ``servers``), once it says it is ready."""
    server = subprocess.Popen(
        ["ip", "netns", "exec", netns, sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        text=True,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )
    servers.append(server)
    assert server.stdout is not None
    if server.stdout.readline().strip() != "ready":
        raise RuntimeError(f"the lab's {what} server did not start")


@contextmanager
def internet() -> Iterator[Lab]:
    """The lab, torn down (namespace, link, routes, server) when the block ends."""
    tag = uuid.uuid4().hex[:8]
    name, host_if = f"corral-lab-{tag}", f"crl{tag}"
    addresses = (ALLOWED, DENIED, PRIVATE, DNS)
    servers: list[subprocess.Popen[str]] = []
    try:
        _ip("netns", "add", name)
        _ip("link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", name)
        _ip("addr", "add", _LINK_HOST, "dev", host_if)
        _ip("link", "set", host_if, "up")
        lab_cmds = f"link set lo up\naddr add {_LINK_LAB} dev eth0\nlink set eth0 up\n"
        lab_cmds += "".join(f"addr add {a}/32 dev eth0\n" for a in addresses)
        lab_cmds += f"route add default via {_LINK_HOST.split('/')[0]}\n"
        _ip("-n", name, "-batch", "-", stdin=lab_cmds)
        for a in addresses:
            _ip("route", "add", f"{a}/32", "via", _LINK_LAB.split("/")[0], "dev", host_if)
        # Replies from the lab are forwarded back to the sandboxes' slots: this link only.
        with open(f"/proc/sys/net/ipv4/conf/{host_if}/forwarding", "w") as f:
            f.write("1")
        _serve(servers, name, "HTTP", _SERVER, str(PORT))
        _serve(servers, name, "DNS", _DNS_SERVER, str(DNS), *(f"{n}={a}" for n, a in NAMES.items()))
        yield Lab(name, host_if, addresses)
    finally:
        for process in servers:
            process.kill()
            process.wait()
        subprocess.run(["ip", "link", "del", host_if], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
