#!/usr/bin/env bash
# Make sure everything the test suite talks to is installed and answering on loopback, then print one
# status line per service. Safe to run again and again: when everything already runs it installs nothing,
# touches no network and takes well under a second.
#
#   PostgreSQL  127.0.0.1:5432, user postgres (the database tests create test_<name> databases)
#   Redis       127.0.0.1:6379
#   Docker      the local engine (dockerd started in the background when `docker info` fails)
#   nginx-core  the gateway's production nginx block is tested in front of a real JupyterLab
#   chromium    /usr/bin/chromium for Playwright (never a downloaded browser), fonts-dejavu-core
#   debootstrap to build the CPU JupyterLab image without a registry
#   openssh-client  the real ssh and scp the SSH gateway's tests run
#   fleet       the test fleet (tests/support/fleet.py): ip (iproute2), nsenter (util-linux), iptables,
#               docker-registry, mkfs.xfs (xfsprogs), mkfs.btrfs (btrfs-progs); a registry and engines in
#               network namespaces, each on a loop-mounted data root that enforces disk limits, started by
#               the tests
#   promtool    checks deploy/prometheus/alerts.yml; from Debian's prometheus package, whose server this
#               script does not leave running when it installed the package
#   slurm       the test Slurm cluster (tests/support/slurm.py): slurmctld, slurmd, slurm-client, munge,
#               slurmrestd, runc; munge, the controller and one slurmd per node, started by the tests
#
# Writes var/test-env (sourced by `make test`) when the tests need settings other than the defaults,
# e.g. a DATABASE_URL with a password. Exit status: non-zero when PostgreSQL or Redis cannot be made to
# answer; a Docker engine that will not start is reported but does not stop the run.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p var
VAR=$(pwd)/var
TEST_ENV=$VAR/test-env
DEFAULT_DATABASE_URL=postgres://postgres@127.0.0.1:5432/devcloud

status() { printf '  %-12s %s\n' "$1" "$2"; }
echo "test-services: checking PostgreSQL, Redis, Docker, Chromium"

# --- Packages ---------------------------------------------------------------------------------------
needed=(postgresql redis-server docker.io debootstrap debian-archive-keyring chromium fonts-dejavu-core
  ca-certificates xz-utils nginx-core iproute2 util-linux iptables docker-registry xfsprogs btrfs-progs openssh-client
  slurmctld slurmd slurm-client munge slurmrestd slurm-wlm-jwt-plugin runc prometheus)
had_prometheus=$(dpkg-query -W -f='${db:Status-Status}' prometheus 2>/dev/null || true)
if ! bash scripts/apt-install.sh "${needed[@]}"; then
  echo "test-services: could not install ${needed[*]}" >&2
  exit 1
fi
# Only promtool is wanted: a Prometheus server that the package just started on :9090 is stopped again.
if [ "$had_prometheus" != "installed" ] && command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
  systemctl disable --now prometheus >/dev/null 2>&1 || true
fi

# --- PostgreSQL ---------------------------------------------------------------------------------------
# DATABASE_URL from the caller wins; otherwise what an earlier run wrote to var/test-env; otherwise the
# test settings' default (user postgres, no password, as on a machine with trust auth).
caller_database_url=${DATABASE_URL:-}
if [ -z "$caller_database_url" ] && [ -f "$TEST_ENV" ]; then
  # shellcheck disable=SC1090
  DATABASE_URL=$(set +u; . "$TEST_ENV"; echo "${DATABASE_URL:-}")
fi
DATABASE_URL=${DATABASE_URL:-$DEFAULT_DATABASE_URL}

pg_connects() {  # pg_connects URL: can we log in and run a query? psql wants the database "postgres".
  PGCONNECT_TIMEOUT=3 psql "${1%/*}/postgres" -Atqc 'select 1' >/dev/null 2>&1
}

pg_start_local() {
  if pg_isready -q -h 127.0.0.1 -p 5432 -t 2; then return 0; fi
  local version
  # The newest installed cluster version; a fresh install has exactly one (created by the package).
  version=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n1)
  if [ -z "$version" ]; then
    echo "test-services: PostgreSQL is installed but has no cluster in /etc/postgresql" >&2
    return 1
  fi
  # --skip-systemctl-redirect: works the same with or without systemd (containers, CI).
  pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
  for _ in $(seq 1 30); do
    pg_isready -q -h 127.0.0.1 -p 5432 -t 1 && return 0
    sleep 1
  done
  echo "test-services: PostgreSQL $version did not start; see /var/log/postgresql/postgresql-$version-main.log" >&2
  return 1
}

