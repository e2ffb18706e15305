"""The agent's wire models (pydantic v2): what it publishes, and what it is asked to do.

The control plane reads ``AgentHeartbeat`` through ``POST /v1/agent/heartbeat``; ``memory_mb_admittable`` in it
is the agent's own verdict, computed with :func:`corral.core.admission.admittable_mb`. Host state
(ready / draining) is deliberately absent: draining is the control plane's decision, not the host's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from corral.agent.inputs import (
    MAX_IMAGES_PER_HOST,
    MAX_SANDBOXES_PER_HOST,
    MAX_TEMPLATES_PER_HOST,
    AbsPath,
    Address,
    AdmittableMb,
    Argv,
    Count,
    Cpus,
    Digest,
    Env,
    MemoryMb,
    Seq,
    Timestamp,
    Word,
)
from corral.core.netpolicy import MAX_RULES, EgressPolicy, parse_policy
from corral.core.types import (
    DEFAULT_CPUS,
    DEFAULT_TEMPLATE,
    HOST_FACTS,
    MAX_SANDBOX_DISK_MB,
    MAX_SANDBOX_PIDS,
    MIN_SANDBOX_DISK_MB,
    MIN_SANDBOX_PIDS,
    AdmissionMode,
    HostFacts,
    HostState,
    HostView,
)
from corral.exec_result import DEFAULT_EXEC_TIMEOUT_S, MAX_EXEC_TIMEOUT_S
from corral.images.config import USER_PATTERN, ImageConfig
from corral.images.digest import DIGEST_PATTERN
from corral.runtime.base import DEFAULT_PIDS, SandboxSpec
from corral.shapes import ID_PATTERN

if TYPE_CHECKING:
    from corral.store.records import SandboxRecord

# Hostnames are sent as they are used: keep them to a safe alphabet too.
HOSTNAME_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$"
MAX_MEMORY_MB = 16 * 1024 * 1024  # 16 TiB: anything larger is a typo, not a sandbox
MAX_CPUS = 1024.0


SandboxId = Annotated[str, Field(pattern=ID_PATTERN)]
Epoch = Annotated[int, Field(ge=0, lt=2**63, strict=True)]
# The header a control plane sends with every call about one sandbox: the epoch it routes to.
EPOCH_HEADER = "X-Corral-Epoch"
# On a call a replica relayed to an agent (the E2B data plane, a sandbox's port): a replica that
# receives one would relay it a second time, and refuses it (421) so that no routing loop forms.
HOP_HEADER = "corral-forwarded"
# A relayed call's own Authorization (it names the sandbox user, or is meant for the sandbox's
# server), moved aside for the host key the agent checks.
CALLER_AUTH_HEADER = "corral-caller-authorization"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Lenient(BaseModel):
    # What the agent publishes: a newer agent may add fields an older control plane ignores.
    model_config = ConfigDict(extra="ignore", frozen=True)


class EgressPolicyBody(_Model):
    # Left out: "internet" when a list is given, else "none" (corral.core.netpolicy.parse_policy).
    mode: Literal["none", "internet"] | None = None
    allow_out: list[str] = Field(default_factory=list, max_length=MAX_RULES)
    deny_out: list[str] = Field(default_factory=list, max_length=MAX_RULES)
    # Inbound: false, a sandbox's ports answer only requests carrying its traffic token.
    allow_public_traffic: bool | None = Field(default=None, strict=True)

    @classmethod
    def of(cls, policy: EgressPolicy) -> EgressPolicyBody:
        return cls.model_validate(policy.to_dict())

    def wire(self) -> dict[str, object]:
        """What was asked, as the core's parser reads it (a mode left out stays out)."""
        return self.model_dump(exclude_none=True)

    def policy(self) -> EgressPolicy:
        """The core's policy; :class:`corral.core.netpolicy.PolicyError` when it cannot be enforced."""
        return parse_policy(self.wire())


