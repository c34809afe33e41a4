# DevCloud. On a fresh Debian/Ubuntu machine, as root:
#   make run    start the portal (web, Celery worker and beat) on http://127.0.0.1:8000/
#   make test   install and start PostgreSQL, Redis and Docker if missing, then run the whole suite
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
# The stamp's name carries a hash of the dependency files, so editing either one reinstalls on the next make.
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | sha256sum | cut -c1-12)

# Playwright drives the system's /usr/bin/chromium; nothing may download a browser build.
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD := 1

.PHONY: run test bench venv services screenshots clean

$(STAMP): pyproject.toml constraints.txt
	bash scripts/venv.sh
	rm -f $(VENV)/.installed-*
	touch $@

venv: $(STAMP)

run: venv
	$(PY) scripts/run.py

services:
	bash scripts/test-services.sh

# var/test-env (written by test-services.sh) carries what pytest needs to reach the services it started,
# e.g. DATABASE_URL with a password on a machine where PostgreSQL does not trust local TCP connections.
test: venv services
	# Build the container images the tests launch (the CPU JupyterLab image; once per hash).
	if [ -f scripts/build-images.sh ]; then PYTHON=$(PY) bash scripts/build-images.sh; fi
	# The import contracts in pyproject.toml (docs/architecture.md, "Layers"): a second or two, and a broken
	# layer fails here before the suite starts.
	$(VENV)/bin/lint-imports --no-logo --cache-dir var/import-linter
	# The suite in two lanes at once (scripts/test-lanes.sh), or one pytest with PYTEST_ARGS.
	set -a; if [ -f var/test-env ]; then . var/test-env; fi; set +a; \
	  PYTHON=$(PY) PYTEST_ARGS="$(PYTEST_ARGS)" bash scripts/test-lanes.sh

bench: venv services
	if [ -f scripts/build-images.sh ]; then PYTHON=$(PY) bash scripts/build-images.sh; fi
	set -a; if [ -f var/test-env ]; then . var/test-env; fi; set +a; $(PY) -m benchmarks

# Needs a running portal (`make run` in another terminal); writes docs/screenshots/*.png.
screenshots: venv
	$(PY) scripts/screenshots.py

clean:
	rm -rf $(VENV) var
