"""The package's layering, read from the source with ``ast`` (nothing is imported), so a violation names
its file and line.

Layers, lowest first: ``core`` < ``store``, ``runtime``, ``images`` (and the edge utilities ``clock``, ``ids``,
``logs``, ``jsontext``, ``aio``, ``listener``, ``listen_options``) < ``agent``, ``control`` < ``api``,
``sim`` < ``cli``. The simulator sits above the control plane because it runs the real flows, and it
plays the SDK's clients (their retry policy), so it may import ``client`` as the command line does. A
module imports only from its own layer or below. ``core`` is pure policy: the standard library's computational modules, the error
codes and itself, no I/O, no event loop, no reading of the time. ``client`` is the SDK, shipped without
the server's dependencies: it imports nothing of corral but itself and the wire's shared vocabulary
(``codes``, ``exec_result``, ``shapes``), which import nothing of corral but one another.
``testing`` helps tests and may use anything below ``api``. Inside ``sim``, rooms rank too
(``SIM_ROOM``): the harness over the real flows and the baselines' model fleet never import each other.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "corral"

LAYER = {
    "": 0,  # corral/__init__.py: the version
    "codes": 0,  # the error codes: the wire's vocabulary, shared with the client
    "exec_result": 0,  # a command's outcome: one shape from the runtime to the client
    "shapes": 0,  # the API's answers: built by the server, parsed by the client
    "core": 0,
    "store": 1,
    "runtime": 1,
    "images": 1,  # image digests, configs, the blob store and the host's resolver: beside the runtime
    "clock": 1,
    "ids": 1,
    "logs": 1,
    "jsontext": 1,
    "tls": 1,  # the listener's certificate
    "aio": 1,
    "listener": 1,  # uvicorn under the listening bounds
    "listen_options": 1,
    "extras": 1,  # which optional extras are installed, and the message naming a missing one
    "agent": 2,
    "control": 2,
    "testing": 2,
    "api": 3,
    "sim": 3,
    "cli": 4,
    "__main__": 4,
}

# What both the server and the SDK import: the wire's shared vocabulary.
SHARED_WITH_CLIENT = ("codes", "exec_result", "shapes")

# Standard-library modules that do I/O, read the time, run an event loop or threads, or reach the
# process's environment: a pure core takes all of these as injected arguments instead.
CORE_FORBIDDEN_STDLIB = {
    "asyncio",
    "time",
    "datetime",
    "os",
    "io",
    "sys",
    "socket",
    "select",
    "selectors",
    "subprocess",
    "threading",
    "multiprocessing",
    "concurrent",
    "signal",
    "shutil",
    "tempfile",
    "pathlib",
    "glob",
    "sqlite3",
    "http",
    "urllib",
    "logging",
    "secrets",
    "uuid",
    "ssl",
    "pickle",
    "shelve",
    "ctypes",
    "fcntl",
    "mmap",
    "resource",
    "platform",
}


@dataclass(frozen=True)
class Import:
    file: Path
    line: int
    module: str  # absolute dotted name

    def where(self) -> str:
        return f"{self.file.relative_to(ROOT)}:{self.line} imports {self.module}"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> list[Import]:
    """Every import statement in a file, relative ones resolved, including those inside functions and
    ``if TYPE_CHECKING`` blocks (a lazy import still ties the layers together)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found: list[Import] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [Import(path, node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            found.append(Import(path, node.lineno, module))
            # `from corral import clock` names a module of corral, not just the package.
            if module == "corral":
                found += [
                    Import(path, node.lineno, f"corral.{a.name}")
                    for a in node.names
                    if (ROOT / "corral" / a.name).is_dir() or (ROOT / "corral" / f"{a.name}.py").is_file()
                ]
    return found


def _part(module: str) -> str:
    """``corral.store.sql`` -> ``store``; ``corral`` -> ``""``."""
    return module.split(".")[1] if "." in module else ""


def source_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _all_imports() -> list[Import]:
    return [imp for f in source_files() for imp in imports_of(f)]


def test_every_part_of_the_package_has_a_layer() -> None:
    parts = {_part(_module_name(f)) for f in source_files()}
    assert parts <= set(LAYER) | {"client"}, f"new part(s) with no layer: {parts - set(LAYER)}"


def test_no_module_imports_a_layer_above_its_own() -> None:
    bad = []
    for imp in _all_imports():
        if not imp.module.startswith("corral"):
            continue
        own, target = _part(_module_name(imp.file)), _part(imp.module)
        if own == "client" or target in ("", *SHARED_WITH_CLIENT):
            continue  # the client's rule is its own test; the root holds only the version
        if target == "client":
            if LAYER[own] < LAYER["cli"] and own != "sim":
                bad.append(f"{imp.where()}: only the command line wires the client in")
            continue
        if LAYER[target] > LAYER[own]:
            bad.append(f"{imp.where()}: {target} is above {own}")
    assert not bad, "\n".join(bad)


def test_core_imports_only_pure_standard_library_and_itself() -> None:
    bad = []
    for imp in _all_imports():
        if _part(_module_name(imp.file)) != "core":
            continue
        top = imp.module.split(".")[0]
        if imp.module in ("corral", "corral.codes") or imp.module.startswith("corral.core"):
            continue  # the error codes are constants of the standard library's enum: pure
        if top == "corral":
            bad.append(f"{imp.where()}: core imports only itself")
        elif top not in sys.stdlib_module_names and top != "__future__":
            bad.append(f"{imp.where()}: not the standard library")
        elif top in CORE_FORBIDDEN_STDLIB:
            bad.append(f"{imp.where()}: I/O, time or concurrency belongs at the edges")
    assert not bad, "\n".join(bad)


def test_core_takes_randomness_injected() -> None:
    """``random`` is allowed in core only as the type of an injected generator (``random.Random``): a
    call to the module's shared generator would make a decision unrepeatable."""
    bad = []
    for f in source_files():
        if _part(_module_name(f)) != "core":
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "random":
                bad += [
                    f"{f.relative_to(ROOT)}:{node.lineno} from random import {a.name}" for a in node.names
                ]
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "random"
                and node.attr != "Random"
            ):
                bad.append(f"{f.relative_to(ROOT)}:{node.lineno} uses random.{node.attr}")
    assert not bad, "\n".join(bad)


def test_client_imports_no_server_code() -> None:
    bad = [
        imp.where()
        for imp in _all_imports()
        if _part(_module_name(imp.file)) == "client"
        and imp.module.startswith("corral.")
        and _part(imp.module) not in ("client", *SHARED_WITH_CLIENT)
    ]
    assert not bad, "\n".join(bad)


def test_what_the_client_shares_imports_nothing_else_of_corral() -> None:
    bad = [
        imp.where()
        for imp in _all_imports()
        if _part(_module_name(imp.file)) in SHARED_WITH_CLIENT
        and imp.module.startswith("corral.")
        and _part(imp.module) not in SHARED_WITH_CLIENT
    ]
    assert not bad, "\n".join(bad)


def _import_cycle(part: str) -> list[str] | None:
    """A cycle among the modules of one part (``TYPE_CHECKING`` imports count), or None."""
    graph: dict[str, set[str]] = {}
    for f in source_files():
        name = _module_name(f)
        if _part(name) == part:
            graph[name] = {i.module for i in imports_of(f) if _part(i.module) == part and i.module != name}
    for deps in graph.values():
        deps &= graph.keys()  # a name imported from a package's __init__ is that module's own
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
            return None
        for dep in sorted(graph[module]):
            found = visit(dep, [*path, module])
            if found:
                return found
        done.add(module)
        return None

    for module in sorted(graph):
        found = visit(module, [])
        if found:
            return found
    return None


# The simulator's rooms, lowest first: what a scenario is made of; the harness over the real flows and
# the baselines' model fleet beside it (neither imports the other: both engines read one scenario);
# the experiments, which run both; their report; the command line.
SIM_ROOM = {
    "": 0,  # corral/sim/__init__.py: the map
    "scenario": 0,
    "flow": 1,
    "baselines": 1,
    "experiments": 2,
    "report": 3,
    "cli": 4,
}


def _sim_room(module: str) -> str:
    """``corral.sim.flow.chaos`` -> ``flow``; ``corral.sim`` -> ``""``."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 else ""


def test_every_room_of_the_simulator_has_a_rank() -> None:
    rooms = {_sim_room(_module_name(f)) for f in source_files() if _part(_module_name(f)) == "sim"}
    assert rooms <= set(SIM_ROOM), f"new room(s) of sim with no rank: {rooms - set(SIM_ROOM)}"


def test_the_simulator_rooms_import_one_way() -> None:
    bad = []
    for imp in _all_imports():
        own = _module_name(imp.file)
        if _part(own) != "sim" or _part(imp.module) != "sim" or not imp.module.startswith("corral.sim"):
            continue
        here, there = _sim_room(own), _sim_room(imp.module)
        if here != there and SIM_ROOM[there] >= SIM_ROOM[here]:
            bad.append(f"{imp.where()}: sim's {there} is not below its {here}")
    assert not bad, "\n".join(bad)


def test_the_control_plane_has_no_import_cycle() -> None:
    """Each flow of ``control`` is built with the parts it uses (the placement step below the create
    flow, parked creates and failover; the create flow below batch): one way, never back."""
    cycle = _import_cycle("control")
    assert cycle is None, " -> ".join(cycle or [])


def test_the_checker_sees_relative_lazy_and_aliased_imports(tmp_path: Path) -> None:
    """The rules above are only as good as the parser: it must not miss an import written another way."""
    pkg = tmp_path / "corral" / "core"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (tmp_path / "corral" / "api").mkdir()
    probe = pkg / "probe.py"
    probe.write_text(
        "from ..store import sql\ndef f():\n    import time as t\n    from corral import api\n    return t\n"
    )
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        found = {(i.line, i.module) for i in imports_of(probe)}
    finally:
        ROOT = saved
    assert {(1, "corral.store"), (3, "time"), (4, "corral"), (4, "corral.api")} <= found


def test_a_replica_is_built_in_one_place() -> None:
    """``build_replica`` is the only maker of a :class:`ControlPlane`: the server, the replicas, the
    tests and the simulator run one wiring, and no second class takes its name."""
    home = PACKAGE / "control" / "plane.py"
    files = [f for d in ("corral", "tests", "bench", "scripts") for f in sorted((ROOT / d).rglob("*.py"))]
    bad = []
    for f in files:
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ClassDef) and node.name == "ControlPlane" and f != home:
                bad.append(f"{f.relative_to(ROOT)}:{node.lineno} a second class ControlPlane")
            if isinstance(node, ast.Call) and f != home:
                fn = node.func
                name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
                if name == "ControlPlane":
                    bad.append(
                        f"{f.relative_to(ROOT)}:{node.lineno} builds a ControlPlane past build_replica"
                    )
    assert not bad, "\n".join(bad)


# The agent's rooms that hold one concept each and sit below its lifecycle: the live set, heartbeat
# building, its config, its sinks, the heartbeat's schema and its listing. None of them reaches up to
# the agent itself or to the data plane served on top of it.
AGENT_BELOW_LIFECYCLE = ("live", "beats", "config", "sinks", "protocol", "listing")


def test_the_agents_rooms_below_its_lifecycle_import_neither_it_nor_the_data_plane() -> None:
    bad = []
    for room in AGENT_BELOW_LIFECYCLE:
        path = PACKAGE / "agent" / f"{room}.py"
        for imp in imports_of(path):
            if imp.module == "corral.agent.agent" or imp.module.startswith("corral.agent.envd"):
                bad.append(imp.where())
    assert not bad, "\n".join(bad)


def test_the_e2b_data_plane_is_served_on_top_of_the_agent() -> None:
    """``agent/envd/`` (E2B's in-sandbox API) uses the agent; within the agent only its HTTP app serves
    it, and above the agent only ``api`` forwards to it."""
    bad = []
    for imp in _all_imports():
        name = _module_name(imp.file)
        if not imp.module.startswith("corral.agent.envd") or name.startswith("corral.agent.envd"):
            continue
        if name != "corral.agent.http" and _part(name) not in ("api", "testing", "cli"):
            bad.append(imp.where())
    assert not bad, "\n".join(bad)
