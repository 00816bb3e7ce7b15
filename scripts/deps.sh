#!/usr/bin/env bash
# Installs the Debian packages trex builds against (idempotent; skips apt when all are present).
set -euo pipefail
# scripts/deps.sh fuzz: also clang (libFuzzer) for make fuzz.
PKGS="build-essential cmake ninja-build libdnnl-dev nlohmann-json3-dev libcli11-dev libgtest-dev
      libopenmpi-dev openmpi-bin libtomlplusplus-dev
      coinor-libcbc-dev coinor-libclp-dev coinor-libcoinutils-dev libpcre2-dev zlib1g-dev pkg-config gnuplot-nox python3
      python3-venv coinor-cbc glpk-utils
      fortunes iproute2"
[ "${1:-}" = fuzz ] && PKGS="$PKGS clang"
missing=""
for p in $PKGS; do
  dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "[deps] installing:$missing"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
fi
