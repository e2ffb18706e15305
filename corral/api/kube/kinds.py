"""The four kinds corral serves as Kubernetes resources (agent-sandbox's groups, version v1beta1), and
the columns ``kubectl get`` prints for each. Facts about the surface only: no records here."""

from __future__ import annotations

from dataclasses import dataclass

VERSION = "v1beta1"
CORE_GROUP = "agents.x-k8s.io"
EXTENSIONS_GROUP = "extensions.agents.x-k8s.io"

# Labels corral writes on a Sandbox: how it was started, and the claim that holds it.
LAUNCH_TYPE = "agents.x-k8s.io/launch-type"
# On a sandbox record's metadata: the warm pool its claim named (the record is the claim's sandbox).
CLAIM_POOL = "extensions.agents.x-k8s.io/warm-pool"


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: str
    description: str
    priority: int = 0  # 1: only with ``-o wide``
    format: str = ""


@dataclass(frozen=True, slots=True)
class Kind:
    group: str
    kind: str
    plural: str
    singular: str
    short_names: tuple[str, ...]
    columns: tuple[Column, ...]
    scale: bool = False
    # Shared by every namespace (fleet-wide records: templates and pools); written by the admin only.
    shared: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{VERSION}"


_NAME = Column("Name", "string", "the object's name", format="name")
_AGE = Column("Age", "date", "how long ago it was created")
_READY = Column("Ready", "string", "the Ready condition's status")
_REASON = Column("Reason", "string", "the Ready condition's reason")

SANDBOX = Kind(
    CORE_GROUP,
    "Sandbox",
    "sandboxes",
    "sandbox",
    ("sbx",),
    (
        _NAME,
        _READY,
        _REASON,
        _AGE,
        Column("State", "string", "corral's state of the sandbox", 1),
        Column("Host", "string", "the host it runs on", 1),
        Column("Template", "string", "its template", 1),
    ),
)
CLAIM = Kind(
    EXTENSIONS_GROUP,
    "SandboxClaim",
    "sandboxclaims",
    "sandboxclaim",
    ("sbxc",),
    (
        _NAME,
        _READY,
        Column("Sandbox", "string", "the sandbox bound to the claim (.status.sandbox.name)"),
        _REASON,
        _AGE,
        Column("Launch", "string", "warm: taken from the pool; cold: started for the claim", 1),
    ),
)
TEMPLATE = Kind(
    EXTENSIONS_GROUP,
    "SandboxTemplate",
    "sandboxtemplates",
    "sandboxtemplate",
    ("sbxt",),
    (
        _NAME,
        Column("CPUs", "number", "CPUs per sandbox"),
        Column("Memory", "integer", "MiB per sandbox"),
        _AGE,
    ),
    shared=True,
)
POOL = Kind(
    EXTENSIONS_GROUP,
    "SandboxWarmPool",
    "sandboxwarmpools",
    "sandboxwarmpool",
    ("swp",),
    (
        _NAME,
        Column("Ready", "integer", "warm sandboxes ready (.status.readyReplicas)"),
        Column("Desired", "integer", "warm sandboxes wanted (.spec.replicas)"),
        _AGE,
        Column("Starting", "integer", "warm sandboxes still starting", 1),
    ),
    scale=True,
    shared=True,
)

KINDS = (SANDBOX, CLAIM, TEMPLATE, POOL)
BY_PLURAL = {(k.group, k.plural): k for k in KINDS}
GROUPS = (CORE_GROUP, EXTENSIONS_GROUP)