# What the control plane asks a host to start (``of`` a record), and what the host's runtime is then
# given (``spec``). No docstring: it would become the wire schema's description.
class StartSandbox(_Model):
    id: str = Field(pattern=ID_PATTERN)
    memory_mb: int = Field(gt=0, le=MAX_MEMORY_MB, strict=True)
    cpus: float = Field(default=DEFAULT_CPUS, gt=0, le=MAX_CPUS)
    stateful: bool = Field(default=False, strict=True)
    # None: none asked for, so no host refuses it for its template list; the runtime starts the
    # default template. The control plane always names the record's.
    template: str | None = Field(default=None, min_length=1, max_length=128)
    env: Env = Field(default_factory=dict)
    hostname: str | None = Field(default=None, pattern=HOSTNAME_PATTERN)
    network: bool = Field(default=False, strict=True)  # loopback only unless asked
    # Its egress policy (corral.core.netpolicy's wire form; None: mode "none", loopback only). One
    # that needs an interface takes a network slot of the host's.
    egress: EgressPolicyBody | None = None
    # Its pids limit; None: the runtime's default.
    pids: int | None = Field(default=None, ge=MIN_SANDBOX_PIDS, le=MAX_SANDBOX_PIDS, strict=True)
    # Delivered to every exec like env, held in the agent's memory only (never on its disk).
    secrets: Env = Field(default_factory=dict, repr=False)
    # Which owner of this id this copy is: a copy whose epoch is not the record's is fenced.
    epoch: Epoch = 0
    # The image its root is made of (a digest; None: the host's own system directories), its own disk
    # over it (MiB), and who its commands run as and where by default (the image's config).
    image: str | None = Field(default=None, pattern=DIGEST_PATTERN)
    disk_mb: int | None = Field(default=None, ge=MIN_SANDBOX_DISK_MB, le=MAX_SANDBOX_DISK_MB, strict=True)
    user: str | None = Field(default=None, pattern=USER_PATTERN)
    workdir: AbsPath | None = None
    # It runs only while its host holds a run lease: a recreate-policy sandbox, which the control plane
    # starts elsewhere once the host is dead (the host freezes it first).
    leased: bool = Field(default=False, strict=True)

    @classmethod
    def of(
        cls,
        record: SandboxRecord,
        env: Mapping[str, str],
        secrets: Mapping[str, str],
        pids: int | None = None,
        image: ImageConfig | None = None,
    ) -> StartSandbox:
        """The start of ``record``'s sandbox at its epoch, with its env and secrets (``pids``: its
        template's limit; ``image``: how its image says to run, whose env the create's env overrides)."""
        return cls(
            id=record.id,
            memory_mb=record.memory_mb,
            cpus=record.cpus,
            stateful=record.stateful,
            template=record.template,
            env={**(image.env if image is not None else {}), **env},
            pids=pids,
            secrets=dict(secrets),
            epoch=record.epoch,
            image=record.image,
            disk_mb=record.disk_mb,
            user=image.user if image is not None else None,
            workdir=image.workdir if image is not None else None,
            egress=None if record.network is None else EgressPolicyBody.model_validate_json(record.network),
            leased=record.leased,
        )

    def spec(self) -> SandboxSpec:
        """What the host's runtime starts. The secrets stay with the agent: given to each exec, never
        to the runtime (which keeps its specs on disk)."""
        return SandboxSpec(
            id=self.id,
            memory_mb=self.memory_mb,
            cpus=self.cpus,
            template=self.template or DEFAULT_TEMPLATE,
            stateful=self.stateful,
            hostname=self.hostname,
            env=dict(self.env),
            network=self.network,
            pids=self.pids if self.pids is not None else DEFAULT_PIDS,
            epoch=self.epoch,
            image=self.image,
            disk_mb=self.disk_mb,
            user=self.user,
            workdir=self.workdir,
            leased=self.leased,
        )


# A heartbeat entry's role: a sandbox started for a create is "owned" (the default, left out of the
# sparse ``roles`` map); a warm one waits, unowned, in a pool; a claimed one left a pool for a create.
ROLE_OWNED = "owned"
ROLE_WARM = "warm"
ROLE_CLAIMED = "claimed"
ROLE_PATTERN = f"^({ROLE_OWNED}|{ROLE_WARM}|{ROLE_CLAIMED})$"


class SandboxInfo(_Lenient):
    id: str
    memory_mb: int
    cpus: float
    stateful: bool
    template: str | None
    hostname: str
    started_at: float
    # Last measurement that counts (taken after the sandbox settled); None means it is charged its reserve.
    resident_mb: int | None = None
    # What the local gate charges for it right now, in the agent's admission mode.
    charged_mb: int
    oom_kills: int = 0
    role: str = ROLE_OWNED
    epoch: int = 0
    paused: bool = False  # frozen in place: nothing runs until it is resumed
    # What its own disk holds (MiB), read when one sandbox is asked for; None: no disk of its own.
    disk_used_mb: int | None = None

    @classmethod
    def of(
        cls,
        spec: SandboxSpec,
        *,
        started_at: float,
        charged_mb: int,
        resident_mb: int | None = None,
        oom_kills: int = 0,
        paused: bool = False,
        role: str = ROLE_OWNED,
    ) -> SandboxInfo:
        """What a host says of the sandbox it runs from ``spec``: the spec's shape, and what it knows
        of it as it runs."""
        return cls(
            id=spec.id,
            memory_mb=spec.memory_mb,
            cpus=spec.cpus,
            stateful=spec.stateful,
            template=spec.template,
            hostname=spec.hostname or spec.id,
            started_at=started_at,
            resident_mb=resident_mb,
            oom_kills=oom_kills,
            paused=paused,
            charged_mb=charged_mb,
            role=role,
            epoch=spec.epoch,
        )


