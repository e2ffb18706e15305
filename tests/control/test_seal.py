"""Sealed specs: AES-GCM under the newest key with the sandbox id as associated data; old keys open
until a re-seal; the key file is made once, mode 0600, and shared; ``corral admin reseal``."""

from __future__ import annotations

import asyncio
import base64
import os
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from corral.cli import app
from corral.control.reseal import reseal_all
from corral.control.seal import SEAL_KEY_ENV, Sealer, SealError, Spec, load_keys, parse_key
from corral.store import SandboxRecord, open_store

OLD, NEW = bytes(range(32)), bytes(range(1, 33))
SECRET = "canary-reseal-91a7"


def text(key: bytes) -> str:
    return base64.urlsafe_b64encode(key).decode()


def test_a_sealed_spec_opens_only_for_its_id_and_with_a_key_it_was_sealed_under() -> None:
    old = Sealer([OLD])
    sealed = old.seal("sb-a", Spec(env={"E": "1"}, secrets={"S": SECRET}))
    assert SECRET not in sealed
    assert old.open("sb-a", sealed).secrets == {"S": SECRET}
    with pytest.raises(SealError):
        old.open("sb-b", sealed)  # copied onto another record, it does not open
    with pytest.raises(SealError):
        Sealer([NEW]).open("sb-a", sealed)
    tampered = sealed[:-4] + ("AAAA" if not sealed.endswith("AAAA") else "BBBB")
    with pytest.raises(SealError):
        old.open("sb-a", tampered)
    rotated = Sealer([NEW, OLD])
    assert rotated.open("sb-a", sealed).env == {"E": "1"}  # old specs stay readable
    assert rotated.sealed_under(rotated.seal("sb-a", Spec({}, {}))) == rotated.current


def test_keys_come_from_the_environment_or_a_file_made_once_mode_0600(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SEAL_KEY_ENV, raising=False)
    path = tmp_path / "corral.seal.key"
    first = load_keys(path, create=True)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_keys(path, create=True) == first  # a second start (or replica) reads the same
    monkeypatch.setenv(SEAL_KEY_ENV, f"{text(NEW)},{text(OLD)}")
    assert load_keys(path) == [NEW, OLD]
    for bad in ("short", "!!!!", text(b"x" * 16)):
        with pytest.raises(SealError):
            parse_key(bad)
    monkeypatch.delenv(SEAL_KEY_ENV)
    with pytest.raises(SealError):
        load_keys(tmp_path / "missing.key")


async def test_reseal_moves_every_spec_to_the_newest_key(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'corral.db'}"
    old = Sealer([OLD])
    async with open_store(url) as store:
        await store.migrate()
        t = await store.create_tenant("t", max_sandboxes=10, max_memory_mb=10_000)
        for i in range(3):
            sid = f"sb-{i}"
            spec = old.seal(sid, Spec(env={}, secrets={"S": SECRET}))
            await store.create_sandbox(
                SandboxRecord(
                    id=sid, tenant_id=t.id, template="default", memory_mb=256, cpus=1, sealed_spec=spec
                )
            )
        report = await reseal_all(store, Sealer([NEW, OLD]))
        assert (report.checked, report.resealed) == (3, 3)
        for i in range(3):
            sealed = await store.sealed_spec(f"sb-{i}")
            assert sealed is not None
            assert Sealer([NEW]).open(f"sb-{i}", sealed).secrets == {"S": SECRET}
    assert SECRET.encode() not in (tmp_path / "corral.db").read_bytes()


def test_the_reseal_command(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'corral.db'}"

    async def seed() -> None:
        async with open_store(url) as store:
            await store.migrate()
            t = await store.create_tenant("t", max_sandboxes=10, max_memory_mb=10_000)
            spec = Sealer([OLD]).seal("sb-x", Spec(env={}, secrets={"S": SECRET}))
            await store.create_sandbox(
                SandboxRecord(
                    id="sb-x", tenant_id=t.id, template="default", memory_mb=256, cpus=1, sealed_spec=spec
                )
            )

    asyncio.run(seed())
    env = {**os.environ, SEAL_KEY_ENV: f"{text(NEW)},{text(OLD)}"}
    out = CliRunner().invoke(app, ["admin", "reseal", "--store", url], env=env)
    assert out.exit_code == 0, out.output
    assert "1 sealed specs checked, 1 re-sealed" in out.output
    out = CliRunner().invoke(app, ["admin", "reseal", "--store", url], env=env)
    assert "1 sealed specs checked, 0 re-sealed" in out.output  # nothing left under the old key


@pytest.mark.parametrize("command", ["serve", "api"])
def test_stale_and_dead_after_are_checked_in_order(tmp_path: Path, command: str) -> None:
    store = f"sqlite:///{tmp_path / 'corral.db'}"
    args = [command, "--store", store, "--stale-after", "5", "--dead-after", "3", "--port", "0"]
    out = CliRunner().invoke(app, args, env={**os.environ, "CORRAL_TOKEN": "t" * 32})
    assert out.exit_code != 0
    assert "stale_after < dead_after" in out.output
