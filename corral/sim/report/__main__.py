"""``python -m corral.sim.report docs``: regenerate ``docs/simulation.md`` and its charts."""

import sys

from corral.sim.report.document import main

raise SystemExit(main(sys.argv[1:]))