class MemorySample(_Lenient):
    at: float  # unix seconds
    memory_mb: int


class SandboxSamples(_Lenient):
    """A sandbox's memory readings from a time range, oldest first (``corral.core.samples``)."""

    samples: list[MemorySample]


class ClaimWarm(_Model):
    """Take one ready warm sandbox of a template: the environment is kept for every later exec."""

    env: Env = Field(default_factory=dict)


class WarmTarget(_Model):
    """How many warm sandboxes of a template this host keeps ready, and what each is started with."""

    template: str = Field(min_length=1, max_length=128)
    target: int = Field(ge=0, le=100_000, strict=True)
    memory_mb: int = Field(gt=0, le=MAX_MEMORY_MB, strict=True)
    cpus: float = Field(default=DEFAULT_CPUS, gt=0, le=MAX_CPUS)
    stateful: bool = Field(default=False, strict=True)
    # The template's image (fetched ahead by the host when it lacks it), disk and who runs in it.
    image: str | None = Field(default=None, pattern=DIGEST_PATTERN)
    disk_mb: int | None = Field(default=None, ge=MIN_SANDBOX_DISK_MB, le=MAX_SANDBOX_DISK_MB, strict=True)
    user: str | None = Field(default=None, pattern=USER_PATTERN)
    workdir: AbsPath | None = None


class WarmCount(_Lenient):
    ready: Count = 0
    starting: Count = 0


# How long one call may wait for a background command to end (``?wait_s=``); a caller waiting
# longer asks again.
MAX_COMMAND_WAIT_S = 60.0


class ExecRequest(_Model):
    command: Argv
    timeout_s: float = Field(default=DEFAULT_EXEC_TIMEOUT_S, gt=0, le=MAX_EXEC_TIMEOUT_S)
    env: Env = Field(default_factory=dict)
    cwd: AbsPath | None = None


class Capacity(_Lenient):
    """What a host can take, as a heartbeat carries it (and ``GET /v1/capacity`` answers on demand)."""

    cpu_total: Cpus
    cpu_used: Cpus
    memory_mb_total: MemoryMb
    memory_mb_used: MemoryMb
    memory_admission: AdmissionMode
    memory_mb_admittable: AdmittableMb
    templates: list[Word] | None = Field(default=None, max_length=MAX_TEMPLATES_PER_HOST)  # None: any
    runtime: Word
    gpu: Word | None = None
    role: Word = "worker"
    stream_restore: bool = False
    # The images on the host's disk (see ImageCache.held), most recently used first.
    images: list[Digest] = Field(default_factory=list, max_length=MAX_IMAGES_PER_HOST)
    # Informational: the control plane's filters do not need them, operators do.
    intake_open: bool = True
    starts_in_flight: Count = 0
    max_concurrent_starts: Count = 0

    def facts(self) -> HostFacts:
        """The host's facts as the core declares them (the fields above are their wire form)."""
        values = {f: getattr(self, f) for f in HOST_FACTS}
        values["templates"] = None if self.templates is None else frozenset(self.templates)
        values["images"] = frozenset(self.images)
        return HostFacts(**values)


