#!/bin/bash
# The README's first command on a fresh Debian 12, timed: set-up plus the quickstart.
#
#   bench/fresh_setup.sh [REPO]      (root; REPO defaults to this checkout)
#
# A fresh machine is a minbase Debian 12 made by mmdebstrap (with git and CA
# certificates) once, in /var/tmp/fresh-base, and copied anew for each timing. The
# chroot shares this machine's kernel (/proc, /sys, /dev bound in), so the quickstart's
# namespaces and programs are real. What a machine here trusts (a proxy's CA, pip's
# settings) is copied in, as any machine of this workplace has it. Prints the wall time
# of `./scripts/setup.sh && .venv/bin/tailcut run examples/quickstart.yaml` (as the
# README gives it) and the run's result. Packages come from the network: a mirror or
# proxy that cached them on an earlier run makes it faster.
set -euo pipefail
repo=${1:-$(cd "$(dirname "$0")/.." && pwd)}
base=/var/tmp/fresh-base R=/var/tmp/fresh-run
[ -d $base ] || mmdebstrap --variant=minbase --include=ca-certificates,git bookworm $base
# (/run/netns: the run makes it a shared mount of itself, as iproute2 does)
cleanup() { umount -R $R/sys $R/dev 2>/dev/null || umount -l $R/sys $R/dev 2>/dev/null; umount $R/proc $R/run/netns 2>/dev/null || true; }
trap cleanup EXIT
rm -rf $R; cp -a $base $R
cp /etc/resolv.conf $R/etc/resolv.conf
if [ -d /usr/local/share/ca-certificates ]; then
  mkdir -p $R/usr/local/share/ca-certificates
  cp -r /usr/local/share/ca-certificates/. $R/usr/local/share/ca-certificates/
fi
cp /etc/ssl/certs/ca-certificates.crt $R/etc/ssl/certs/ca-certificates.crt
[ -f /etc/pip.conf ] && cp /etc/pip.conf $R/etc/pip.conf
git clone -q "$repo" $R/root/tailcut
mount -t proc proc $R/proc; mount --rbind /sys $R/sys; mount --rbind /dev $R/dev
cmd=$(grep -m1 -o '\./scripts/setup\.sh && \.venv/bin/tailcut run examples/quickstart\.yaml' $R/root/tailcut/README.md)
echo "README's first command: $cmd (load $(cut -d' ' -f1-3 /proc/loadavg))"
start=$(date +%s.%N)
status=0
chroot $R bash -c "cd /root/tailcut && $cmd" > /tmp/fresh-setup.log 2>&1 || status=$?
end=$(date +%s.%N)
echo "wall $(python3 -c "print(round($end - $start, 1))") s, exit $status (load $(cut -d' ' -f1-3 /proc/loadavg)); log: /tmp/fresh-setup.log"
grep -E "JCT" /tmp/fresh-setup.log | tail -1
exit $status
