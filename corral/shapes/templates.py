"""Templates as the API describes them (with their image, version and size), and their builds."""

from __future__ import annotations

from corral.shapes import Wire


class Template(Wire):
    name: str
    cpus: float
    memory_mb: int
    stateful: bool
    description: str
    pids: int
    failover: str = "orphan"
    image: str | None = None  # the digest of its image; None: the host's own root
    disk_mb: int | None = None
    version: int = 1  # each build of the template is the next version
    size_bytes: int | None = None  # its image's size, when it has one


class TemplateList(Wire):
    templates: list[Template]


class BuildFailure(Wire):
    reason: str  # failed (a step exited non-zero), timeout, refused, cancelled, builder
    message: str
    step: str = ""  # the step as the recipe wrote it
    line: int = 0  # its line in the recipe
    output: str = ""  # the last of the step's output


class Build(Wire):
    """A template's build (or import): its state, and its log from the offset asked."""

    id: str
    template: str
    status: str  # waiting (for its context), building, ready, error
    logs: list[str]
    next_offset: int  # where the next poll's log starts
    digest: str | None = None  # the image built, once ready
    version: int | None = None  # the template's version it became, once ready
    failure: BuildFailure | None = None

    @property
    def done(self) -> bool:
        """Ended: ready (with its image) or failed (with why)."""
        return self.digest is not None or self.failure is not None
