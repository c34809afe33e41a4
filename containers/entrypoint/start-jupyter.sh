#!/usr/bin/env bash
# The one JupyterLab entrypoint of every DevCloud image (and of the `local` driver, which runs it with the
# portal's own virtualenv). Everything an instance differs by comes from the environment:
#
#   JUPYTER_TOKEN      required; the only credential JupyterLab accepts. The portal's gateway sends it as
#                      `Authorization: token <JUPYTER_TOKEN>` on every request; it never appears in a URL.
#   JUPYTER_BASE_URL   the path prefix the gateway routes, e.g. /instances/<uuid>/lab/ (default /).
#   JUPYTER_IP         address to listen on (default 0.0.0.0: inside a container the published port is
#                      the only way in; the local driver passes 127.0.0.1).
#   JUPYTER_PORT       default 8888.
#   JUPYTER_ROOT_DIR   default /workspace (the user's persistent volume).
#   JUPYTER_BIN        the jupyter executable (default: `jupyter` from PATH, /opt/venv/bin in the images).
#   JUPYTER_ALLOW_ROOT default False; the images run as uid 1000, only the local driver under a root
#                      worker needs True.
#
# /api/status reports last_activity (kernel and API activity, which jupyter_server records by default);
# the portal's idle culling reads it.
#
# What the gateway must do (JupyterLab is configured to trust it for exactly this):
#   - send `Authorization: token <JUPYTER_TOKEN>` on every request, including the websocket upgrade.
#     A token-authenticated request skips JupyterLab's Origin/Host and XSRF checks (jupyter_server's
#     IdentityProvider.should_check_origin), so the gateway may rewrite Host and Origin freely; in turn
#     the gateway itself must check that the browser's Origin is the portal's (or the instance's own
#     subdomain) before forwarding, since it is the only cross-site defence left.
#   - keep the path unchanged (JupyterLab serves everything under JUPYTER_BASE_URL), and not forward the
#     browser's portal Cookie header, nor pass JupyterLab's own Set-Cookie back to the browser: the
#     container is tenant-controlled code and must never see a portal session.
set -euo pipefail

if [ -z "${JUPYTER_TOKEN:-}" ]; then
  # An empty token would make JupyterLab either generate one nobody knows or, worse, accept anyone.
  echo "start-jupyter: JUPYTER_TOKEN is not set; refusing to start JupyterLab without authentication" >&2
  exit 64
fi

base_url=${JUPYTER_BASE_URL:-/}
# jupyter_server wants the prefix with both slashes.
[[ $base_url == /* ]] || base_url=/$base_url
[[ $base_url == */ ]] || base_url=$base_url/
root_dir=${JUPYTER_ROOT_DIR:-/workspace}
mkdir -p "$root_dir"
cd "$root_dir"

# The token is read by jupyter_server from JUPYTER_TOKEN itself, so it is never on a command line that
# `ps` or `docker top` would show. exec: jupyter becomes the process tini (PID 1) signals on `docker stop`.
exec "${JUPYTER_BIN:-jupyter}" lab \
  --ServerApp.ip="${JUPYTER_IP:-0.0.0.0}" \
  --ServerApp.port="${JUPYTER_PORT:-8888}" \
  --ServerApp.port_retries=0 \
  --ServerApp.base_url="$base_url" \
  --ServerApp.root_dir="$root_dir" \
  --ServerApp.open_browser=False \
  --ServerApp.allow_remote_access=True \
  --ServerApp.trust_xheaders=True \
  --ServerApp.terminals_enabled=True \
  --ServerApp.quit_button=False \
  --ServerApp.allow_root="${JUPYTER_ALLOW_ROOT:-False}" \
  --PasswordIdentityProvider.hashed_password='' \
  --PasswordIdentityProvider.password_required=False \
  --PasswordIdentityProvider.allow_password_change=False
