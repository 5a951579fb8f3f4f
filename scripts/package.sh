#!/usr/bin/env bash
# Builds the Debian packages of eventgrid with Debian's pg_buildext, one
# binary package per PostgreSQL major: dist/postgresql-<major>-eventgrid_
# <version>-1_<arch>.deb, depending on postgresql-<major> and the shared
# libraries the module links (libcurl, libssl, libmicrohttpd, libhiredis, librabbitmq, libpq), not on
# a compiler or headers.  Installs what building needs itself
# (build-essential, debhelper, dpkg-dev, postgresql-server-dev-all and
# -<major>, libcurl4-openssl-dev, libmicrohttpd-dev, libhiredis-dev, librabbitmq-dev, libpq-dev, libssl-dev).
#
#   ./scripts/package.sh                every major whose server headers are
#                                       installed (or this system's major), or
#                                       those in PG_MAJORS ("15 17")
#   ./scripts/package.sh --pg 17        built inside the chroot of the Debian
#                                       suite that ships 17 (scripts/chroot.sh)
#   ./scripts/package.sh --check --pg 17
#                                       built there, then installed with apt
#                                       into a fresh chroot of that suite that
#                                       has no compiler or headers, where
#                                       test/package/smoke.sh delivers with it
set -euo pipefail
. "$(dirname "$0")/common.sh"
args=("$@")
usage() { echo "usage: $0 [--check] [--pg 15|17|18]" >&2; exit 2; }
check=0
pg=""
while [ $# -gt 0 ]; do
    case "$1" in
        --check) check=1; shift ;;
        --pg) [ $# -ge 2 ] || usage; pg=$2; shift 2 ;;
        *) usage ;;
    esac
done
[ $check -eq 1 ] && [ -z "$pg" ] && usage
eg_need_root "${args[@]}"

if [ -n "$pg" ]; then
    eg_suite_of_major "$pg" >/dev/null || exit 2
    rm -f "$EG_SRC"/dist/postgresql-"$pg"-eventgrid_*.deb
    PG_MAJORS=$pg eg_in_chroot "$pg" scripts/package.sh
    [ $check -eq 1 ] || exit 0
    deb=$(ls "$EG_SRC"/dist/postgresql-"$pg"-eventgrid_*.deb)
    suite=$(eg_suite_of_major "$pg")
    server="$EG_CHROOT_DIR/$suite-$(dpkg --print-architecture)-server"
    echo "== PostgreSQL $pg: installing $(basename "$deb") with apt on a fresh $suite server without build tools"
    eg_chroot_fresh "$suite" "$server"
    eg_chroot_copy_tree "$server"
    cp "$deb" "$server/root/"
    set +e
    eg_chroot_run "$server" "$pg" test/package/check.sh "$pg" "/root/$(basename "$deb")"
    status=$?
    set -e
    rm -rf "$server"
    exit $status
fi

if [ -z "${PG_MAJORS:-}" ]; then
    PG_MAJORS=$(ls -d /usr/include/postgresql/*/server 2>/dev/null | cut -d/ -f5 | sort -n | tr '\n' ' ')
    PG_MAJORS=${PG_MAJORS:-$PG_MAJOR}
fi
EG_PACKAGES="build-essential debhelper dpkg-dev postgresql-server-dev-all libcurl4-openssl-dev libmicrohttpd-dev libhiredis-dev librabbitmq-dev libpq-dev libssl-dev python3"
for m in $PG_MAJORS; do EG_PACKAGES="$EG_PACKAGES postgresql-server-dev-$m"; done
EG_EXTRA_PACKAGES=""
eg_install_packages

version=$(dpkg-parsechangelog -l "$EG_SRC/debian/changelog" -S Version)
upstream=${version%-*}
control=$(sed -n "s/^default_version = '\(.*\)'/\1/p" "$EG_SRC/eventgrid.control")
if [ "$upstream" != "$control" ]; then
    echo "debian/changelog is at $version but eventgrid.control at $control: add a changelog entry" >&2
    exit 1
fi
meta=$(python3 -c 'import json, sys; m = json.load(open(sys.argv[1])); print(m["version"], m["provides"]["eventgrid"]["version"])' "$EG_SRC/META.json")
if [ "$meta" != "$control $control" ]; then
    echo "META.json names version(s) $meta but eventgrid.control $control" >&2
    exit 1
fi
build=$(mktemp -d /tmp/eventgrid-package-XXXXXX)
trap 'rm -rf "$build"' EXIT
src="$build/eventgrid-$upstream"
mkdir -p "$src"
eg_copy_source_to "$src"
echo "== building postgresql-{$(echo $PG_MAJORS | tr ' ' ',')}-eventgrid $version with pg_buildext"
export PG_SUPPORTED_VERSIONS=$(printf '%s\n' $PG_MAJORS)
log="$build/build.log"
if ! (cd "$src" && pg_buildext updatecontrol && dpkg-buildpackage -b -us -uc) >"$log" 2>&1; then
    tail -n 60 "$log" >&2
    echo "== the package build failed" >&2
    exit 1
fi
mkdir -p "$EG_SRC/dist"
for deb in "$build"/postgresql-*-eventgrid_*.deb; do
    cp "$deb" "$EG_SRC/dist/"
    echo "== dist/$(basename "$deb")"
    dpkg-deb -f "$deb" Package Version Depends | sed 's/^/   /'
done
