#!/usr/bin/env bash
# The README's first command as a new user meets it: a minimal Debian 12 (debootstrap's minbase,
# 88 packages, no Python) in a chroot, this repository cloned into it, then `bash
# scripts/train.sh` there, timed by phase: apt (scripts/setup.sh train), the build of vitrain,
# the training. Fails if training pulled in any Python package. Needs root and the Debian
# archive (apt installs debootstrap when it is missing).
#   bash scripts/fresh_machine.sh [DIR] [train flags...]   default DIR: a new folder under /tmp
#   e.g. bash scripts/fresh_machine.sh /tmp/fresh --epochs 1
# The chroot stays behind in DIR (about 1 GB); remove it with: umount -R DIR/{proc,sys,dev}; rm -rf DIR
# shellcheck disable=SC2016  # the single-quoted $ are for the chroot's bash and dpkg-query
set -euo pipefail
cd "$(dirname "$0")/.."
root="${1:-$(mktemp -d /tmp/vitrain_fresh.XXXXXX)}"
[ $# -gt 0 ] && shift
[ "$(id -u)" -eq 0 ] || { echo "error: fresh_machine.sh needs root (debootstrap, chroot)" >&2; exit 2; }
command -v debootstrap >/dev/null ||
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap; }

t0=$EPOCHSECONDS
[ -x "$root/bin/bash" ] || debootstrap --variant=minbase bookworm "$root" >"$root.debootstrap.log" 2>&1 ||
  { tail -n 20 "$root.debootstrap.log" >&2; exit 1; }
base_packages=$(chroot "$root" dpkg-query -W -f='.\n' | wc -l)
mountpoint -q "$root/proc" || mount -t proc proc "$root/proc"
mountpoint -q "$root/sys" || mount --rbind /sys "$root/sys"
mountpoint -q "$root/dev" || mount --rbind /dev "$root/dev"
cp /etc/resolv.conf "$root/etc/resolv.conf"
rm -rf "$root/root/vitrain"
git clone -q . "$root/root/vitrain"
echo "fresh_machine: Debian $(cat "$root/etc/debian_version") minbase in $root ($base_packages" \
  "packages, $((EPOCHSECONDS - t0)) s), commit $(git rev-parse --short HEAD)"

# train.sh's output with the seconds since its start, so the phases can be told apart.
log="$root/root/train.log"
chroot "$root" env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin TERM=dumb \
  bash -c 'cd /root/vitrain && s=$SECONDS && bash scripts/train.sh "$@" 2>&1 |
    while IFS= read -r l; do printf "%5d %s\n" $((SECONDS - s)) "$l"; done
    exit "${PIPESTATUS[0]}"' _ "$@" >"$log" || { tail -n 20 "$log" >&2; exit 1; }

# Phase boundaries: the first compile step starts the build, the first training line the run.
build_start=$(awk '$2 ~ /^\[[0-9]+\/[0-9]+\]$/ {print $1; exit}' "$log")
train_start=$(awk '$2 ~ /^(Train:|Epoch|Model)/ || /Run folder/ {print $1; exit}' "$log")
end=$(tail -n 1 "$log" | awk '{print $1}')
top1=$(grep -oE 'Final test top-1: [0-9.]+%' "$log" | tail -n 1)
added=$(($(chroot "$root" dpkg-query -W -f='.\n' | wc -l) - base_packages))
python=$(chroot "$root" dpkg-query -W -f='${Package}\n' | grep -cE '^(python|libpython)' || true)
echo "fresh_machine: train.sh ${end} s: apt ${build_start:-?} s ($added packages," \
  "$(du -sm "$root/var/cache/apt/archives" | cut -f1) MB), build" \
  "$((${train_start:-0} - ${build_start:-0})) s, training and evaluation" \
  "$((end - ${train_start:-0})) s; ${top1:-no final accuracy}; Python packages: $python"
echo "fresh_machine: log in $log"
[ "$python" -eq 0 ] || { echo "error: training installed Python packages" >&2; exit 1; }
