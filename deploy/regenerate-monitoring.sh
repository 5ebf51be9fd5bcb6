#!/usr/bin/env bash
# Rewrite deploy/base/monitoring/generated/ from the generators (Kustomize reads files only
# below a kustomization, so they are copies; tests/unit/deploy checks they are current).
#   deploy/regenerate-monitoring.sh                  the demo SLO's rules (as committed)
#   deploy/regenerate-monitoring.sh --from-registry  the rules of every live SLO in the
#       registry at GOODPUT_DATABASE_URL (what a real deployment ships)
# PROMETHEUS_URL (default http://prometheus:9090) is the datasource Grafana is provisioned with;
# BASE_URL (default http://127.0.0.1:8000) the control plane URL in the alerts' runbook links.
set -euo pipefail
cd "$(dirname "$0")/.."
GOODPUT=${GOODPUT:-.venv/bin/goodput}
OUT=deploy/base/monitoring/generated
"$GOODPUT" dashboards export "$OUT" --prometheus-url "${PROMETHEUS_URL:-http://prometheus:9090}"
mkdir -p "$OUT/rules"
if [ "${1:-}" = "--from-registry" ]; then
    "$GOODPUT" rules export "$OUT/rules/goodput.rules.yaml" --base-url "${BASE_URL:-http://127.0.0.1:8000}"
else
    cp dashboards/generated/rules/goodput.rules.yaml "$OUT/rules/goodput.rules.yaml"
fi
