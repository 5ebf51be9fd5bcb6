#!/usr/bin/env bash
# Start the services the test tiers talk to, when they are down. Idempotent.
set -euo pipefail
PGHOST=${GOODPUT_TEST_PGHOST:-127.0.0.1}
if command -v pg_isready >/dev/null 2>&1; then
    if ! pg_isready -q -h "$PGHOST" -p 5432; then
        echo "PostgreSQL is down on $PGHOST:5432; starting it" >&2
        pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start
        for _ in $(seq 30); do pg_isready -q -h "$PGHOST" -p 5432 && break; sleep 1; done
    fi
    pg_isready -h "$PGHOST" -p 5432
else
    echo "pg_isready not found: PostgreSQL integration tests need a server on $PGHOST:5432" >&2
fi
