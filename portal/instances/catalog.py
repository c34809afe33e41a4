"""The image catalogue, containers/catalog.toml: parsing, the hash-tagged reference each image is run as,
its build context, and `catalog_sync`, which loads the catalogue into the Image table.

This is the one place that computes image tags. scripts/build-images.sh asks it for them
(`python -m portal.instances.catalog plan cpu`) instead of hashing on its own, so the tag the script
builds is always the tag the portal launches. For that, nothing here needs Django set up except
`catalog_sync`, which imports the models when called.
"""

import hashlib
import io
import json
import os
import re
import shlex
import sys
import tarfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from portal.instances.sizes import SIZES

REPO_ROOT = Path(__file__).resolve().parents[2]
CONTAINERS_DIR = REPO_ROOT / "containers"
CATALOG_PATH = CONTAINERS_DIR / "catalog.toml"
# Shared by every image and added to every build context as entrypoint/.
ENTRYPOINT_DIR = CONTAINERS_DIR / "entrypoint"
# The build machine's CA bundle goes into each build context as build-ca.crt: package downloads made
# inside a build may pass through a TLS-inspecting proxy that only this machine's bundle trusts. It is a
# property of where the image is built, not of the image, so it is not part of the tag's hash.
CA_BUNDLE_PATH = Path(os.environ.get("DEVCLOUD_BUILD_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt"))
HASH_LENGTH = 12
# What `base = "..."` may name; only the local debootstrap base exists.
KNOWN_BASES = ("debian",)

_KEY_RE = re.compile(r"^[a-z0-9]+(?:[-_][a-z0-9]+)*$")
# A Docker repository path: lowercase components separated by "/", optionally after a registry host[:port].
_REPOSITORY_RE = re.compile(
    r"^(?:[a-zA-Z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*$"
)
_IMAGE_FIELDS = {
    "name", "description", "frameworks", "sizes", "context", "default", "needs_gpu", "enabled",
    "sort_order", "repository", "base",
}  # fmt: skip
_BASE_FIELDS = {"repository", "suite", "variant", "arch"}


class CatalogError(Exception):
    """The catalogue cannot be used. The message names the file and the entry at fault."""


@dataclass(frozen=True)
class BaseSpec:
    """The local Debian base: what debootstrap is asked for, and the tag `docker import` gives it."""

    repository: str
    suite: str
    variant: str
    arch: str

    @property
    def digest(self) -> str:
        # The mirror is deliberately left out: where the packages come from does not change what they are.
        params = {"suite": self.suite, "variant": self.variant, "arch": self.arch}
        return hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:HASH_LENGTH]

    @property
    def reference(self) -> str:
        return f"{self.repository}:{self.suite}-{self.digest}"


@dataclass(frozen=True)
class CatalogImage:
    key: str
    name: str
    description: str
    frameworks: tuple[str, ...]
    sizes: tuple[str, ...]
    context: str
    default: bool
    needs_gpu: bool
    enabled: bool
    sort_order: int
    repository: str
    base: str | None


