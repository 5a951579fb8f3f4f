# Runs an eventgrid script inside a chroot of the Debian suite that ships a
# given PostgreSQL major (15 bookworm, 17 trixie, 18 sid), for the test
# matrix (scripts/test.sh --pg N) and packages (scripts/package.sh --pg N).
# The chroot is made once with debootstrap from the Debian mirror named in
# this machine's own apt sources, with the suite's updates and security
# sources where it has them, and kept in EG_CHROOT_DIR
# (/var/cache/eventgrid-chroots) between runs, twice: as a tarball of the
# fresh system (a server without build tools, for scripts/package.sh
# --check) and as the build-and-test chroot, where later runs only refresh
# the copy of the source tree and the packages apt-get installs.  Each run
# mounts /proc, /dev/pts and a /dev/shm of its own in a private mount
# namespace, so nothing stays mounted when it ends.  Sourced, not run.

EG_CHROOT_DIR=${EG_CHROOT_DIR:-/var/cache/eventgrid-chroots}

# The Debian suite that ships PostgreSQL major $1, or an error for a major no
# reachable suite ships (14 and 16: see README, Supported PostgreSQL versions).
eg_suite_of_major() {
    case "$1" in
        15) echo bookworm ;;
        17) echo trixie ;;
        18) echo sid ;;
        *)
            echo "no Debian suite ships PostgreSQL $1: choose 15 (bookworm), 17 (trixie) or 18 (sid)" >&2
            return 1 ;;
    esac
}

# The PostgreSQL major the running system's Debian suite ships (what
# postgresql-common installs as "postgresql"), from /etc/os-release.
eg_major_of_system() {
    local codename
    codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
    case "$codename" in
        bookworm) echo 15 ;;
        trixie) echo 17 ;;
        forky|sid|"") echo 18 ;;
        *) echo 15 ;;
    esac
}

# The first URI of this machine's apt sources whose path ends in /$1
# ("debian" or "debian-security"), in one-line or deb822 form.
eg_apt_mirror() {
    local want=$1 f
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        sed -n -e 's/^[[:space:]]*URIs:[[:space:]]*//p' \
               -e 's/^[[:space:]]*deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]*\).*/\2/p' "$f"
    done | tr ' ' '\n' | grep -E "/$want/?\$" | head -n 1 | sed 's|/$||'
}

# Makes the base of suite $1 unless it is there (debootstrap, the suite's
# apt sources, no services started by apt) and prints the path of its
# tarball, from which eg_chroot_ensure and eg_chroot_fresh unpack chroots.
eg_chroot_base() {
    local suite=$1 arch base tmp mirror security log
    arch=$(dpkg --print-architecture)
    base="$EG_CHROOT_DIR/$suite-$arch.base.tar"
    if [ -f "$base" ]; then
        echo "$base"
        return 0
    fi
    mirror=$(eg_apt_mirror debian)
    security=$(eg_apt_mirror debian-security)
    if [ -z "$mirror" ]; then
        echo "no Debian mirror in /etc/apt/sources.list*: cannot make the $suite chroot" >&2
        return 1
    fi
    if ! command -v debootstrap >/dev/null 2>&1; then
        EG_PACKAGES=debootstrap EG_EXTRA_PACKAGES="" eg_install_packages >&2
    fi
    echo "== making the $suite chroot (debootstrap from $mirror)" >&2
    mkdir -p "$EG_CHROOT_DIR"
    tmp="$EG_CHROOT_DIR/$suite-$arch.debootstrap"
    log="$tmp.log"
    rm -rf "$tmp"
    if ! debootstrap --variant=minbase "$suite" "$tmp" "$mirror" >"$log" 2>&1; then
        tail -n 30 "$log" >&2
        echo "== debootstrap of $suite failed (log: $log)" >&2
        return 1
    fi
    {
        echo "deb $mirror $suite main"
        if [ "$suite" != sid ]; then
            echo "deb $mirror $suite-updates main"
            [ -n "$security" ] && echo "deb $security $suite-security main"
        fi
    } > "$tmp/etc/apt/sources.list"
    if [ "$suite" = sid ]; then
        # the mirror serves sid with a Release file past its Valid-Until date
        echo 'Acquire::Check-Valid-Until "false";' > "$tmp/etc/apt/apt.conf.d/99eventgrid"
    fi
    # no services start inside the chroot when apt installs them
    printf '#!/bin/sh\nexit 101\n' > "$tmp/usr/sbin/policy-rc.d"
    chmod 755 "$tmp/usr/sbin/policy-rc.d"
    tar -C "$tmp" -cf "$base.tmp" . && mv "$base.tmp" "$base"
    rm -rf "$tmp"
    echo "$base"
}

