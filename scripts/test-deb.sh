#!/usr/bin/env bash
# make test-deb: the Debian package of `make dist-deb`, used as a user would.
#
#   scripts/test-deb.sh target/dist/redis-lock_<version>_<arch>.deb
#
# Always: docs/quickstart-cli.md run as written against that package unpacked into a
# scratch directory (dpkg-deb -x; no root needed), on Debian's redis-server 7.0.15; its
# man page checked against its CLI (scripts/check-man.sh: rendered by groff and man
# without a warning, every subcommand, option, variable and exit code of --help in it).
# As root, and only when no redis-lock is installed already: the same quickstart with
# the real `apt install ./redis-lock_*.deb` (and its `apt purge` at the end); then this
# script checks that the system is as before: the package unknown to dpkg, its files
# and the directories it created gone.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

deb=${1:?usage: test-deb.sh PATH/redis-lock_VERSION_ARCH.deb}
deb=$(cd "$(dirname "$deb")" && pwd)/$(basename "$deb")
[ -f "$deb" ] || { echo "test-deb.sh: no package at $deb" >&2; exit 1; }
server=${TEST_DEB_SERVER:-/usr/bin/redis-server}
quickstart() {
    QUICKSTART_DEB="$deb" LOCK_SERVER_BIN="$server" "${@}" \
        cargo test --release -q -p redis-lock-client --test dist -- \
        the_cli_quickstart_runs_as_written the_deb_installs
}

echo "== test-deb: $(basename "$deb") unpacked into a scratch directory"
quickstart env

echo "== test-deb: the man page against the CLI of the package, and the monitoring files"
scratch=$(mktemp -d)
dpkg-deb -x "$deb" "$scratch"
bash scripts/check-man.sh "$scratch/usr/bin/redis-lock" "$scratch/usr/share/man/man1/redis-lock.1.gz"
for f in usr/share/redis-lock/redis-exporter-lock.lua usr/share/redis-lock/grafana/redis-lock.json \
         usr/share/doc/redis-lock/MONITORING.md; do
    [ -s "$scratch/$f" ] || { echo "test-deb: the package has no /$f" >&2; exit 1; }
done
rm -rf "$scratch"

files=(/usr/bin/redis-lock /usr/lib/redis/modules/redis-lock.so /etc/redis/modules/redis-lock.conf
       /usr/share/doc/redis-lock /usr/share/redis-lock /usr/share/man/man1/redis-lock.1.gz)
if [ "$(id -u)" -ne 0 ]; then
    echo "== test-deb: not root: the real apt install is not tried (it is, as root, in CI)"
    exit 0
fi
if dpkg-query -W -f='${db:Status-Abbrev}' redis-lock 2>/dev/null | grep -q '^[ih]'; then
    echo "== test-deb: a redis-lock package is installed on this system: not touching it"
    exit 0
fi
for f in "${files[@]}"; do
    if [ -e "$f" ]; then
        echo "== test-deb: $f exists (not from a package): not installing over it"
        exit 0
    fi
done
dirs=(/usr/lib/redis/modules /usr/lib/redis /etc/redis/modules /etc/redis)
before=""
for d in "${dirs[@]}"; do [ -d "$d" ] && before="$before $d"; done
cleanup() {
    if dpkg-query -W redis-lock >/dev/null 2>&1; then
        DEBIAN_FRONTEND=noninteractive apt-get purge -y -q -o DPkg::Lock::Timeout=120 \
            redis-lock >/dev/null 2>&1 || dpkg --purge redis-lock >/dev/null 2>&1 || true
    fi
}
trap cleanup EXIT

echo "== test-deb: the quickstart with a real apt install (removed at its end)"
quickstart env QUICKSTART_INSTALLED=1

left=""
status=$(dpkg-query -W -f='${db:Status-Abbrev}' redis-lock 2>/dev/null || true)
case "$status" in
    "" | un* | pn*) ;;
    *) left="$left dpkg-status:'$status'" ;;
esac
for f in "${files[@]}"; do [ -e "$f" ] && left="$left $f"; done
for d in "${dirs[@]}"; do
    case " $before " in *" $d "*) ;; *) [ -d "$d" ] && left="$left $d" ;; esac
done
if [ -n "$left" ]; then
    echo "test-deb: left on the system after apt purge:$left" >&2
    exit 1
fi
echo "== test-deb: installed, used and removed; nothing left"
