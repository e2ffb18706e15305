"""The vm runtime's probe decides from facts: each check, in the order a boot meets them, on hosts
described here rather than found."""

from __future__ import annotations

import dataclasses

import pytest

from corral.codes import ErrorCode
from corral.core.vmhost import Check, KvmFacts, judge

# A bare-metal Intel host with KVM loaded: everything a stock guest needs.
READY = KvmFacts(
    dev_kvm=True, api_version=12, cpu_flags=frozenset({"vmx", "sse2"}), modules=frozenset({"kvm_intel"})
)
# This project's machines: a PVM guest whose /dev/kvm creates VMs, without VMX or SVM.
PVM_GUEST = KvmFacts(
    dev_kvm=True, api_version=12, cpu_flags=frozenset({"hypervisor", "sse2"}), modules=frozenset({"kvm_pvm"})
)


def test_a_host_with_hardware_kvm_could_boot_and_the_runtime_still_refuses_as_unbuilt() -> None:
    verdict = judge(READY)
    assert verdict.check is Check.READY and verdict.can_boot
    assert verdict.code is ErrorCode.VM_RUNTIME_NOT_BUILT
    assert "vmx" in verdict.reason
    amd = judge(dataclasses.replace(READY, cpu_flags=frozenset({"svm"}), modules=frozenset({"kvm_amd"})))
    assert amd.can_boot and "svm" in amd.reason


def test_a_paravirtual_kvm_without_vmx_or_svm_cannot_boot_a_stock_guest() -> None:
    verdict = judge(PVM_GUEST)
    assert verdict.check is Check.NO_HARDWARE_VIRTUALISATION and not verdict.can_boot
    assert verdict.code is ErrorCode.VM_HOST_UNSUPPORTED
    assert "kvm_pvm" in verdict.reason and "neither vmx nor svm" in verdict.reason
    # Without PVM loaded the reason does not blame it.
    assert "kvm_pvm" not in judge(dataclasses.replace(PVM_GUEST, modules=frozenset())).reason


def test_vmx_is_not_enough_when_dev_kvm_is_pvms() -> None:
    pvm_with_vmx = dataclasses.replace(PVM_GUEST, cpu_flags=frozenset({"vmx"}))
    assert judge(pvm_with_vmx).check is Check.PARAVIRTUAL_KVM
    # A hardware module beside it serves /dev/kvm: ready.
    both = dataclasses.replace(pvm_with_vmx, modules=frozenset({"kvm_pvm", "kvm_intel"}))
    assert judge(both).can_boot


@pytest.mark.parametrize(
    ("change", "check", "words"),
    [
        ({"dev_kvm": False}, Check.NO_DEV_KVM, "no /dev/kvm"),
        ({"open_error": "EACCES (Permission denied)"}, Check.DEV_KVM_DENIED, "EACCES"),
        ({"api_version": None}, Check.KVM_API_VERSION, "version None"),
        ({"api_version": 11}, Check.KVM_API_VERSION, "version 11, not 12"),
        ({"create_vm_error": "ENOMEM (Cannot allocate memory)"}, Check.KVM_CREATE_VM, "ENOMEM"),
        ({"cpu_flags": frozenset()}, Check.NO_HARDWARE_VIRTUALISATION, "neither vmx nor svm"),
    ],
)
def test_each_failed_check_is_named_with_its_reason(
    change: dict[str, object], check: Check, words: str
) -> None:
    verdict = judge(dataclasses.replace(READY, **change))  # type: ignore[arg-type]
    assert verdict.check is check and words in verdict.reason
    assert verdict.code is ErrorCode.VM_HOST_UNSUPPORTED


def test_the_first_check_a_boot_would_meet_is_the_one_named() -> None:
    broken = KvmFacts(
        dev_kvm=True,
        open_error="EACCES (Permission denied)",
        api_version=None,
        create_vm_error="EINVAL",
        cpu_flags=frozenset(),
        modules=frozenset({"kvm_pvm"}),
    )
    assert judge(broken).check is Check.DEV_KVM_DENIED
    assert judge(dataclasses.replace(broken, dev_kvm=False)).check is Check.NO_DEV_KVM
    assert judge(dataclasses.replace(broken, open_error=None)).check is Check.KVM_API_VERSION
    assert judge(dataclasses.replace(broken, open_error=None, api_version=12)).check is Check.KVM_CREATE_VM
