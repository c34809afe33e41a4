#!/usr/bin/env bash
# `make test`'s pytest. With PYTEST_ARGS, one pytest with those arguments. Without, the whole suite in two
# lanes at once, because most of the engine tests' time is spent waiting (on containers, clusters,
# browsers) while the portal's own tests want the CPU:
#   - engines: the folders that start real engines, clusters, browsers and the deploy kit (ENGINE_PATHS);
#     each starts its fleet or cluster once, in this lane only;
#   - portal: everything else, with a test database and an ops Redis db of its own, so the two lanes never
#     share a row, a queue's worker or a temporary folder.
# The engines lane prints as it runs; the portal lane's output follows it. The run fails when either lane
# fails or collects no tests.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}

nothing_collected() {
  echo "make test: pytest collected no tests in $1; failing" >&2
}

if [ -n "${PYTEST_ARGS:-}" ]; then
  # shellcheck disable=SC2086  # PYTEST_ARGS is a list of arguments
  "$PY" -m pytest $PYTEST_ARGS
  status=$?
  if [ $status -eq 5 ]; then nothing_collected "PYTEST_ARGS"; exit 1; fi
  exit $status
fi

ENGINE_PATHS=(tests/fleet tests/slurm tests/e2e tests/browser tests/deploy tests/test_readme_examples.py)
ignore=()
for path in "${ENGINE_PATHS[@]}"; do ignore+=("--ignore=$path"); done

lanes=/tmp/devcloud-test-lanes
rm -rf "$lanes"
mkdir -p "$lanes" var
portal_log=var/test-portal-lane.log
engines_log=var/test-engines-lane.log

# Each lane lists its slowest tests, so what eats the 25-minute budget shows in every CI log.
durations=(--durations=15 --durations-min=5)

TEST_DATABASE_NAME=test_devcloud_portal OPS_TEST_REDIS_DB=12 \
  "$PY" -m pytest --basetemp="$lanes/portal" "${durations[@]}" "${ignore[@]}" tests >"$portal_log" 2>&1 &
portal_pid=$!
# Ctrl-C or a CI cancel ends both lanes.
trap 'kill "$portal_pid" 2>/dev/null' EXIT

echo "make test: the portal lane runs beside this one; its output ($portal_log) follows at the end."
"$PY" -m pytest --basetemp="$lanes/engines" "${durations[@]}" "${ENGINE_PATHS[@]}" 2>&1 | tee "$engines_log"
engines=${PIPESTATUS[0]}
wait "$portal_pid"
portal=$?
trap - EXIT

echo
echo "================================ portal lane ($portal_log) ================================"
cat "$portal_log"
echo
# Both lanes' verdicts last, where a CI log's tail shows them: what failed, then each lane's count.
for log in "$engines_log" "$portal_log"; do
  grep -E '^(FAILED|ERROR) ' "$log"
done
for lane in engines portal; do
  log_var=${lane}_log
  echo "make test: $lane lane (exit ${!lane}): $(grep -E '^=+ .* in [0-9.]+s' "${!log_var}" | tail -n 1 | tr -d '=')"
done
status=0
for lane in engines portal; do
  code=${!lane}
  if [ "$code" -eq 5 ]; then nothing_collected "the $lane lane"; status=1; fi
  if [ "$code" -ne 0 ]; then status=1; fi
done
exit $status
