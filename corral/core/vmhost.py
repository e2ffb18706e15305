"""Whether a host can boot a stock guest kernel under KVM, as Firecracker and Cloud Hypervisor do: the
start-up probe of ``--runtime vm``, decided from facts gathered elsewhere (:mod:`corral.runtime.vm`).

A ``/dev/kvm`` that answers is not enough. Where the host is itself a guest without nested hardware
virtualisation, ``/dev/kvm`` may be PVM's (``kvm_pvm``): it creates VMs, but boots only guest kernels
built for PVM. So the CPU must expose VMX or SVM, and ``/dev/kvm`` must be a hardware vendor's module,
before a stock guest is promised. Pure: the facts are arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from corral.codes import ErrorCode

KVM_API_VERSION = 12  # the only stable KVM API there has been (KVM_GET_API_VERSION since Linux 2.6.22)
HARDWARE_FLAGS = frozenset({"vmx", "svm"})  # Intel VT-x, AMD-V, in /proc/cpuinfo's flags
HARDWARE_MODULES = frozenset({"kvm_intel", "kvm_amd"})
PARAVIRTUAL_MODULE = "kvm_pvm"


class Check(StrEnum):
    """Which check a host failed (or ``READY``): stable, for scripts and tests to match on."""

    NO_DEV_KVM = "no_dev_kvm"
    DEV_KVM_DENIED = "dev_kvm_denied"
    KVM_API_VERSION = "kvm_api_version"
    KVM_CREATE_VM = "kvm_create_vm"
    NO_HARDWARE_VIRTUALISATION = "no_hardware_virtualisation"
    PARAVIRTUAL_KVM = "paravirtual_kvm"
    READY = "ready"


@dataclass(frozen=True, slots=True)
class KvmFacts:
    """What the probe saw. ``open_error``, ``create_vm_error``: the error of opening ``/dev/kvm``
    read-write and of ``KVM_CREATE_VM`` (None: it worked; also None when not reached); ``modules``: the
    loaded kvm modules (``kvm_intel``, ``kvm_amd``, ``kvm_pvm``)."""

    dev_kvm: bool
    open_error: str | None = None
    api_version: int | None = None
    create_vm_error: str | None = None
    cpu_flags: frozenset[str] = frozenset()
    modules: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Verdict:
    check: Check
    reason: str

    @property
    def can_boot(self) -> bool:
        return self.check is Check.READY

    @property
    def code(self) -> ErrorCode:
        """Why ``--runtime vm`` refuses: this host cannot boot a stock guest, or it can but corral has
        no VM runtime to run on it yet (docs/runtimes.md is its shape)."""
        return ErrorCode.VM_RUNTIME_NOT_BUILT if self.can_boot else ErrorCode.VM_HOST_UNSUPPORTED


def judge(facts: KvmFacts) -> Verdict:
    """The first check ``facts`` fail, in the order a boot would meet them, with the reason in words."""
    if not facts.dev_kvm:
        return Verdict(
            Check.NO_DEV_KVM, "there is no /dev/kvm (KVM is not enabled, or not passed into this container)"
        )
    if facts.open_error is not None:
        return Verdict(Check.DEV_KVM_DENIED, f"/dev/kvm cannot be opened read-write: {facts.open_error}")
    if facts.api_version != KVM_API_VERSION:
        return Verdict(
            Check.KVM_API_VERSION,
            f"/dev/kvm answers KVM API version {facts.api_version}, not {KVM_API_VERSION}",
        )
    if facts.create_vm_error is not None:
        return Verdict(Check.KVM_CREATE_VM, f"KVM_CREATE_VM failed: {facts.create_vm_error}")
    pvm = PARAVIRTUAL_MODULE in facts.modules
    paravirtual = (
        f"/dev/kvm is {PARAVIRTUAL_MODULE}'s, a paravirtual KVM that boots only guest kernels built for "
        "PVM, not the stock kernels Firecracker and Cloud Hypervisor boot"
    )
    if not facts.cpu_flags & HARDWARE_FLAGS:
        also = f": {paravirtual}" if pvm else ""
        return Verdict(
            Check.NO_HARDWARE_VIRTUALISATION,
            f"the CPU exposes neither vmx nor svm (no hardware virtualisation; this kernel is likely a "
            f"guest without nested virtualisation){also}",
        )
    if pvm and not facts.modules & HARDWARE_MODULES:
        return Verdict(Check.PARAVIRTUAL_KVM, paravirtual)
    flag = "vmx" if "vmx" in facts.cpu_flags else "svm"
    return Verdict(
        Check.READY, f"/dev/kvm works (KVM API {facts.api_version}, a VM created) and the CPU has {flag}"
    )
