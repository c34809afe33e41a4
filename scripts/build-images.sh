#!/usr/bin/env bash
# Build catalogue images on the local Docker engine, idempotently, and print each one's tag on stdout
# (progress goes to stderr).
#
#   bash scripts/build-images.sh [KEY...]      default: cpu
#
# Tags come from portal/instances/catalog.py (one source of truth with the portal): an image is
# "<repository>:<sha256 of its Dockerfile, the shared entrypoint and its base tag, first 12>", and an
# existing tag is never rebuilt. Images with `base = "debian"` (the cpu image) build FROM a local Debian
# base made here, no registry needed:
#   debootstrap --variant=minbase --arch=amd64 bookworm DIR   then   tar -C DIR -c . | docker import -
# tagged "devcloud/debian-base:bookworm-<hash of those parameters>", also made once.
# The ROCm images build FROM AMD's images, so they need a registry (see containers/README.md).
#
# Environment: PYTHON (default .venv/bin/python), DEVCLOUD_DEBIAN_MIRROR (default
# http://deb.debian.org/debian), DEVCLOUD_BUILD_CA_BUNDLE (default /etc/ssl/certs/ca-certificates.crt).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf 'build-images: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }
started=$(date +%s)

PYTHON=${PYTHON:-.venv/bin/python}
[ -x "$PYTHON" ] || command -v "$PYTHON" >/dev/null ||
  die "no Python at $PYTHON; run 'make venv' first (or set PYTHON to the portal's virtualenv python)"
command -v docker >/dev/null || die "the docker command is not installed (Debian: apt-get install docker.io)"
docker info >/dev/null 2>&1 || die "the Docker engine does not answer ('docker info' fails); start dockerd"
MIRROR=${DEVCLOUD_DEBIAN_MIRROR:-http://deb.debian.org/debian}

# One build at a time per machine: two test sessions (or a test run and `make run`) starting together
# would otherwise both debootstrap and build the same tag. The second waits, then finds it present.
if command -v flock >/dev/null; then
  exec 9>"${TMPDIR:-/tmp}/devcloud-build-images.lock"
  flock 9 || die "could not take the build lock ${TMPDIR:-/tmp}/devcloud-build-images.lock"
fi

catalog() { "$PYTHON" -m portal.instances.catalog "$@"; }
image_exists() { docker image inspect "$1" >/dev/null 2>&1; }

ensure_base() {  # ensure_base REFERENCE SUITE VARIANT ARCH
  local reference=$1 suite=$2 variant=$3 arch=$4
  if image_exists "$reference"; then
    say "base $reference is present"
    return
  fi
  local debootstrap
  debootstrap=$(command -v debootstrap || ls /usr/sbin/debootstrap 2>/dev/null || true)
  if [ -z "$debootstrap" ] && [ "$(id -u)" -eq 0 ]; then
    say "debootstrap is missing; installing it with apt"
    bash scripts/apt-install.sh debootstrap debian-archive-keyring >&2 || true
    debootstrap=$(command -v debootstrap || ls /usr/sbin/debootstrap 2>/dev/null || true)
  fi
  [ -n "$debootstrap" ] || die "debootstrap is not installed (Debian/Ubuntu: apt-get install debootstrap debian-archive-keyring)"
  [ "$(id -u)" -eq 0 ] || die "debootstrap needs root to build the base $reference; run this script as root once"
  local rootfs
  # /var/tmp, not /tmp: /tmp is often a tmpfs mounted nodev, and debootstrap makes device nodes.
  rootfs=$(mktemp -d /var/tmp/devcloud-debootstrap.XXXXXX)
  # shellcheck disable=SC2064
  trap "rm -rf '$rootfs'" EXIT
  say "debootstrap --variant=$variant --arch=$arch $suite from $MIRROR (a few minutes, once)"
  "$debootstrap" --variant="$variant" --arch="$arch" "$suite" "$rootfs" "$MIRROR" >&2 ||
    die "debootstrap failed; the lines above say why (is $MIRROR reachable?)"
  # Downloaded .debs and package lists are not needed in the image; the Dockerfile updates the lists.
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/tmp/*
  say "docker import as $reference"
  tar --numeric-owner -C "$rootfs" -c . |
    docker import --change 'CMD ["/bin/bash"]' --message "debootstrap --variant=$variant $suite" - "$reference" >/dev/null
  rm -rf "$rootfs"
  trap - EXIT
}

build_image() {  # build_image KEY
  local key=$1 REFERENCE BASE_REFERENCE BASE_SUITE BASE_VARIANT BASE_ARCH
  local plan
  plan=$(catalog plan "$key") || die "cannot plan $key (see above)"
  eval "$plan"
  if image_exists "$REFERENCE"; then
    say "$key: $REFERENCE is present, nothing to build"
    echo "$REFERENCE"
    return
  fi
  local build_args=()
  if [ -n "$BASE_REFERENCE" ]; then
    ensure_base "$BASE_REFERENCE" "$BASE_SUITE" "$BASE_VARIANT" "$BASE_ARCH"
    build_args=(--build-arg "BASE=$BASE_REFERENCE")
  fi
  say "$key: docker build -t $REFERENCE"
  local step_started
  step_started=$(date +%s)
  # The context comes from the catalogue module too: Dockerfile, the shared entrypoint/, build-ca.crt.
  catalog context "$key" | docker build --tag "$REFERENCE" --label "devcloud.image=$key" "${build_args[@]}" - >&2 ||
    die "$key: docker build failed; the lines above say why"
  say "$key: built $REFERENCE in $(($(date +%s) - step_started))s"
  echo "$REFERENCE"
}

keys=("$@")
[ ${#keys[@]} -gt 0 ] || keys=(cpu)
for key in "${keys[@]}"; do
  build_image "$key"
done
say "done in $(($(date +%s) - started))s"
