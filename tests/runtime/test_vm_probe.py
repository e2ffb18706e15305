"""The vm runtime's probe on a real host: what it reads of /dev/kvm, the CPU and the kvm modules, and
``--runtime vm`` refusing at start-up, on ``corral agent`` and ``corral serve``, with its code and why."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from corral.agent.cli import agent_command
from corral.cli import app
from corral.codes import ErrorCode
from corral.core.vmhost import Check, KvmFacts, judge
from corral.runtime.vm import kvm_facts, unavailable_reason

AGENT = typer.Typer()
AGENT.command()(agent_command)


def _host(tmp_path: Path, flags: str, modules: tuple[str, ...]) -> tuple[Path, Path]:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: x\nflags\t\t: {flags}\n\nprocessor\t: 1\n")
    sys_module = tmp_path / "module"
    for m in (*modules, "kvm", "ext4"):
        (sys_module / m).mkdir(parents=True)
    return cpuinfo, sys_module


def test_the_facts_are_read_from_the_cpu_flags_the_modules_and_dev_kvm(tmp_path: Path) -> None:
    cpuinfo, modules = _host(tmp_path, "fpu vmx sse2", ("kvm_intel",))
    facts = kvm_facts(tmp_path / "no-kvm", cpuinfo, modules)
    assert not facts.dev_kvm and {"vmx", "sse2"} <= facts.cpu_flags
    assert facts.modules == {"kvm_intel"}  # only kvm's vendor modules are named
    assert judge(facts).check is Check.NO_DEV_KVM


def test_a_dev_kvm_that_answers_no_kvm_ioctl_fails_the_api_check(tmp_path: Path) -> None:
    cpuinfo, modules = _host(tmp_path, "svm", ("kvm_amd",))
    fake = tmp_path / "kvm"
    fake.write_bytes(b"")  # opens read-write, but is no KVM device: every ioctl is ENOTTY
    facts = kvm_facts(fake, cpuinfo, modules)
    assert facts.dev_kvm and facts.open_error is None and facts.api_version is None
    assert facts.create_vm_error is not None and "ENOTTY" in facts.create_vm_error
    assert judge(facts).check is Check.KVM_API_VERSION


def test_a_host_that_could_boot_is_still_refused_and_told_why() -> None:
    ready = KvmFacts(True, None, 12, None, frozenset({"svm"}), frozenset({"kvm_amd"}))
    said = unavailable_reason(judge(ready))
    assert f"[{ErrorCode.VM_RUNTIME_NOT_BUILT}, check {Check.READY}]" in said
    assert "can boot a stock guest" in said and "no VM runtime yet" in said


def _expected_here() -> ErrorCode | None:
    """What this host's refusal must say, from /proc/cpuinfo read here: without VMX or SVM no stock
    guest boots (these machines); with them it depends on /dev/kvm, so either code may come."""
    flags = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    return None if flags & {"vmx", "svm"} else ErrorCode.VM_HOST_UNSUPPORTED


def _check_refusal(output: str, exit_code: int) -> None:
    text = " ".join(output.split())  # the error box wraps lines
    assert exit_code != 0
    assert "the vm runtime is not available" in text and "docs/runtimes.md" in text
    said = [c for c in (ErrorCode.VM_HOST_UNSUPPORTED, ErrorCode.VM_RUNTIME_NOT_BUILT) if f"[{c}," in text]
    assert len(said) == 1, text
    expected = _expected_here()
    if expected is not None:
        assert said == [expected]
        assert f"check {Check.NO_HARDWARE_VIRTUALISATION}" in text or f"check {Check.NO_DEV_KVM}" in text


def test_corral_agent_runtime_vm_refuses_on_this_host(tmp_path: Path) -> None:
    args = ["--control-plane", "http://127.0.0.1:1", "--id", "a", "--dev-shared-token", "--runtime", "vm"]
    args += ["--image-cache", str(tmp_path / "images")]
    result = CliRunner().invoke(AGENT, args, env={"CORRAL_AGENT_TOKEN": "t"})
    _check_refusal(result.output, result.exit_code)


def test_corral_serve_runtime_vm_refuses_on_this_host(tmp_path: Path) -> None:
    store = tmp_path / "corral.db"
    args = ["serve", "--runtime", "vm", "--store", f"sqlite:///{store}", "--port", "0"]
    result = CliRunner().invoke(app, args, env={**os.environ, "CORRAL_TOKEN": "t" * 32})
    _check_refusal(result.output, result.exit_code)
    assert not store.exists()  # refused before it made anything


@pytest.mark.skipif(not Path("/dev/kvm").exists(), reason="no /dev/kvm on this host")
def test_this_hosts_dev_kvm_is_probed_through_its_ioctls() -> None:
    facts = kvm_facts()
    assert facts.dev_kvm
    if facts.open_error is None:
        assert facts.api_version == 12  # the one stable KVM API