# Unpacks a new chroot of suite $1 into directory $2 (emptied first).
eg_chroot_fresh() {
    local base
    base=$(eg_chroot_base "$1") || return 1
    rm -rf "$2"
    mkdir -p "$2"
    tar -C "$2" -xf "$base"
}

# The build-and-test chroot of suite $1, kept between runs (what apt
# installs there stays): made from the base unless it is there; prints its
# path.
eg_chroot_ensure() {
    local suite=$1 root
    root="$EG_CHROOT_DIR/$suite-$(dpkg --print-architecture)"
    if [ ! -f "$root/.eventgrid-chroot" ]; then
        eg_chroot_fresh "$suite" "$root.tmp" || return 1
        rm -rf "$root"
        mv "$root.tmp" "$root"
        touch "$root/.eventgrid-chroot"
    fi
    echo "$root"
}

# Runs "$@" (a path relative to the source tree, then its arguments) in the
# chroot $1 with PG_MAJOR=$2, with /proc, /dev/pts and a /dev/shm of its own
# mounted in a private mount namespace; returns its exit status.
eg_chroot_run() {
    local root=$1 major=$2
    shift 2
    cp -L /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
    PG_MAJOR=$major unshare --mount --propagation private -- bash -c '
        root=$1; shift
        mount -t proc proc "$root/proc" &&
        mount -t devpts -o newinstance,ptmxmode=0666 devpts "$root/dev/pts" &&
        mount -t tmpfs -o mode=1777 shm "$root/dev/shm" &&
        exec chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
            LANG=C.UTF-8 TERM="${TERM:-dumb}" CI="${CI:-}" PG_MAJOR="$PG_MAJOR" \
            EG_TEST_TIME_FACTOR="${EG_TEST_TIME_FACTOR:-}" \
            PG_MAJORS="${PG_MAJORS:-}" EG_IN_CHROOT=1 bash "/root/eventgrid/$@"' \
        eg-chroot "$root" "$@"
}

# Installs the Debian packages $2... that chroot $1 lacks (quietly: apt's
# output is shown only if it fails), with /proc mounted in a private mount
# namespace as eg_chroot_run does.
eg_chroot_install() {
    local root=$1
    shift
    cp -L /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
    unshare --mount --propagation private -- bash -c '
        root=$1; shift
        mount -t proc proc "$root/proc" &&
        exec chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
            DEBIAN_FRONTEND=noninteractive bash -c '"'"'
            missing=""
            for p in "$@"; do
                dpkg-query -W -f="\${Status}" "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
            done
            [ -z "$missing" ] && exit 0
            { apt-get update -qq && apt-get install -y -qq --no-install-recommends $missing; } >/tmp/apt.log 2>&1 \
                || { tail -n 40 /tmp/apt.log >&2; exit 1; }'"'"' eg-install "$@"' \
        eg-chroot "$root" "$@"
}

# Copies the source tree (without .git and build output) to $1/root/eventgrid.
eg_chroot_copy_tree() {
    rm -rf "$1/root/eventgrid"
    mkdir -p "$1/root/eventgrid"
    eg_copy_source_to "$1/root/eventgrid"
}

# Runs "$@" (a path relative to the source tree, then its arguments) inside
# the build-and-test chroot of PostgreSQL major $1, on a fresh copy of the
# source tree in /root/eventgrid; copies back what it left in dist/.
eg_in_chroot() {
    local major=$1 suite root status
    shift
    suite=$(eg_suite_of_major "$major") || return 2
    root=$(eg_chroot_ensure "$suite") || return 1
    eg_chroot_copy_tree "$root"
    echo "== PostgreSQL $major: running $1 in the $suite chroot $root"
    set +e
    eg_chroot_run "$root" "$major" "$@"
    status=$?
    set -e
    if [ -d "$root/root/eventgrid/dist" ]; then
        mkdir -p "$EG_SRC/dist"
        cp -p "$root/root/eventgrid/dist/"* "$EG_SRC/dist/" 2>/dev/null || true
    fi
    return $status
}
