# Runs an eventgrid script inside a chroot of the Debian suite that ships a
# given PostgreSQL major (15 bookworm, 17 trixie, 18 sid), for the test
# matrix (scripts/test.sh --pg N) and packages (scripts/package.sh --pg N).
# The chroot is made once with debootstrap from the Debian mirror named in
# this machine's own apt sources, with the suite's updates and security
# sources where it has them, and kept in EG_CHROOT_DIR
# (/var/cache/eventgrid-chroots) between runs: later runs only refresh the
# copy of the source tree and the packages apt-get installs inside.  Each run
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

# Makes the chroot of suite $1 unless it is there, and prints its path.
eg_chroot_ensure() {
    local suite=$1 arch root mirror security
    arch=$(dpkg --print-architecture)
    root="$EG_CHROOT_DIR/$suite-$arch"
    if [ -f "$root/.eventgrid-chroot" ]; then
        echo "$root"
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
    echo "== making the $suite chroot in $root (debootstrap from $mirror)" >&2
    mkdir -p "$EG_CHROOT_DIR"
    rm -rf "$root.tmp"
    local log="$EG_CHROOT_DIR/$suite-$arch.debootstrap.log"
    if ! debootstrap --variant=minbase "$suite" "$root.tmp" "$mirror" >"$log" 2>&1; then
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
    } > "$root.tmp/etc/apt/sources.list"
    if [ "$suite" = sid ]; then
        # the mirror serves sid with a Release file past its Valid-Until date
        echo 'Acquire::Check-Valid-Until "false";' > "$root.tmp/etc/apt/apt.conf.d/99eventgrid"
    fi
    # no services start inside the chroot when apt installs them
    printf '#!/bin/sh\nexit 101\n' > "$root.tmp/usr/sbin/policy-rc.d"
    chmod 755 "$root.tmp/usr/sbin/policy-rc.d"
    mv "$root.tmp" "$root"
    touch "$root/.eventgrid-chroot"
    echo "$root"
}

# Runs "$@" (a path relative to the source tree, then its arguments) inside
# the chroot of PostgreSQL major $1, on a fresh copy of the source tree in
# /root/eventgrid, with PG_MAJOR set; copies back what it left in dist/.
eg_in_chroot() {
    local major=$1 suite root status
    shift
    suite=$(eg_suite_of_major "$major")
    root=$(eg_chroot_ensure "$suite")
    cp -L /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
    rm -rf "$root/root/eventgrid"
    mkdir -p "$root/root/eventgrid"
    (cd "$EG_SRC" && tar --exclude=.git --exclude=dist --exclude='*.o' --exclude='*.so' \
        --exclude=tmp_check --exclude=results --exclude=log -cf - .) | tar -C "$root/root/eventgrid" -xf -
    echo "== PostgreSQL $major: running $1 in the $suite chroot $root"
    set +e
    PG_MAJOR=$major unshare --mount --propagation private -- bash -c '
        root=$1; shift
        mount -t proc proc "$root/proc" &&
        mount -t devpts -o newinstance,ptmxmode=0666 devpts "$root/dev/pts" &&
        mount -t tmpfs -o mode=1777 shm "$root/dev/shm" &&
        exec chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
            LANG=C.UTF-8 TERM="${TERM:-dumb}" CI="${CI:-}" PG_MAJOR="$PG_MAJOR" \
            EG_IN_CHROOT=1 bash "/root/eventgrid/$@"' \
        eg-chroot "$root" "$@"
    status=$?
    set -e
    if [ -d "$root/root/eventgrid/dist" ]; then
        mkdir -p "$EG_SRC/dist"
        cp -p "$root/root/eventgrid/dist/"* "$EG_SRC/dist/" 2>/dev/null || true
    fi
    return $status
}
