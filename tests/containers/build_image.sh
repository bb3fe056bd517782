#!/usr/bin/env bash
# Build the probe image for the container tests OFFLINE (no registry): a root filesystem holding only a shell, the
# shared libraries the host's python and torch load, and a marker (/etc/os-release ID=multinode-probe,
# /multinode-probe), imported with `podman import`. Python itself and torch are NOT in the image: the test's
# profile bind-mounts the host's interpreter prefix read-only (`container.mounts`), as a site would mount a
# shared software tree. Cached by name: an existing image is kept unless --force.
#   tests/containers/build_image.sh [IMAGE] [PYTHON] [--force]
# Podman's own configuration comes from the environment (CONTAINERS_CONF, CONTAINERS_STORAGE_CONF).
set -euo pipefail
IMAGE=${1:-localhost/multinode-probe:1}
PY=${2:-python3}
FORCE=${3:-}
if [ "$FORCE" != --force ] && podman image exists "$IMAGE"; then
    echo "[build_image] $IMAGE exists (cached)"
    exit 0
fi
PREFIX=$("$PY" -c 'import sys; print(sys.base_prefix)')
PYBIN=$("$PY" -c 'import os, sys; print(os.path.realpath(sys.executable))')
TORCH=$("$PY" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
root=$(mktemp -d /var/tmp/multinode-probe-rootfs.XXXXXX)
trap 'rm -rf "$root"' EXIT

# ELF files whose libraries the image must hold: the interpreter, its extension modules, torch's libraries.
elves=("$PYBIN" /usr/bin/dash)
mapfile -t -O ${#elves[@]} elves < <(find "$PREFIX/lib" -maxdepth 3 -path '*lib-dynload*' -name '*.so' ;
                                     find "$TORCH" -maxdepth 2 -name '*.so*' -type f)
# Their library closure, minus what lives under the mounted prefix; plus what glibc loads by name (NSS).
mapfile -t libs < <(ldd "${elves[@]}" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\/lib/ {print $1}' |
                    grep -v "^$PREFIX" | sort -u)
libs+=(/lib/x86_64-linux-gnu/libnss_files.so.2 /lib/x86_64-linux-gnu/libnss_dns.so.2 /lib/x86_64-linux-gnu/libresolv.so.2)
# Debian's merged /usr: /lib, /lib64 and /bin are links into /usr; the image gets the same links.
mkdir -p "$root"/usr/{lib,lib64,bin} "$root"/{tmp,proc,sys,dev,etc,root} "$root$PREFIX"
ln -s usr/lib "$root/lib"
ln -s usr/lib64 "$root/lib64"
ln -s usr/bin "$root/bin"
chmod 1777 "$root/tmp"
for lib in "${libs[@]}" /lib64/ld-linux-x86-64.so.2 /usr/bin/dash; do
    [ -e "$lib" ] || continue
    dest=$(echo "$lib" | sed -E 's#^/(lib|lib64|bin)/#/usr/\1/#')
    mkdir -p "$root$(dirname "$dest")"
    cp -L "$lib" "$root$dest"
done
ln -s dash "$root/usr/bin/sh"
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$root/etc/passwd"
printf 'root:x:0:\n' >"$root/etc/group"
printf 'hosts: files dns\npasswd: files\ngroup: files\n' >"$root/etc/nsswitch.conf"
printf 'ID=multinode-probe\nNAME="multinode probe image"\nVERSION_ID=1\n' >"$root/etc/os-release"
echo "built $(date -Is) from the host's libraries; python comes from a read-only mount of $PREFIX" >"$root/multinode-probe"
start=$(date +%s.%N)
tar -C "$root" -c . | podman import --quiet --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' - "$IMAGE" >/dev/null
echo "[build_image] $IMAGE: $(du -sh "$root" | cut -f1) root filesystem, imported in $(echo "$(date +%s.%N) - $start" | bc 2>/dev/null || echo '?') s"
