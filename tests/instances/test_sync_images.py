"""`manage.py sync_images` loads containers/catalog.toml into the Image table."""

import io
import shutil

import pytest
from django.core.management import CommandError, call_command

from portal.instances.catalog import CONTAINERS_DIR, image_reference, load_catalog
from portal.instances.models import Image


def sync(catalog=None) -> str:
    out = io.StringIO()
    args = ["--catalog", str(catalog)] if catalog else []
    call_command("sync_images", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def catalogue(tmp_path):
    """A writable copy of containers/ (catalogue and Dockerfiles); returns the catalogue's path."""
    shutil.copytree(CONTAINERS_DIR, tmp_path / "containers")
    return tmp_path / "containers" / "catalog.toml"


def test_it_loads_every_catalogue_image(db):
    output = sync()

    images = {image.key: image for image in Image.objects.all()}
    assert set(images) == {"cpu", "rocm", "pytorch", "vllm", "sglang", "jax"}
    cpu = images["cpu"]
    assert cpu.reference == image_reference("cpu")
    assert cpu.reference.startswith("devcloud/cpu:") and len(cpu.reference.split(":")[1]) == 12
    assert (cpu.is_default, cpu.needs_gpu, cpu.is_enabled, cpu.sizes, cpu.build_context) == (
        True, False, True, ["1x", "8x"], "cpu"
    )  # fmt: skip
    assert [key for key, image in images.items() if image.is_default] == ["cpu"]
    assert images["pytorch"].needs_gpu is True
    assert "created cpu" in output and "created jax" in output


def test_it_changes_nothing_when_run_again(db):
    sync()
    before = list(Image.objects.order_by("key").values())

    output = sync()

    assert list(Image.objects.order_by("key").values()) == before
    assert output.strip() == "no changes (6 images up to date)"


def test_it_updates_an_entry_and_says_which_fields_changed(db, catalogue):
    sync(catalogue)
    catalogue.write_text(catalogue.read_text().replace('name = "JAX"', 'name = "JAX on ROCm"'))
    dockerfile = catalogue.parent / "jax" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "\n# a change\n")

    output = sync(catalogue)

    jax = Image.objects.get(key="jax")
    assert jax.name == "JAX on ROCm"
    assert jax.reference == load_catalog(catalogue).reference("jax") != image_reference("jax")
    assert output.strip() == "updated jax: name, reference"


def test_it_disables_an_image_removed_from_the_catalogue_without_deleting_it(db, catalogue):
    sync(catalogue)
    text = catalogue.read_text()
    catalogue.write_text(text[: text.index("[images.jax]")])

    output = sync(catalogue)

    jax = Image.objects.get(key="jax")
    assert jax.is_enabled is False
    assert Image.objects.count() == 6
    assert output.strip() == "disabled jax (no longer in the catalogue)"
    # Put back, it is enabled again.
    catalogue.write_text(text)
    assert sync(catalogue).strip() == "updated jax: is_enabled"


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda t: t.replace('[images.cpu]\nname = "CPU JupyterLab"', "[images.cpu]\nname = "),
            "not valid TOML",
        ),
        (
            lambda t: t.replace(
                'sizes = ["1x", "8x"]\ncontext = "cpu"', 'sizes = ["1x", "4x"]\ncontext = "cpu"'
            ),
            "[images.cpu]: 'sizes'",
        ),
        (lambda t: t.replace('name = "JAX"\n', ""), "[images.jax]: 'name' is required"),
        (
            lambda t: t.replace('context = "vllm"', 'contxt = "vllm"'),
            "[images.vllm]: unknown field(s) contxt",
        ),
        (
            lambda t: t.replace('context = "sglang"', 'context = "no-such-dir"'),
            "[images.sglang]: no Dockerfile",
        ),
        (
            lambda t: t.replace('context = "rocm"\ndefault = false', 'context = "rocm"\ndefault = true'),
            "more than one image has default = true",
        ),
        (
            lambda t: t.replace("sort_order = 60", 'sort_order = "last"'),
            "[images.jax]: 'sort_order' must be a whole number",
        ),
    ],
    ids=["toml", "size", "missing-name", "typo", "context", "two-defaults", "type"],
)
def test_it_refuses_a_malformed_catalogue_naming_the_file_and_entry(db, catalogue, change, message):
    catalogue.write_text(change(catalogue.read_text()))

    with pytest.raises(CommandError) as failure:
        sync(catalogue)

    assert str(catalogue) in str(failure.value)
    assert message in str(failure.value)
    assert not Image.objects.exists()


def test_it_refuses_a_missing_catalogue_file(db, tmp_path):
    with pytest.raises(CommandError, match="file not found"):
        sync(tmp_path / "nope.toml")