class AgentHeartbeat(Capacity):
    """What an agent publishes every interval.

    Its sandboxes travel one of two ways. Whole: ``sandbox_ids`` lists every one (with ``roles`` and
    ``epochs``), as every agent did before changes existed and as an agent still does at start, after a
    reply it did not get, and whenever the control plane has not acknowledged its last heartbeat's
    listing. Changes: ``base`` is the seq of the heartbeat whose listing the control plane acknowledged
    (``HeartbeatReply.listed_seq``), ``added`` and ``removed`` what changed among the sandboxes records
    may claim (warm ones excluded) since then, and ``digest`` lets the control plane prove its copy
    still matches; on any doubt it withholds the acknowledgement and the next heartbeat is whole."""

    agent_id: str = Field(pattern=ID_PATTERN)
    # Strictly increasing per agent, and seeded from the clock so it keeps increasing across restarts:
    # a receiver may drop any heartbeat whose seq is not above the last one it kept.
    seq: Seq
    address: Address
    sent_at: Timestamp
    sandbox_ids: list[SandboxId] = Field(default_factory=list, max_length=MAX_SANDBOXES_PER_HOST)
    # Sandbox id -> processes the kernel's OOM killer has killed in it so far; only nonzero counts.
    oom_kills: dict[SandboxId, Annotated[int, Field(ge=0, lt=2**63)]] = Field(
        default_factory=dict, max_length=MAX_SANDBOXES_PER_HOST
    )
    # Sparse: the role of every entry of ``sandbox_ids`` that is not owned (warm or claimed).
    roles: dict[SandboxId, Annotated[str, Field(pattern=ROLE_PATTERN)]] = Field(
        default_factory=dict, max_length=MAX_SANDBOXES_PER_HOST
    )
    # Sparse: the epoch of every entry of ``sandbox_ids`` (or of ``added``) whose epoch is not 0.
    epochs: dict[SandboxId, Epoch] = Field(default_factory=dict, max_length=MAX_SANDBOXES_PER_HOST)
    # None: ``sandbox_ids`` is the whole set. Otherwise the changes below build on heartbeat ``base``.
    base: Seq | None = None
    added: list[SandboxId] = Field(default_factory=list, max_length=MAX_SANDBOXES_PER_HOST)
    removed: list[SandboxId] = Field(default_factory=list, max_length=MAX_SANDBOXES_PER_HOST)
    # corral.core.listing.digest_of the sandboxes records may claim, after this heartbeat.
    digest: int | None = Field(default=None, ge=0, lt=2**63, strict=True)
    # Sandboxes adopted after a restart: their secrets (never on the host's disk) are to be sent again.
    restore: list[SandboxId] = Field(default_factory=list, max_length=MAX_SANDBOXES_PER_HOST)
    # Warm sandboxes per template.
    warm: dict[Annotated[str, Field(min_length=1, max_length=128)], WarmCount] = Field(
        default_factory=dict, max_length=MAX_TEMPLATES_PER_HOST
    )

    @model_validator(mode="after")
    def _one_form(self) -> AgentHeartbeat:
        if self.base is None and (self.added or self.removed):
            raise ValueError("added and removed need a base: without one, sandbox_ids is the whole set")
        if self.base is not None and self.sandbox_ids:
            raise ValueError("sandbox_ids is the whole set: a heartbeat with a base carries changes only")
        return self

    def owned_ids(self) -> frozenset[str]:
        """Of a whole set, the entries a record may claim: every sandbox but the warm ones."""
        if not self.roles:
            return frozenset(self.sandbox_ids)
        return frozenset(i for i in self.sandbox_ids if self.roles.get(i) != ROLE_WARM)

    def host_view(self, heartbeat_at: float | None = None, state: HostState = HostState.READY) -> HostView:
        """The core's view of this host. ``heartbeat_at`` is when the receiver got it (default: sent_at);
        ``state`` is the control plane's own (draining is its decision, never the agent's)."""
        return HostView(
            **{f: getattr(self.facts(), f) for f in HOST_FACTS},
            id=self.agent_id,
            heartbeat_at=self.sent_at if heartbeat_at is None else heartbeat_at,
            state=state,
        )


class HeartbeatReply(_Lenient):
    """The control plane's answer to a heartbeat: whether it was kept, this host's warm targets, and
    the sandboxes it runs that are now another host's (a newer epoch): it stops them at once."""

    accepted: bool = True
    confirmed: int = 0
    # The seq of the heartbeat whose listing the control plane holds for this host: the agent's next
    # heartbeat may carry changes since it only when it is the seq of the heartbeat just sent. None:
    # a control plane that takes whole sets only.
    listed_seq: int | None = None
    state: str = "ready"
    warm_targets: list[WarmTarget] = Field(default_factory=list)
    stop: list[SandboxId] = Field(default_factory=list, max_length=MAX_SANDBOXES_PER_HOST)
    # For the sandboxes a heartbeat asked to ``restore`` that this host owns at that epoch: their secrets.
    secrets: dict[SandboxId, Env] = Field(default_factory=dict, max_length=MAX_SANDBOXES_PER_HOST, repr=False)
    # The run lease this reply grants, from when the agent sent the heartbeat: how long it may run its
    # leased (recreate-policy) sandboxes without another reply, and when it is declared dead (it stops
    # them then). None: a control plane that grants none (nothing is fenced).
    run_lease_s: float | None = Field(default=None, gt=0)
    dead_after_s: float | None = Field(default=None, gt=0)
