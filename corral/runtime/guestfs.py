"""Whether a sandbox's own launcher serves the data plane's file operations (its ``fs`` mode).

A sandbox outlives the agent: one adopted after an upgrade runs the init of the corral that started
it, which may predate the mode. So each sandbox's launcher is asked once per incarnation (``fs
version``, answered with :data:`corral.runtime.launcher.FS_PROTOCOL`), and one that answers otherwise
leaves its files to the Python helper, as before."""

from __future__ import annotations

from collections.abc import Hashable

from corral.runtime import launcher
from corral.runtime.base import Runtime, RuntimeFailure

_PROBE_TIMEOUT_S = 10.0
# Sandboxes remembered; past this the memory starts again (a sandbox gone leaves its entry behind,
# and asking again costs one short command).
_MAX_KNOWN = 4096


class GuestFs:
    def __init__(self) -> None:
        self._known: dict[str, tuple[Hashable, bool]] = {}

    async def program(
        self, runtime: Runtime, sandbox_id: str, path: str, incarnation: Hashable
    ) -> str | None:
        """``path`` if the launcher there serves the fs mode of this corral, else None. A sandbox that
        cannot be asked now (paused, gone) is not remembered: the caller's own command then says why."""
        known = self._known.get(sandbox_id)
        if known is None or known[0] != incarnation:
            try:
                answer = await runtime.exec(sandbox_id, [path, "fs", "version"], timeout_s=_PROBE_TIMEOUT_S)
            except RuntimeFailure:
                return None
            if answer.timed_out:
                return None
            if len(self._known) >= _MAX_KNOWN:
                self._known.clear()
            known = (incarnation, answer.exit_code == 0 and answer.stdout.strip() == launcher.FS_PROTOCOL)
            self._known[sandbox_id] = known
        return path if known[1] else None
