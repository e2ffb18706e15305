"""The bounds every listening server of corral keeps (the API and the host agent): how long a client
may take to send a request, how many connections stay open, how many requests one token has in
flight. Declared here once; the servers, their flags and the docs take them from here."""

from __future__ import annotations

from dataclasses import dataclass

from corral.core.timeouts import ConfigError

# Requests one bearer token may have in flight on the API at once (the agent has one caller, the
# control plane, and no such bound). An SDK client opens at most 100 connections.
DEFAULT_REQUESTS_PER_TOKEN = 256
# Of the process's open-file limit, the share connections may take: the rest stays for exec pipes,
# the store and the calls to agents.
CONNECTION_SHARE_OF_FILES = 2


@dataclass(frozen=True, slots=True)
class ListenBounds:
    # From a connection's opening, or a request's first byte, to its complete head.
    header_timeout_s: float = 10.0
    # The longest silence inside a request body (a body the server stopped reading does not count).
    body_timeout_s: float = 30.0
    # Idle between two requests of a kept-alive connection (uvicorn's timer, whole seconds).
    keep_alive_s: int = 5
    # Connections open at once; excess ones are closed as they are accepted. At most a half of the
    # process's open-file limit (see ``connection_cap``).
    max_connections: int = 4096
    # Connections open at once from one peer address; None: no such bound (behind a proxy, every
    # client shares its address).
    max_connections_per_peer: int | None = None

    def __post_init__(self) -> None:
        if min(self.header_timeout_s, self.body_timeout_s, self.keep_alive_s) <= 0:
            raise ConfigError("the header, body and keep-alive timeouts must be positive")
        if self.max_connections < 1 or (
            self.max_connections_per_peer is not None and self.max_connections_per_peer < 1
        ):
            raise ConfigError("connection bounds must be at least 1")


def connection_cap(configured: int, open_files: int | None) -> int:
    """The connections a server keeps open: ``configured``, within its share of ``open_files`` (the
    soft RLIMIT_NOFILE; None or negative: unlimited)."""
    if open_files is None or open_files < 0:
        return configured
    return max(1, min(configured, open_files // CONNECTION_SHARE_OF_FILES))


def check_requests_per_token(n: int) -> int:
    if n < 1:
        raise ConfigError("requests per token must be at least 1")
    return n
