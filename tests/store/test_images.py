"""What every store keeps of images: a template's image, config and disk, and the image each sandbox
was created from (kept through a rebuild of its template, which names a new digest)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from corral.images import ImageConfig
from corral.store import InvalidRecord, NameConflict, SandboxRecord, Store, TemplateRecord

IMAGE = "sha256:" + "ab" * 32


async def test_a_template_keeps_its_image_config_and_disk(store: Store) -> None:
    config = ImageConfig(
        env={"LANG": "C.UTF-8"}, user="user", workdir="/work", start_cmd="serve", ready_cmd="true"
    )
    made = await store.create_template(
        TemplateRecord("py", 1.0, 512, image=IMAGE, image_config=config, disk_mb=2048)
    )
    got = await store.get_template("py")
    assert got == made and got is not None
    assert (got.image, got.image_config, got.disk_mb) == (IMAGE, config, 2048)
    plain = await store.create_template(TemplateRecord("plain", 1.0, 512))
    assert (plain.image, plain.image_config, plain.disk_mb) == (None, None, None)
    assert [t.name for t in await store.list_templates()] == ["default", "plain", "py"]


async def test_a_sandbox_keeps_the_image_it_was_created_from(store: Store) -> None:
    tenant = await store.create_tenant("alice", max_sandboxes=10, max_memory_mb=1 << 20)
    rec = SandboxRecord("sb-1", tenant.id, "py", 512, 1.0, image=IMAGE, disk_mb=4096)
    out = await store.create_sandbox(rec)
    got = await store.get_sandbox("sb-1")
    assert got is not None and (got.image, got.disk_mb) == (IMAGE, 4096) == (
        out.record.image,
        out.record.disk_mb,
    )
    assert got.request().image == IMAGE


@pytest.mark.parametrize(
    "bad",
    [
        {"image": "ubuntu:22.04"},
        {"image": "sha256:" + "0" * 63},
        {"image": "sha256:" + "../" * 20 + "etc"},
        {"image_config": ImageConfig()},
        {"image": IMAGE, "disk_mb": 0},
        {"image": IMAGE, "disk_mb": 1 << 40},
    ],
)
async def test_a_template_s_image_and_disk_are_checked(store: Store, bad: dict[str, object]) -> None:
    with pytest.raises(InvalidRecord):
        await store.create_template(TemplateRecord("bad", 1.0, 512, **bad))  # type: ignore[arg-type]
    assert await store.get_template("bad") is None


async def test_a_sandbox_s_image_is_checked(store: Store) -> None:
    tenant = await store.create_tenant("alice", max_sandboxes=10, max_memory_mb=1 << 20)
    with pytest.raises(InvalidRecord):
        await store.create_sandbox(SandboxRecord("sb-1", tenant.id, "py", 512, 1.0, image="latest"))
    assert await store.get_sandbox("sb-1") is None


async def test_the_images_in_use_are_those_templates_and_sandboxes_name_and_versions_are_kept(
    store: Store,
) -> None:
    old, new, other = ("sha256:" + c * 64 for c in "123")
    await store.create_template(TemplateRecord("web", 1.0, 512, image=old))
    tenant = await store.create_tenant("alice", max_sandboxes=10, max_memory_mb=1 << 20)
    await store.create_sandbox(SandboxRecord("sb-1", tenant.id, "web", 512, 1.0, image=old, disk_mb=64))
    # A rebuild: the template names its next version; the sandbox still names the old image.
    await store.publish_template(TemplateRecord("web", 1.0, 512, image=new, version=2))
    await store.create_template(TemplateRecord("plain", 1.0, 512))
    got = await store.get_template("web")
    assert got is not None and (got.image, got.version) == (new, 2)
    assert await store.images_in_use() == {old, new}
    await store.delete_sandbox("sb-1")
    assert await store.images_in_use() == {new}
    assert other not in await store.images_in_use()
    with pytest.raises(InvalidRecord):
        await store.create_template(TemplateRecord("v0", 1.0, 512, version=0))


async def test_a_template_is_published_by_compare_and_set_on_its_version(either: Store) -> None:
    store = either
    first, second = ("sha256:" + c * 64 for c in "45")
    got = await store.publish_template(TemplateRecord("web", 1.0, 512, image=first, runtime="gvisor"))
    assert got.version == 1
    # Version 1 is a create: the name taken, a second "first version" is refused.
    with pytest.raises(NameConflict):
        await store.publish_template(TemplateRecord("web", 1.0, 512, image=second))
    # Version 3 while the store holds 1 (another build published 2 first, here none did): refused,
    # and the record is untouched.
    with pytest.raises(NameConflict):
        await store.publish_template(TemplateRecord("web", 2.0, 1024, image=second, version=3))
    kept = await store.get_template("web")
    assert kept is not None and (kept.image, kept.version, kept.cpus) == (first, 1, 1.0)
    # The next version replaces the record in place: never absent in between.
    got = await store.publish_template(TemplateRecord("web", 2.0, 1024, image=second, version=2))
    now = await store.get_template("web")
    assert now == got and (now.image, now.version, now.cpus, now.memory_mb) == (second, 2, 2.0, 1024)
    # A template that is gone is not brought back by a later version.
    assert await store.delete_template("web")
    with pytest.raises(NameConflict):
        await store.publish_template(TemplateRecord("web", 1.0, 512, image=first, version=3))
    assert await store.get_template("web") is None


@pytest.mark.parametrize("bad", [{"failover": "sometimes"}, {"version": 0}, {"cpus": 0.0}])
async def test_a_published_template_is_checked_as_a_created_one(
    either: Store, bad: dict[str, object]
) -> None:
    for version in (1, 2):
        record = replace(TemplateRecord("web", 1.0, 512), **{"version": version, **bad})
        with pytest.raises(InvalidRecord):
            await either.publish_template(record)
        with pytest.raises(InvalidRecord):
            await either.create_template(record)
    assert await either.get_template("web") is None