@dataclass(frozen=True)
class Catalog:
    path: Path
    containers_dir: Path
    base: BaseSpec | None
    images: dict[str, CatalogImage]

    def image(self, key: str) -> CatalogImage:
        """Returns the entry for `key`. Raises CatalogError when there is none."""
        try:
            return self.images[key]
        except KeyError:
            known = ", ".join(sorted(self.images))
            raise CatalogError(f"{self.path}: no image {key!r} in the catalogue (it has: {known})") from None

    def base_reference(self, key: str) -> str | None:
        """The tag of the local base `key` builds FROM, or None for images on a registry base."""
        image = self.image(key)
        return self.base.reference if image.base and self.base else None

    def build_args(self, key: str) -> dict[str, str]:
        base = self.base_reference(key)
        return {"BASE": base} if base else {}

    def build_inputs(self, key: str) -> list[tuple[str, Path]]:
        """The files of `key`'s build context as (path in the context, file), sorted; build-ca.crt aside."""
        image = self.image(key)
        context_dir = self.containers_dir / image.context
        inputs = [(p.relative_to(context_dir).as_posix(), p) for p in _files_under(context_dir)]
        inputs += [
            (f"entrypoint/{p.relative_to(ENTRYPOINT_DIR).as_posix()}", p)
            for p in _files_under(ENTRYPOINT_DIR)
        ]
        return sorted(inputs)

    def digest(self, key: str) -> str:
        """sha256 over the build inputs and the base tag, truncated: the tag of `key`'s image."""
        sha = hashlib.sha256(b"devcloud-image-v1\0")
        for name, path in self.build_inputs(key):
            data = path.read_bytes()
            sha.update(f"{name}\0{len(data)}\0".encode())
            sha.update(data)
        for arg, value in sorted(self.build_args(key).items()):
            sha.update(f"arg\0{arg}={value}\0".encode())
        return sha.hexdigest()[:HASH_LENGTH]

    def reference(self, key: str, *, registry: str = "") -> str:
        """The reference hosts run for `key`, e.g. "devcloud/cpu:3f2a9c1e0b7d", or with `registry` (a
        registry's host[:port], the IMAGE_REGISTRY setting) "registry.internal:5000/devcloud/cpu:3f2a...",
        which hosts pull from there. A repository that names its own registry keeps it."""
        return f"{registry_qualified(self.image(key).repository, registry)}:{self.digest(key)}"

    def build_context(self, key: str, *, ca_bundle: Path | None = None) -> bytes:
        """Returns `key`'s build context as an uncompressed tar, Dockerfile at its root.

        Metadata is fixed (owner root, mtime 0), so the same inputs give the same bytes and Docker's
        layer cache stays valid across machines.
        """
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for name, path in self.build_inputs(key):
                executable = os.access(path, os.X_OK) or name.endswith(".sh")
                _add_file(tar, name, path.read_bytes(), 0o755 if executable else 0o644)
            ca_path = ca_bundle or CA_BUNDLE_PATH
            ca_data = ca_path.read_bytes() if ca_path.is_file() else b""
            _add_file(tar, "build-ca.crt", ca_data, 0o644)
        return buffer.getvalue()

    def key_for_context(self, context: str) -> str:
        """The key of the image built from `context`. Raises CatalogError when none is."""
        for image in self.images.values():
            if image.context == context:
                return image.key
        raise CatalogError(f"{self.path}: no image is built from context {context!r}")


def _files_under(directory: Path) -> list[Path]:
    return [
        p for p in directory.rglob("*")
        if p.is_file() and not any(part.startswith(".") or part == "__pycache__" for part in p.parts)
    ]  # fmt: skip


def _add_file(tar: tarfile.TarFile, name: str, data: bytes, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    tar.addfile(info, io.BytesIO(data))


def load_catalog(path: Path | str | None = None) -> Catalog:
    """Reads and checks the catalogue. Returns a Catalog.

    Raises CatalogError naming the file and the entry for anything wrong: unreadable or invalid TOML,
    a missing or mistyped field, an unknown field (a typo would otherwise be silently ignored), an
    unknown size, a context directory without a Dockerfile, or more than one default.
    """
    path = Path(path) if path else CATALOG_PATH
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise CatalogError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as error:
        raise CatalogError(f"{path}: cannot be read: {error}") from None
    except tomllib.TOMLDecodeError as error:
        raise CatalogError(f"{path}: not valid TOML: {error}") from None

    # Contexts are relative to the directory of the catalogue, so a catalogue elsewhere (a test's, an
    # operator's fork) brings its own Dockerfiles.
    containers_dir = path.parent
    unknown = set(data) - {"base", "images"}
    if unknown:
        raise CatalogError(
            f"{path}: unknown top-level table(s) {', '.join(sorted(unknown))}; "
            "expected [base] and [images.<key>]"
        )
    base = _parse_base(path, data.get("base"))
    raw_images = data.get("images")
    if not isinstance(raw_images, dict) or not raw_images:
        raise CatalogError(f"{path}: no [images.<key>] entries")

    images = {}
    for key, entry in raw_images.items():
        images[key] = _parse_image(path, containers_dir, key, entry, base)
    defaults = [image.key for image in images.values() if image.default]
    if len(defaults) > 1:
        raise CatalogError(
            f"{path}: more than one image has default = true ({', '.join(defaults)}); keep one"
        )
    for key in defaults:
        if not images[key].enabled:
            raise CatalogError(f"{path}: [images.{key}] is the default but enabled = false")
    return Catalog(path=path, containers_dir=containers_dir, base=base, images=images)


def _parse_base(path: Path, raw) -> BaseSpec | None:
    if raw is None:
        return None
    where = f"{path}: [base]"
    if not isinstance(raw, dict):
        raise CatalogError(f"{where} must be a table")
    unknown = set(raw) - _BASE_FIELDS
    if unknown:
        raise CatalogError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    values = {}
    for name in sorted(_BASE_FIELDS):
        value = raw.get(name)
        if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9._/:-]+", value):
            raise CatalogError(f"{where}: '{name}' must be a non-empty string of letters, digits and ._/:-")
        values[name] = value
    if not _REPOSITORY_RE.match(values["repository"]):
        raise CatalogError(
            f"{where}: 'repository' {values['repository']!r} is not a valid Docker repository name"
        )
    return BaseSpec(**values)


