#!/usr/bin/env bash
# Install the Debian packages the project runs beside Python, when they are missing:
#   prometheus, promtool       -> prometheus               (rule checks, alerting tests, demo)
#   prometheus-alertmanager    -> prometheus-alertmanager  (alerting tests, demo)
#   chromium                   -> chromium                 (console tests, benchmarks/console.py)
#   node, npm                  -> nodejs, npm              (the console's front-end build)
# Idempotent: returns at once when every command is on PATH. Needs root (or sudo) to install;
# without it, it says what is missing and leaves the tiers that need them to skip themselves.
set -euo pipefail
declare -A PACKAGE=(
    [prometheus]=prometheus
    [promtool]=prometheus
    [prometheus-alertmanager]=prometheus-alertmanager
    [chromium]=chromium
    [node]=nodejs
    [npm]=npm
)
missing=()
for cmd in "${!PACKAGE[@]}"; do
    command -v "$cmd" >/dev/null 2>&1 || missing+=("${PACKAGE[$cmd]}")
done
[ ${#missing[@]} -eq 0 ] && exit 0
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO=(sudo -n); else
        echo "missing Debian packages (install them as root): ${missing[*]}" >&2
        exit 0
    fi
fi
echo "installing Debian packages: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -q >/dev/null
"${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