if ! pg_connects "$DATABASE_URL"; then
  if [ -n "$caller_database_url" ]; then
    echo "test-services: cannot connect with the DATABASE_URL you set" \
      "($(printf '%s' "$caller_database_url" | sed -E 's#(//[^:/@]*):[^@/]*@#\1:***@#'))" >&2
    exit 1
  fi
  pg_start_local
  if ! pg_connects "$DATABASE_URL"; then
    # Debian's default pg_hba.conf wants a password over TCP (scram-sha-256) and peer auth on the socket.
    # Give the postgres role a password, generated once for this checkout, and hand it to pytest.
    password=$(head -c 18 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' | head -c 24)
    (cd / && su postgres -c "psql -q -c \"ALTER USER postgres PASSWORD '$password'\"") >/dev/null
    DATABASE_URL=postgres://postgres:$password@127.0.0.1:5432/devcloud
    if ! pg_connects "$DATABASE_URL"; then
      echo "test-services: PostgreSQL answers on 127.0.0.1:5432 but refuses user postgres; check pg_hba.conf" >&2
      exit 1
    fi
  fi
fi
if [ -n "$caller_database_url" ]; then
  : # The caller's URL wins when make sources var/test-env; leave what an earlier run saved.
elif [ "$DATABASE_URL" = "$DEFAULT_DATABASE_URL" ]; then
  rm -f "$TEST_ENV"
else
  umask 077
  # The caller's own DATABASE_URL, if any, still wins when make sources this file.
  printf '# Written by scripts/test-services.sh; sourced by `make test`.\nexport DATABASE_URL="${DATABASE_URL:-%s}"\n' \
    "$DATABASE_URL" >"$TEST_ENV"
  umask 022
fi
pg_version=$(psql "${DATABASE_URL%/*}/postgres" -Atqc 'show server_version' 2>/dev/null)
status postgresql "ready at ${DATABASE_URL#*@} (PostgreSQL $pg_version)"

# --- Redis --------------------------------------------------------------------------------------------
redis_answers() { [ "$(redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null)" = "PONG" ]; }
if ! redis_answers; then
  # Tests use Redis as a broker only; nothing needs to survive a restart, so keep nothing on disk.
  redis_args=(--daemonize yes --port 6379 --save "" --appendonly no --dir "$VAR" --logfile "$VAR/redis-server.log")
  # Redis 7 accepts an optional address ("-::1": skip it when IPv6 is off); older Redis does not.
  redis-server "${redis_args[@]}" --bind 127.0.0.1 -::1 >/dev/null 2>&1 ||
    redis-server "${redis_args[@]}" --bind 127.0.0.1 >/dev/null 2>&1 || true
  for _ in $(seq 1 50); do redis_answers && break; sleep 0.1; done
fi
if ! redis_answers; then
  echo "test-services: Redis did not start on 127.0.0.1:6379; see var/redis-server.log" >&2
  exit 1
fi
status redis "ready at 127.0.0.1:6379 (redis $(redis-cli -h 127.0.0.1 info server | sed -n 's/^redis_version:\(.*\)\r$/\1/p'))"

# --- Docker -------------------------------------------------------------------------------------------
docker_answers() { timeout 10 docker info >/dev/null 2>&1; }
if ! docker_answers; then
  # A dockerd that is already starting (its pid file names a live process) only needs waiting for.
  if ! { [ -f /var/run/docker.pid ] && kill -0 "$(cat /var/run/docker.pid)" 2>/dev/null; }; then
    # setsid + nohup: the engine must outlive this script and `make`, like a system service would.
    # Every instance gets a network of its own; Docker's default pools hold about 31, fewer than a burst
    # of launches (or the suite) makes, so give it 256 /24s.
    setsid nohup dockerd --default-address-pool base=10.200.0.0/16,size=24 >"$VAR/dockerd.log" 2>&1 </dev/null &
    dockerd_pid=$!
  fi
  for _ in $(seq 1 60); do
    docker_answers && break
    # An engine that cannot run here (e.g. an unprivileged container) exits at once: stop waiting then.
    if [ -n "${dockerd_pid:-}" ] && ! kill -0 "$dockerd_pid" 2>/dev/null; then break; fi
    sleep 1
  done
fi
if docker_answers; then
  status docker "ready (engine $(docker version --format '{{.Server.Version}}' 2>/dev/null))"
else
  status docker "NOT AVAILABLE: tests that start containers will fail; see var/dockerd.log"
fi

# --- Tools --------------------------------------------------------------------------------------------
if [ -x /usr/bin/chromium ]; then
  status chromium "$(/usr/bin/chromium --version 2>/dev/null | head -n1) at /usr/bin/chromium"
else
  status chromium "NOT FOUND at /usr/bin/chromium: browser tests will fail (Ubuntu: no deb package, see README)"
fi
status debootstrap "$(command -v debootstrap || echo 'NOT FOUND')"
status promtool "$(command -v promtool || echo 'NOT FOUND: the alert rules test will fail')"
fleet_tools=$(for tool in ip nsenter iptables dockerd docker-registry mkfs.xfs mkfs.btrfs; do command -v "$tool" >/dev/null || printf '%s ' "$tool"; done)
status fleet "${fleet_tools:+MISSING $fleet_tools(the fleet tests will skip)}${fleet_tools:-ip, nsenter, iptables, dockerd, docker-registry, mkfs.xfs, mkfs.btrfs}"
slurm_tools=$(for tool in munged slurmctld slurmd slurmrestd scontrol runc; do command -v "$tool" >/dev/null || printf '%s ' "$tool"; done)
status slurm "${slurm_tools:+MISSING $slurm_tools(the slurm tests will skip)}${slurm_tools:-$(slurmctld -V 2>/dev/null), munged, slurmrestd, runc $(runc --version 2>/dev/null | sed -n '1s/^runc version //p')}"
