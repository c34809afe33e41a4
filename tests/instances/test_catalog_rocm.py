"""The ROCm images carry the stack the developer cloud launched with (ROCm 7), each on a released AMD base
tag, and the catalogue says which ROCm version each one carries: the launch page shows it."""

import re

import pytest

from portal.instances.catalog import load_catalog

CATALOG = load_catalog()
GPU_IMAGES = [image for image in CATALOG.images.values() if image.needs_gpu]
# A pinned tag names a release: never "latest", a nightly or a floating major.
FLOATING = re.compile(r":(latest|nightly|dev|main)?$|nightly|latest", re.IGNORECASE)


def base_of(image) -> str:
    dockerfile = (CATALOG.containers_dir / image.context / "Dockerfile").read_text()
    found = re.search(r"^ARG BASE=(\S+)$", dockerfile, flags=re.MULTILINE)
    assert found, f"{image.key}: its Dockerfile pins no ARG BASE"
    return found.group(1)


def rocm_in_tag(tag: str) -> str:
    """'rocm7.0.2' / 'rocm700' / ':7.0.2-complete' -> the ROCm release the tag names, as '7.0.2' / '7.0'."""
    for pattern in (r"rocm(\d+\.\d+(?:\.\d+)?)", r"rocm(\d)(\d)(\d)\b", r":(\d+\.\d+(?:\.\d+)?)-complete"):
        found = re.search(pattern, tag)
        if found:
            parts = found.groups()
            return ".".join(parts).rstrip(".0") if len(parts) == 3 else parts[0]
    raise AssertionError(f"{tag} names no ROCm release")


def test_there_are_rocm_images_to_check():
    assert {"rocm", "pytorch", "vllm", "sglang", "jax"} <= {image.key for image in GPU_IMAGES}


@pytest.mark.parametrize("image", GPU_IMAGES, ids=lambda image: image.key)
def test_each_rocm_image_pins_a_released_rocm_7_base_and_the_catalogue_names_that_rocm_version(image):
    base = base_of(image)
    assert not FLOATING.search(base.split("/")[-1]), f"{image.key}: {base} is not a released tag"
    tag_rocm = rocm_in_tag(base)
    assert tag_rocm.startswith("7"), f"{image.key}: {base} is ROCm {tag_rocm}, not ROCm 7"

    named = [framework for framework in image.frameworks if framework.startswith("ROCm ")]
    assert len(named) == 1, f"{image.key}: the catalogue should name exactly one ROCm version: {image.frameworks}"
    catalogue_rocm = named[0].removeprefix("ROCm ")
    assert catalogue_rocm.startswith(tag_rocm) or tag_rocm.startswith(catalogue_rocm), (
        f"{image.key}: the catalogue says ROCm {catalogue_rocm}, its base {base} is ROCm {tag_rocm}"
    )
