#!/usr/bin/env bash
# Runs every eventgrid test on a fresh Debian 12 machine: installs the
# packages it needs, builds and installs the extension, then runs, as user
# postgres, the pg_regress suite (sql/, expected/) and the TAP integration
# tests (test/t/) against real throwaway PostgreSQL clusters with the library
# preloaded and a real HTTP receiver on 127.0.0.1.  Exits non-zero on any
# failure; prove prints the closing summary.
set -euo pipefail
. "$(dirname "$0")/common.sh"
eg_setup "$@"
work=$EG_WORK
trap 'rm -rf "$work"' EXIT
echo "== running tests in $work"
status=0
eg_as_postgres make -C "$work" PG_CONFIG="$PG_CONFIG" installcheck || status=$?
if [ $status -ne 0 ]; then
    for f in "$work"/regression.diffs "$work"/tmp_check/log/regress_log_*; do
        [ -f "$f" ] && { echo "== $f"; tail -n 80 "$f"; }
    done
fi
exit $status
