"""The listener's flags, the same on ``corral serve``, ``corral api`` and ``corral agent``; their
defaults are :class:`~corral.core.listen.ListenBounds`'s own."""

from __future__ import annotations

from typing import Annotated

import typer

from corral.core.listen import DEFAULT_REQUESTS_PER_TOKEN, ListenBounds

DEFAULTS = ListenBounds()

HeaderTimeout = Annotated[
    float,
    typer.Option(
        "--header-timeout",
        min=0.01,
        help="Seconds a client may take to send a request's head (from connecting, or its first byte).",
    ),
]
BodyTimeout = Annotated[
    float,
    typer.Option(
        "--body-timeout", min=0.01, help="Seconds a request body may stall before the connection closes."
    ),
]
KeepAliveTimeout = Annotated[
    int,
    typer.Option("--keep-alive-timeout", min=1, help="Seconds an idle kept-alive connection stays open."),
]
MaxConnections = Annotated[
    int,
    typer.Option(
        "--max-connections",
        min=1,
        help="Connections open at once (at most half the open-file limit); more are closed on accept.",
    ),
]
MaxConnectionsPerPeer = Annotated[
    int | None,
    typer.Option(
        "--max-connections-per-peer",
        min=1,
        help="Connections open at once from one address (default: no bound; behind a proxy all share one).",
    ),
]
MaxRequestsPerToken = Annotated[
    int,
    typer.Option(
        "--max-requests-per-token",
        min=1,
        help="Requests one token may have in flight; more are answered 429 too_many_connections.",
    ),
]


def bounds(
    header_timeout: float,
    body_timeout: float,
    keep_alive_timeout: int,
    max_connections: int,
    max_connections_per_peer: int | None,
) -> ListenBounds:
    return ListenBounds(
        header_timeout_s=header_timeout,
        body_timeout_s=body_timeout,
        keep_alive_s=keep_alive_timeout,
        max_connections=max_connections,
        max_connections_per_peer=max_connections_per_peer,
    )


__all__ = [
    "DEFAULTS",
    "DEFAULT_REQUESTS_PER_TOKEN",
    "BodyTimeout",
    "HeaderTimeout",
    "KeepAliveTimeout",
    "MaxConnections",
    "MaxConnectionsPerPeer",
    "MaxRequestsPerToken",
    "bounds",
]