def _parse_image(path: Path, containers_dir: Path, key, entry, base: BaseSpec | None) -> CatalogImage:
    where = f"{path}: [images.{key}]"
    if not isinstance(key, str) or not _KEY_RE.match(key) or len(key) > 50:
        raise CatalogError(f"{where}: the key must be lowercase letters and digits separated by - or _")
    if not isinstance(entry, dict):
        raise CatalogError(f"{where} must be a table")
    unknown = set(entry) - _IMAGE_FIELDS
    if unknown:
        raise CatalogError(
            f"{where}: unknown field(s) {', '.join(sorted(unknown))}; "
            f"known: {', '.join(sorted(_IMAGE_FIELDS))}"
        )

    def get(name, kind, default=...):
        if name not in entry:
            if default is ...:
                raise CatalogError(f"{where}: '{name}' is required")
            return default
        value = entry[name]
        # bool is an int in Python; a sort_order of `true` is still a mistake.
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise CatalogError(f"{where}: '{name}' must be {_kind_name(kind)}, not {value!r}")
        return value

    name = get("name", str).strip()
    if not name or len(name) > 100:
        raise CatalogError(f"{where}: 'name' must be 1 to 100 characters")
    description = get("description", str, "")
    frameworks = get("frameworks", list, [])
    if not all(isinstance(item, str) and item for item in frameworks):
        raise CatalogError(f"{where}: 'frameworks' must be a list of non-empty strings")
    sizes = get("sizes", list)
    if (
        not sizes
        or not all(isinstance(size, str) and size in SIZES for size in sizes)
        or len(set(sizes)) != len(sizes)
    ):
        raise CatalogError(f"{where}: 'sizes' must list some of {', '.join(SIZES)} once each, not {sizes!r}")
    context = get("context", str)
    context_dir = (containers_dir / context).resolve()
    if (
        not context
        or not context_dir.is_relative_to(containers_dir.resolve())
        or context_dir == containers_dir.resolve()
    ):
        raise CatalogError(f"{where}: 'context' must name a directory under {containers_dir}")
    if not (context_dir / "Dockerfile").is_file():
        raise CatalogError(f"{where}: no Dockerfile at {context_dir / 'Dockerfile'}")
    if (context_dir / "entrypoint").exists():
        raise CatalogError(
            f"{where}: the context must not have its own entrypoint/ (the shared one is added)"
        )
    sort_order = get("sort_order", int, 100)
    if sort_order < 0:
        raise CatalogError(f"{where}: 'sort_order' must be 0 or more")
    repository = get("repository", str, f"devcloud/{key}")
    if not _REPOSITORY_RE.match(repository) or len(repository) > 180:
        raise CatalogError(f"{where}: 'repository' {repository!r} is not a valid Docker repository name")
    image_base = get("base", str, None)
    if image_base is not None:
        if image_base not in KNOWN_BASES:
            raise CatalogError(f"{where}: 'base' must be one of {', '.join(KNOWN_BASES)}, not {image_base!r}")
        if base is None:
            raise CatalogError(f"{where}: 'base = \"{image_base}\"' needs a [base] table in the catalogue")
    return CatalogImage(
        key=key,
        name=name,
        description=description.strip(),
        frameworks=tuple(frameworks),
        sizes=tuple(sizes),
        context=context,
        default=get("default", bool, False),
        needs_gpu=get("needs_gpu", bool, True),
        enabled=get("enabled", bool, True),
        sort_order=sort_order,
        repository=repository,
        base=image_base,
    )


def _kind_name(kind) -> str:
    return {str: "a string", list: "a list", bool: "true or false", int: "a whole number"}[kind]


def registry_qualified(repository: str, registry: str) -> str:
    """`repository` under `registry` ("host:port" or "host/path"), unless it already names a registry
    (its first part has a "." or ":", or is "localhost", as Docker reads it) or `registry` is empty."""
    registry = (registry or "").strip().rstrip("/")
    first, slash, _ = repository.partition("/")
    if not registry or (slash and ("." in first or ":" in first or first == "localhost")):
        return repository
    return f"{registry}/{repository}"


def image_reference(key: str, *, path: Path | str | None = None, registry: str = "") -> str:
    """The hash-tagged reference of catalogue image `key`, under `registry` when given. Raises
    CatalogError."""
    return load_catalog(path).reference(key, registry=registry)


