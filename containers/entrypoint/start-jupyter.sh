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
#   DEVCLOUD_SSH_PORT  when set (the docker driver sets 2222), sshd runs as this same user on that port
#                      next to JupyterLab; unset (the local driver), no sshd. See start_sshd below.
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

# sshd as the unprivileged user: it can only log in that user, and only with a key in
# /etc/devcloud/ssh/keys/authorized_keys, which the portal keeps equal to the owner's keys on their account
# (the driver writes it before the first start and again whenever the keys change). That file and
# sshd's configuration (/etc/devcloud/ssh/sshd_config, from the image) belong to root, so the user
# cannot add a key or loosen the configuration. No password or keyboard-interactive login, no PAM. The
# host key is made here, per container, so no two instances share one. Port forwarding stays on
# (`ssh -L` to a server inside). Its log (-e) goes to the container's log with JupyterLab's.
start_sshd() {
  local ssh_dir=$HOME/.ssh sshd=/usr/sbin/sshd config=/etc/devcloud/ssh/sshd_config
  if [ ! -x "$sshd" ]; then
    echo "start-jupyter: DEVCLOUD_SSH_PORT is set but this image has no $sshd; SSH is off" >&2
    return 0
  fi
  if [ ! -f "$config" ]; then
    echo "start-jupyter: DEVCLOUD_SSH_PORT is set but this image has no $config; SSH is off" >&2
    return 0
  fi
  mkdir -p "$ssh_dir/hostkeys"
  chmod 700 "$ssh_dir" "$ssh_dir/hostkeys"
  [ -s "$ssh_dir/hostkeys/ssh_host_ed25519_key" ] ||
    ssh-keygen -q -t ed25519 -N '' -C "devcloud-instance" -f "$ssh_dir/hostkeys/ssh_host_ed25519_key"
  # Sessions get the image's PATH (e.g. /opt/venv/bin, /opt/rocm/bin): sshd passes it to commands, and
  # login shells, whose /etc/profile resets PATH, read it back from ~/.profile.
  printf 'export PATH=%q\n' "$PATH" >"$HOME/.devcloud-path"
  grep -qs devcloud-path "$HOME/.profile" || echo '. "$HOME/.devcloud-path"' >>"$HOME/.profile"
  "$sshd" -D -e -f "$config" -p "${DEVCLOUD_SSH_PORT}" -h "$ssh_dir/hostkeys/ssh_host_ed25519_key" \
    -o "SetEnv=PATH=${PATH}" &
}

if [ -n "${DEVCLOUD_SSH_PORT:-}" ]; then
  start_sshd
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
