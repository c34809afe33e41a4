#!/bin/sh
# Installs the GPU host firewall of containers/README.md: instance bridges (dc-*) open no new connection
# to the host itself (its Docker engine, anything listening on its addresses) nor to private networks.
# Replies on connections made to an instance (nginx to JupyterLab, the SSH gateway to sshd) still pass.
#
#   deploy/gpu-host-firewall.sh [CIDR ...]   # the private networks; default: the RFC 1918 ones
#
# Run it as root on each GPU host once dockerd runs (dockerd makes the DOCKER-USER chain), and again at
# every boot after docker.service (deploy/README.md, "Adding GPU hosts"). Running it again adds nothing.
set -eu

if [ "$#" -eq 0 ]; then
    set -- 10.0.0.0/8 172.16.0.0/12 192.168.0.0/16
fi

if ! iptables -n -L DOCKER-USER >/dev/null 2>&1; then
    echo "gpu-host-firewall: no DOCKER-USER chain: start Docker first (dockerd makes it), then run this again" >&2
    exit 1
fi

add() {
    chain=$1
    shift
    if iptables -C "$chain" "$@" 2>/dev/null; then
        echo "gpu-host-firewall: kept    $chain $*"
    else
        iptables -I "$chain" 1 "$@"
        echo "gpu-host-firewall: added   $chain $*"
    fi
}

# Nothing on the host itself.
add INPUT -i dc-+ -m conntrack --ctstate NEW -j DROP
# Nor the private networks (other hosts' engines, the portal's PostgreSQL and Redis).
for network in "$@"; do
    add DOCKER-USER -i dc-+ -d "$network" -m conntrack --ctstate NEW -j DROP
done
