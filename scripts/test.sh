#!/usr/bin/env bash
# Runs every eventgrid test on a fresh Debian machine: installs the
# packages it needs, builds (warnings are errors here: WERROR=1) and installs
# the extension for the PostgreSQL major of the machine's Debian suite (or
# PG_MAJOR), then runs, as user postgres, the pg_regress suite (sql/, expected/) and the TAP integration
# tests (test/t/) against real throwaway PostgreSQL clusters with the library
# preloaded and a real HTTP receiver on 127.0.0.1.  Exits non-zero on any
# failure; pg_regress and prove report each suite, and a last line sums
# them up.  A WAL source test needs a server of another PostgreSQL major:
# it comes from a chroot of the Debian suite that ships it (below).
#
#   ./scripts/test.sh           on this machine's PostgreSQL
#   ./scripts/test.sh --pg 17   the same suite inside a chroot of the Debian
#                               suite that ships 17 (15 bookworm, 17 trixie,
#                               18 sid), made and cached by scripts/chroot.sh
set -euo pipefail
. "$(dirname "$0")/common.sh"
if [ "${1:-}" = "--pg" ]; then
    [ $# -eq 2 ] || { echo "usage: $0 [--pg 15|17|18]" >&2; exit 2; }
    eg_need_root "$@"
    eg_suite_of_major "$2" >/dev/null || exit 2
    PG_MAJOR=$2 eg_in_chroot "$2" scripts/test.sh
    exit $?
elif [ $# -gt 0 ]; then
    echo "usage: $0 [--pg 15|17|18]" >&2
    exit 2
fi
EG_MAKE_FLAGS="WERROR=1"
EG_EXTRA_PACKAGES="libipc-run-perl nginx-light openssl nodejs node-express node-cors node-basic-auth prometheus prometheus-postgres-exporter python3-azure gdb redis-server rabbitmq-server python3-pika"   # the TAP tests: IPC::Run, a TLS receiver, its certificates, the Standard Webhooks verifier, the OAuth 2.0 token server (express, cors, basic-auth: what test/oauth/node_modules does not hold), for monitoring Prometheus (with promtool), the exporter, the Azure SDK, gdb (test 057 holds a backend in its commit), a Redis server with its redis-cli (test 076, RedisStream destinations), and a RabbitMQ broker with pika, its Python client (test 078, RabbitMQ destinations)
eg_setup "$@"
work=$EG_WORK
# a WAL source's server of another PostgreSQL major (test/t/074): that
# major's server from the chroot of the Debian suite that ships it, made
# once and kept (scripts/chroot.sh), which the test runs as user postgres
# in a user namespace (unshare --root); not inside a chroot's own suite
if [ -z "${EG_IN_CHROOT:-}" ]; then
    other=17
    [ "$PG_MAJOR" = 17 ] && other=15
    echo "== a PostgreSQL $other server for the WAL source of another major (the $(eg_suite_of_major $other) chroot)"
    if root=$(eg_chroot_ensure "$(eg_suite_of_major $other)") && eg_chroot_install "$root" "postgresql-$other" \
        && runuser -u postgres -- unshare --map-current-user --root="$root" /bin/true; then
        export EG_OTHER_MAJOR=$other EG_OTHER_MAJOR_ROOT=$root
    else
        echo "== no PostgreSQL $other server from a chroot here: test/t/074 is skipped" >&2
    fi
fi
# a failed run's directory stays (its logs, the clusters' logs, the diffs)
trap '[ "${status:-1}" -eq 0 ] && rm -rf "$work"' EXIT
echo "== running tests in $work"
# make -s: each suite's own report (pg_regress, prove), not make's command lines
set +e
eg_as_postgres make -s --no-print-directory -C "$work" PG_CONFIG="$PG_CONFIG" installcheck 2>&1 \
    | tee "$work/test-output.log"
status=${PIPESTATUS[0]}
set -e
regress=$(grep -Eo '(All [0-9]+ tests passed|[0-9]+ of [0-9]+ tests failed)' "$work/test-output.log" | tail -n 1 || true)
tap=$(grep -E '^Files=[0-9]+, Tests=[0-9]+' "$work/test-output.log" | sed 's/,  *[0-9]* wallclock.*//' | tail -n 1 || true)
result=$(grep -E '^Result: ' "$work/test-output.log" | tail -n 1 || true)
echo "== summary: pg_regress: ${regress:-not run}; TAP: ${tap:-not run} ${result:-}; exit status $status"
if [ $status -ne 0 ]; then
    [ -f "$work/regression.diffs" ] && { echo "== $work/regression.diffs"; tail -n 80 "$work/regression.diffs"; }
    # the TAP files that failed: their logs and their clusters' own logs
    for t in $(grep -Eo '^test/t/[0-9]+_[a-z_]+\.pl +\(Wstat' "$work/test-output.log" | sed 's|test/t/||; s|\.pl.*||'); do
        f="$work/tmp_check/log/regress_log_$t"
        [ -f "$f" ] && { echo "== $f"; grep -v 'LOG:  statement: ' "$f" | tail -n 80 | cut -c1-400; }
        for f in "$work"/tmp_check/log/"$t"_*.log; do
            [ -f "$f" ] && { echo "== $f (server log, last lines)"; tail -n 150 "$f" | cut -c1-400; }
        done
    done
fi
if [ $status -ne 0 ]; then
    echo "== the run's directory is kept: $work${EG_IN_CHROOT:+ (inside the chroot)}; one file again: make -C $work installcheck PROVE_TESTS=test/t/NNN_name.pl, as postgres"
fi
exit $status
