#!/usr/bin/env bash
# Run by scripts/package.sh --check inside a fresh chroot of the Debian suite
# (no compiler, no PostgreSQL headers): installs the package with apt, as a
# user would ("apt install ./postgresql-<major>-eventgrid_...deb"), with
# python3 for the test receiver, then runs smoke.sh against it.
#   test/package/check.sh MAJOR DEB
set -euo pipefail
major=$1
deb=$2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
if ! apt-get install -y -qq --no-install-recommends "$deb" python3 >/tmp/apt.log 2>&1; then
    tail -n 30 /tmp/apt.log
    exit 1
fi
dpkg-query -W -f='# installed ${Package} ${Version}, depends: ${Depends}\n' "postgresql-$major-eventgrid"
# only what it needs: no JIT bitcode, so no postgresql-<major>-jit-llvm
depends=$(dpkg-query -W -f='${Depends}' "postgresql-$major-eventgrid")
if echo "$depends" | grep -q jit-llvm || dpkg -L "postgresql-$major-eventgrid" | grep -q /bitcode/; then
    echo "# the package ships JIT bitcode or depends on postgresql-$major-jit-llvm: $depends" >&2
    exit 1
fi
exec bash "$(dirname "$0")/smoke.sh" "$major"
