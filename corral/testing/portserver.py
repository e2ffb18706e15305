"""A server for tests to start inside a sandbox (the sandbox's own python3, standard library only),
listening on every address of the sandbox, so its port is reached from outside through the slot:

* ``GET /hello...``: ``hello {path} {host}`` (the path and Host header it was asked with);
* ``GET /bytes?n=N``: N bytes (a repeated pattern) streamed chunked, for long bodies out;
* ``POST /count``: reads the whole body as it comes, answers ``{bytes} {sha256}``, for long bodies in;
* ``GET /ws`` with ``Upgrade: websocket``: echoes every text or binary message back (RFC 6455,
  unfragmented frames, masked from the client) until the client closes.

:func:`start_argv` is the command that starts it detached (it outlives the exec that started it)
and returns once it listens.
"""

from __future__ import annotations

SERVER = r"""
import base64, hashlib, http.server, socketserver, struct, sys, urllib.parse

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body are two writes: with Nagle's algorithm the body waits for the headers' ACK,
    # which the reader's delayed ACK holds up to 40 ms: what a port's latency measures is the path, not that.
    disable_nagle_algorithm = True

    def log_message(self, *args):
        pass

    def _send(self, status, body, ctype="text/plain"):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        if self.headers.get("Upgrade", "").lower() == "websocket":
            return self._websocket()
        if url.path == "/bytes":
            n = int(urllib.parse.parse_qs(url.query)["n"][0])
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            chunk = bytes(range(256)) * 256
            while n > 0:
                part = chunk[: min(n, len(chunk))]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                n -= len(part)
            self.wfile.write(b"0\r\n\r\n")
            return
        self._send(200, f"hello {self.path} {self.headers.get('Host')}".encode())

    def do_POST(self):
        digest, total = hashlib.sha256(), 0
        left = int(self.headers.get("Content-Length", "0"))
        while left > 0:
            data = self.rfile.read(min(left, 1 << 16))
            if not data:
                break
            digest.update(data)
            total += len(data)
            left -= len(data)
        self._send(200, f"{total} {digest.hexdigest()}".encode())

    def _websocket(self):
        key = self.headers["Sec-WebSocket-Key"].encode()
        accept = base64.b64encode(hashlib.sha1(key + GUID).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.end_headers()
        self.wfile.flush()
        r, w = self.rfile, self.wfile
        while True:
            head = r.read(2)
            if len(head) < 2:
                return
            op, n = head[0] & 0x0F, head[1] & 0x7F
            if n == 126:
                n = struct.unpack(">H", r.read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", r.read(8))[0]
            mask = r.read(4) if head[1] & 0x80 else b"\0\0\0\0"
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(r.read(n)))
            if op == 8:
                w.write(b"\x88\x02" + (data[:2] or b"\x03\xe8"))
                w.flush()
                self.close_connection = True  # the server closes TCP first (RFC 6455, 7.1.1)
                return
            if op in (1, 2):
                size = len(data)
                if size < 126:
                    frame = bytes([0x80 | op, size])
                elif size < 65536:
                    frame = bytes([0x80 | op, 126]) + struct.pack(">H", size)
                else:
                    frame = bytes([0x80 | op, 127]) + struct.pack(">Q", size)
                w.write(frame + data)
                w.flush()

class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True

server = Server(("0.0.0.0", int(sys.argv[1])), Handler)
open(sys.argv[2], "w").close()
server.serve_forever()
"""

_BOOT = r"""
import os, subprocess, sys, time
ready = "/tmp/portserver.%s.ready" % sys.argv[2]
subprocess.Popen(
    [sys.executable, "-c", sys.argv[1], sys.argv[2], ready],
    start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
)
for _ in range(200):
    if os.path.exists(ready):
        print("listening")
        break
    time.sleep(0.025)
"""


def start_argv(port: int) -> list[str]:
    """The exec that starts the server on ``port`` and prints ``listening`` once it does."""
    return ["python3", "-c", _BOOT, SERVER, str(port)]