# --- Loading into the database ----------------------------------------------------------------------


@dataclass
class SyncReport:
    """What `catalog_sync` changed, by image key."""

    created: list[str] = field(default_factory=list)
    # key -> names of the fields that changed
    updated: dict[str, list[str]] = field(default_factory=dict)
    disabled: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.created or self.updated or self.disabled)

    def lines(self) -> list[str]:
        lines = [f"created {key}" for key in self.created]
        lines += [f"updated {key}: {', '.join(fields)}" for key, fields in self.updated.items()]
        lines += [f"disabled {key} (no longer in the catalogue)" for key in self.disabled]
        if not self.changed:
            lines.append(f"no changes ({len(self.unchanged)} images up to date)")
        return lines


def catalog_sync(*, path: Path | str | None = None, registry: str | None = None) -> SyncReport:
    """Loads the catalogue into the Image table, in one transaction. Returns a SyncReport.

    Images are created or updated by key; an image that left the catalogue is disabled (never deleted:
    instances refer to it). Running it again with the same catalogue changes nothing. References are
    under `registry`, by default the IMAGE_REGISTRY setting (empty: bare "devcloud/<key>:<hash>", for
    engines that build or load their images).
    Raises CatalogError before touching the database when the catalogue is invalid.
    """
    # Imported here so the tag computation above runs without Django (see the module docstring).
    from django.conf import settings
    from django.db import transaction

    from portal.instances.models import Image

    if registry is None:
        registry = getattr(settings, "IMAGE_REGISTRY", "")
    catalog = load_catalog(path)
    wanted = {}
    for key, entry in catalog.images.items():
        wanted[key] = {
            "name": entry.name,
            "description": entry.description,
            "frameworks": list(entry.frameworks),
            "sizes": list(entry.sizes),
            "reference": catalog.reference(key, registry=registry),
            "build_context": entry.context,
            "is_default": entry.default,
            "is_enabled": entry.enabled,
            "needs_gpu": entry.needs_gpu,
            "sort_order": entry.sort_order,
        }

    report = SyncReport()
    with transaction.atomic():
        existing = {image.key: image for image in Image.objects.select_for_update()}
        for key, values in wanted.items():
            image = existing.get(key)
            if image is None:
                Image.objects.create(key=key, **values)
                report.created.append(key)
                continue
            changed = [name for name, value in values.items() if getattr(image, name) != value]
            if changed:
                for name in changed:
                    setattr(image, name, values[name])
                image.save(update_fields=changed)
                report.updated[key] = changed
            else:
                report.unchanged.append(key)
        for key, image in existing.items():
            if key in wanted:
                continue
            if image.is_enabled or image.is_default:
                # Clearing the default too: the catalogue's own default is now the only one.
                image.is_enabled = False
                image.is_default = False
                image.save(update_fields=["is_enabled", "is_default"])
                report.disabled.append(key)
            else:
                report.unchanged.append(key)
    return report


# --- Command line, for scripts/build-images.sh -------------------------------------------------------

_USAGE = """usage: python -m portal.instances.catalog COMMAND [KEY]
  keys            every image key in the catalogue, one a line
  reference KEY   the hash-tagged reference of KEY
  plan KEY        shell assignments: REFERENCE, BASE_REFERENCE and the debootstrap parameters
  context KEY     KEY's build context as a tar on stdout (for `docker build -`)
Set DEVCLOUD_CATALOG to use another catalogue file."""


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help") or (argv[0] != "keys" and len(argv) != 2):
        print(_USAGE, file=sys.stderr)
        return 2
    command, key = argv[0], argv[1] if len(argv) > 1 else None
    try:
        catalog = load_catalog(os.environ.get("DEVCLOUD_CATALOG") or None)
        if command == "keys":
            print("\n".join(catalog.images))
        elif command == "reference":
            print(catalog.reference(key))
        elif command == "plan":
            catalog.image(key)
            base = catalog.base if catalog.image(key).base else None
            values = {
                "REFERENCE": catalog.reference(key),
                "BASE_REFERENCE": base.reference if base else "",
                "BASE_SUITE": base.suite if base else "",
                "BASE_VARIANT": base.variant if base else "",
                "BASE_ARCH": base.arch if base else "",
            }
            print("\n".join(f"{name}={shlex.quote(value)}" for name, value in values.items()))
        elif command == "context":
            sys.stdout.buffer.write(catalog.build_context(key))
        else:
            print(_USAGE, file=sys.stderr)
            return 2
    except CatalogError as error:
        print(f"catalog: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
