"""Which sandbox port a request to a replica names, read from the request alone.

* by Host: ``{port}-{sandbox_id}.{domain}`` (E2B's ``get_host(port)``), ``domain`` the control
  plane's own (configured per control plane, returned on create); a port in the Host header (the
  replica's listening port) is ignored on both sides;
* by path: ``/v1/sandboxes/{sandbox_id}/ports/{port}/...`` on any replica, for callers that cannot
  choose a Host (no wildcard DNS); what follows the port is the path the sandbox's server sees;
* by a custom domain: any other Host that a sandbox has bound (the store holds the bindings;
  :func:`custom_hostname` checks a name before it is bound or looked up).

Pure: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PATH_PREFIX = "/v1/sandboxes/"
_PATH = re.compile(r"^/v1/sandboxes/([A-Za-z0-9][A-Za-z0-9_.-]{0,127})/ports/([^/]*)(/.*)?$", re.DOTALL)
_SANDBOX_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")  # no dot: it ends at the domain
_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
MAX_HOSTNAME = 253


class BadPort(ValueError):
    """A port that is not one (not a decimal number in 1..65535)."""


@dataclass(frozen=True, slots=True)
class PortTarget:
    sandbox_id: str
    port: int
    path: str  # the path the sandbox's server is asked for, from "/"


def port_number(text: str) -> int:
    if not text.isascii() or not text.isdigit() or len(text) > 5 or text.startswith("0"):
        raise BadPort(f"port {text[:16]!r} is not a number in 1..65535")
    port = int(text)
    if not 1 <= port <= 65535:
        raise BadPort(f"port {port} is not in 1..65535")
    return port


def host_name(header: str) -> str:
    """A Host header's name: lower-cased, its port and a trailing dot dropped."""
    name = header.strip().lower()
    if name.startswith("["):  # an IPv6 literal names no sandbox
        return name
    return name.rsplit(":", 1)[0].rstrip(".") if ":" in name else name.rstrip(".")


def by_host(header: str, domain: str | None, path: str) -> PortTarget | None:
    """The port ``Host: {port}-{sandbox_id}.{domain}`` names; None when the Host is not of that form
    (the request is the API's, or a custom domain's)."""
    if not domain:
        return None
    name, suffix = host_name(header), "." + host_name(domain)
    if not name.endswith(suffix):
        return None
    label = name[: -len(suffix)]
    port_text, dash, sandbox_id = label.partition("-")
    if not dash or not _SANDBOX_ID.match(sandbox_id):
        return None
    try:
        port = port_number(port_text)
    except BadPort:
        return None
    return PortTarget(sandbox_id, port, path or "/")


def by_path(path: str) -> PortTarget | None:
    """The port ``/v1/sandboxes/{id}/ports/{port}/...`` names; None for every other path.
    :class:`BadPort` when the path has that form but its port is not a port."""
    if not path.startswith(PATH_PREFIX):
        return None
    m = _PATH.match(path)
    if m is None:
        return None
    return PortTarget(m.group(1), port_number(m.group(2)), m.group(3) or "/")


def custom_hostname(text: str, domain: str | None = None) -> str:
    """A custom domain's canonical form (lower case, no trailing dot); ValueError for a name that
    is not a DNS hostname of at least two labels, or one under the control plane's own ``domain``
    (whose names are the sandboxes' own ports: binding one would shadow a sandbox's port)."""
    name = text.strip().lower().rstrip(".")
    if not name or len(name) > MAX_HOSTNAME or not name.isascii():
        raise ValueError("hostname must be an ASCII DNS name of at most 253 characters")
    labels = name.split(".")
    if len(labels) < 2 or not all(_LABEL.match(label) for label in labels):
        raise ValueError(f"{name[:64]!r} is not a hostname (labels of letters, digits and inner hyphens)")
    if labels[-1].isdigit():
        raise ValueError(f"{name[:64]!r} is an address, not a hostname")
    if domain:
        own = host_name(domain)
        if name == own or name.endswith("." + own):
            raise ValueError(f"{name[:64]!r} is under the control plane's own domain {own!r}")
    return name
