"""``pip install corral`` is the SDK and the client commands, without the server's dependencies.

The wheel is built from this checkout and installed with ``--no-deps --no-index`` into a fresh venv; the
distributions its base requirements name (and theirs, recursively) are linked in from the test's own
environment, nothing more. So nothing is downloaded, and an import of a package the base requirements
do not declare fails here as it would for a user.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
SERVER_ONLY = ("fastapi", "uvicorn", "psycopg", "psycopg_pool", "prometheus_client", "matplotlib")

pytestmark = pytest.mark.timeout(60)


def _base_requirements(wheel: Path) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    reqs = [Requirement(line.split(":", 1)[1].strip()) for line in lines if line.startswith("Requires-Dist:")]
    return [r for r in reqs if r.marker is None or r.marker.evaluate({"extra": ""})]


def _closure(reqs: list[Requirement]) -> list[md.Distribution]:
    """The installed distributions that ``reqs`` need, with the extras they ask for."""
    seen: dict[str, md.Distribution] = {}
    todo = list(reqs)
    while todo:
        req = todo.pop()
        dist = md.distribution(req.name)
        key = dist.metadata["Name"].lower()
        for extra in ["", *req.extras]:
            for sub in dist.requires or []:
                r = Requirement(sub)
                wanted = r.marker is None or r.marker.evaluate({"extra": extra})
                if wanted and r.name.lower() not in seen and r.name.lower() != key:
                    todo.append(r)
        seen[key] = dist
    return list(seen.values())


def _link_into(dists: list[md.Distribution], site: Path) -> None:
    for dist in dists:
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        base = Path(str(dist.locate_file("")))
        for top in tops:
            target = site / top
            if not target.exists():
                target.symlink_to(base / top)


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("pkg")
    dist = tmp / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", dist, ROOT],
        check=True,
    )
    wheel = next(dist.glob("corral-*.whl"))
    env_dir = tmp / "venv"
    venv.create(env_dir, with_pip=False)
    py = env_dir / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-deps", "--no-index", wheel],
        check=True,
    )
    site = Path(
        subprocess.run(
            [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    _link_into(_closure(_base_requirements(wheel)), site)
    return env_dir


def _run(env_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["COLUMNS"] = "200"
    return subprocess.run(args, capture_output=True, text=True, env=env, cwd=env_dir, timeout=30)


def test_the_wheel_declares_the_server_as_extras_and_ships_py_typed(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            tmp_path,
            ROOT,
        ],
        check=True,
    )
    wheel = next(tmp_path.glob("corral-*.whl"))
    assert "corral/py.typed" in zipfile.ZipFile(wheel).namelist()
    base = {r.name.lower() for r in _base_requirements(wheel)}
    # sniffio: httpcore looks for it on every async request, and anyio 4 no longer brings it.
    assert base == {"httpx", "pydantic", "typer", "rich", "sniffio"}
    assert not base & {"fastapi", "uvicorn", "psycopg", "psycopg-pool", "prometheus-client", "matplotlib"}


def test_the_sdk_imports_without_the_server(fresh: Path) -> None:
    py = str(fresh / "bin" / "python")
    probe = (
        "import importlib.util, sys\n"
        f"absent = [m for m in {SERVER_ONLY!r} if importlib.util.find_spec(m) is not None]\n"
        "assert not absent, absent\n"
        "import corral.client\n"
        "from corral.client import Corral, AsyncCorral\n"
        f"leaked = [m for m in sys.modules if m.split('.')[0] in {SERVER_ONLY!r}]\n"
        "assert not leaked, leaked\n"
        "print(corral.client.__file__)\n"
    )
    r = _run(fresh, py, "-c", probe)
    assert r.returncode == 0, r.stderr
    assert str(fresh) in r.stdout  # the installed copy, not this checkout


def test_the_client_cli_runs_and_server_commands_name_their_extra(fresh: Path) -> None:
    corral = str(fresh / "bin" / "corral")
    r = _run(fresh, corral, "--help")
    assert r.returncode == 0, r.stderr
    for command in ("burst", "ps", "hosts", "exec", "serve", "agent", "sim"):
        assert command in r.stdout
    for args, extra in (
        (["serve", "--runtime", "sim"], "server"),
        (["api", "--store", "sqlite:///x.db"], "server"),
        (["agent", "--listen", "127.0.0.1:0"], "server"),
        (["sim", "burst"], "sim"),
    ):
        r = _run(fresh, corral, *args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert f"pip install 'corral[{extra}]'" in r.stderr, (args, r.stderr)
        assert "Traceback" not in r.stderr
    # A client command gets as far as the network: no server extra needed.
    r = _run(fresh, corral, "ps", "--url", "http://127.0.0.1:9")
    assert "corral[server]" not in r.stderr and "ModuleNotFoundError" not in r.stderr, r.stderr
