"""The ``vm`` runtime's start-up probe: what this host's ``/dev/kvm``, CPU and kvm modules are, for
:func:`corral.core.vmhost.judge` to decide whether a stock guest kernel can boot here.

There is no VM runtime yet: ``--runtime vm`` always refuses, saying why (docs/runtimes.md is the shape
it will take). The probe opens ``/dev/kvm``, asks its API version and creates one empty VM (no memory,
no vCPU), which it closes at once: what Firecracker and Cloud Hypervisor do first.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from corral.core.vmhost import KvmFacts, Verdict, judge

DEV_KVM = Path("/dev/kvm")
CPUINFO = Path("/proc/cpuinfo")
MODULES = Path("/sys/module")
KVM_MODULES = ("kvm_intel", "kvm_amd", "kvm_pvm")
# _IO(KVMIO, 0x00) and _IO(KVMIO, 0x01), KVMIO = 0xAE (linux/kvm.h).
KVM_GET_API_VERSION = 0xAE00
KVM_CREATE_VM = 0xAE01


def cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str]:
    """The first CPU's flags (every CPU of a machine has the same virtualisation flags)."""
    try:
        with cpuinfo.open() as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def kvm_facts(dev: Path = DEV_KVM, cpuinfo: Path = CPUINFO, modules: Path = MODULES) -> KvmFacts:
    flags = cpu_flags(cpuinfo)
    loaded = frozenset(m for m in KVM_MODULES if (modules / m).exists())
    if not dev.exists():
        return KvmFacts(dev_kvm=False, cpu_flags=flags, modules=loaded)
    try:
        fd = os.open(dev, os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        return KvmFacts(True, open_error=_said(exc), cpu_flags=flags, modules=loaded)
    try:
        try:
            version: int | None = fcntl.ioctl(fd, KVM_GET_API_VERSION, 0)
        except OSError:
            version = None
        create_error = None
        try:
            vm = fcntl.ioctl(fd, KVM_CREATE_VM, 0)  # machine type 0: the default
            os.close(vm)
        except OSError as exc:
            create_error = _said(exc)
    finally:
        os.close(fd)
    return KvmFacts(True, None, version, create_error, flags, loaded)


def _said(exc: OSError) -> str:
    name = errno.errorcode.get(exc.errno or 0, f"errno {exc.errno}")
    return f"{name} ({exc.strerror})" if exc.strerror else name


def unavailable_reason(verdict: Verdict | None = None) -> str:
    """What ``--runtime vm`` says when it refuses (always, for now): the code, the check, the reason,
    where to read on. ``verdict``: this host's (:func:`judge` over :func:`kvm_facts`) unless given."""
    verdict = verdict or judge(kvm_facts())
    if verdict.can_boot:
        what = f"this host can boot a stock guest ({verdict.reason}), but corral has no VM runtime yet"
    else:
        what = f"this host cannot boot a stock guest kernel: {verdict.reason}"
    return (
        f"the vm runtime is not available [{verdict.code}, check {verdict.check}]: {what}. "
        "docs/runtimes.md says what a VM runtime needs; use --runtime process or gvisor"
    )
