"""E2B's in-sandbox API (envd), served by the agent for the sandboxes of its host: the processes and
files services, the plumbing they share, the Connect wire format they speak, and the helper program
file operations run inside a sandbox. The replicas' side (E2B's control API, forwarding a data-plane
call to its owner) is :mod:`corral.api.e2b`."""

from corral.agent.envd.app import ENVD_PREFIX, ENVD_VERSION, Envd
from corral.agent.envd.calls import SANDBOX_HEADER
from corral.agent.envd.processes import UNHEARD_BYTES
from corral.agent.protocol import CALLER_AUTH_HEADER

__all__ = ["CALLER_AUTH_HEADER", "ENVD_PREFIX", "ENVD_VERSION", "SANDBOX_HEADER", "UNHEARD_BYTES", "Envd"]
