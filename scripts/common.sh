# Shared set-up for scripts/test.sh, scripts/demo.sh and bench/: installs the
# Debian packages eventgrid needs, builds and installs the extension, and
# prepares a copy of the tree that the unprivileged "postgres" user can use
# (PostgreSQL refuses to run as root).  Sourced, not run.

EG_SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$EG_SRC/scripts/chroot.sh"
# the major this system's Debian suite ships, unless PG_MAJOR names another
PG_MAJOR=${PG_MAJOR:-$(eg_major_of_system)}
PG_BINDIR=/usr/lib/postgresql/$PG_MAJOR/bin
PG_CONFIG=$PG_BINDIR/pg_config
# what building and running eventgrid needs; the tests add libipc-run-perl
# (EG_EXTRA_PACKAGES), the benchmark nginx and wrk
EG_PACKAGES="postgresql-$PG_MAJOR postgresql-server-dev-$PG_MAJOR libcurl4-openssl-dev libmicrohttpd-dev libhiredis-dev librabbitmq-dev libpq-dev libssl-dev python3 make gcc"

# Re-runs the calling script through sudo when not root.
eg_need_root() {
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null 2>&1; then
            exec sudo -E bash "$0" "$@"
        fi
        echo "$(basename "$0"): run as root or through sudo (installs packages, runs PostgreSQL as user postgres)" >&2
        exit 1
    fi
}

# Installs what is missing, from Debian's archive only.
eg_install_packages() {
    local missing="" p
    for p in $EG_PACKAGES ${EG_EXTRA_PACKAGES:-}; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
    done
    if [ -n "$missing" ]; then
        echo "== installing Debian packages:$missing"
        export DEBIAN_FRONTEND=noninteractive
        # apt's progress goes to a log, shown only if it fails
        local log
        log=$(mktemp /tmp/eventgrid-apt-XXXXXX.log)
        if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends $missing; } >"$log" 2>&1; then
            tail -n 40 "$log" >&2
            echo "== installing Debian packages failed (log: $log)" >&2
            return 1
        fi
        rm -f "$log"
    fi
}

# The digest of what a build is made of (C, SQL, the Makefile, the control
# file): the installed build is current when the stamp beside the installed
# library holds it (warnings as errors or not, the same library is built).
eg_source_digest() {
    (cd "$EG_SRC" && find src sql Makefile eventgrid.control -type f \( -name '*.c' -o -name '*.h' -o -name '*.sql' \
        -o -name Makefile -o -name '*.control' \) -print0 | LC_ALL=C sort -z | xargs -0 sha256sum) \
        | sha256sum | cut -d' ' -f1
}

# EG_MAKE_FLAGS: extra make variables (scripts/test.sh sets WERROR=1).
# EG_REUSE_BUILD=1 (the demo): nothing is built when the installed build
# was made from these very sources.
eg_build_and_install() {
    local stamp digest
    stamp="$("$PG_CONFIG" --pkglibdir)/eventgrid.build-digest"
    digest=$(eg_source_digest)
    if [ "${EG_REUSE_BUILD:-0}" = 1 ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$digest" ] \
        && [ -f "$("$PG_CONFIG" --pkglibdir)/eventgrid.so" ]; then
        echo "== eventgrid for PostgreSQL $PG_MAJOR is installed from these sources: not built again"
        return 0
    fi
    echo "== building and installing eventgrid for PostgreSQL $PG_MAJOR"
    make -s -C "$EG_SRC" PG_CONFIG="$PG_CONFIG" clean >/dev/null
    make -s -C "$EG_SRC" PG_CONFIG="$PG_CONFIG" ${EG_MAKE_FLAGS:-}
    make -s -C "$EG_SRC" PG_CONFIG="$PG_CONFIG" install >/dev/null
    echo "$digest" > "$stamp"
}

# Copies the source tree into directory $1, without .git, dist/ and what
# builds and test runs leave, JIT bitcode included (the tests, the chroots and the packages copy it).
eg_copy_source_to() {
    (cd "$EG_SRC" && tar --exclude=./.git --exclude=./dist --exclude='*.o' --exclude='*.so' --exclude='*.bc' \
        --exclude=tmp_check --exclude=results --exclude=log -cf - .) | tar -C "$1" -xf -
}

# Prints a fresh directory holding a copy of the source tree owned by postgres.
eg_copy_tree() {
    local dest
    dest=$(mktemp -d /tmp/eventgrid-XXXXXX)
    eg_copy_source_to "$dest"
    chown -R postgres:postgres "$dest"
    chmod 755 "$dest"
    echo "$dest"
}

# Runs a command as postgres with the PostgreSQL binaries first on PATH.
eg_as_postgres() {
    runuser -u postgres -- env PATH="$PG_BINDIR:/usr/bin:/bin" HOME=/tmp "$@"
}

# The preamble of every entry script: root, packages, build and install, and
# a postgres-owned copy of the tree in $EG_WORK.
eg_setup() {
    eg_need_root "$@"
    eg_install_packages
    eg_build_and_install
    EG_WORK=$(eg_copy_tree)
}

# Starts a throwaway cluster with eventgrid preloaded in $1/data, listening
# only on a Unix socket in $1 at port $2; extra postgresql.conf lines come on
# standard input.
eg_start_cluster() {
    local dir=$1 port=$2
    eg_as_postgres initdb -D "$dir/data" -A trust -U postgres >/dev/null
    {
        echo "shared_preload_libraries = 'eventgrid'"
        echo "port = $port"
        echo "listen_addresses = ''"
        echo "unix_socket_directories = '$dir'"
        cat
    } >> "$dir/data/postgresql.conf"
    eg_as_postgres pg_ctl -D "$dir/data" -l "$dir/server.log" -w start >/dev/null
}
