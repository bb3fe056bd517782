#!/bin/bash
# What benchmarks/gpu/slurm_on_device.sh needs on the lent GPU machine, gathered HERE (Debian 12, PyPI reachable) into
# one folder the device tool carries (about 30 MB):
#   DEST/repo/    this checkout's tracked files (the code, the script to run, the example training)
#   DEST/whl/     the plugin's own wheel, and Snakemake with every dependency the device's Python 3.12 lacks
#   DEST/slurm/   SLURM 22.05 and munge: this machine's Debian 12 package files (docs and man pages left out), and
#                 under libs/ the shared libraries their programs and plugins load that are not glibc's
# Usage, from the checkout's root: bash benchmarks/gpu/carry_first_job.sh DEST
# PART=repo|whl|slurm does one part: repo is the checkout and the plugin's wheel (tests/process/test_gpu_scripts.py
# runs it); whl the other wheels.
set -euo pipefail
DEST=${1:?usage: carry_first_job.sh DEST}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PART=${PART:-all}
mkdir -p "$DEST"
DEST=$(cd "$DEST" && pwd)

if [ "$PART" = all ] || [ "$PART" = repo ]; then
    rm -rf "$DEST/repo" && mkdir -p "$DEST/repo"
    (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard | xargs -0 tar -cf - --ignore-failed-read) |
        tar -xf - -C "$DEST/repo"
    mkdir -p "$DEST/whl" && rm -f "$DEST"/whl/snakemake_executor_plugin_multinode-*.whl
    (cd "$DEST/repo" && python3 -m pip wheel -q --no-deps --no-build-isolation -w "$DEST/whl" .)
fi

if [ "$PART" = all ] || [ "$PART" = whl ]; then
    find "$DEST/whl" -name '*.whl' ! -name 'snakemake_executor_plugin_multinode-*' -delete 2>/dev/null || true
    mkdir -p "$DEST/whl"
    # Snakemake's closure at the versions this project tests, those the device's image lacks (KINDS.md's list);
    # typing-extensions too, as pydantic needs a recent one. pulp without its bundled solvers (the ILP scheduler is
    # never used: --scheduler greedy): 36 MB less.
    PLAT="--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
          --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
    NAMES="annotated-types argparse-dataclass conda-inject configargparse connection-pool docutils dpath
           fastjsonschema gitdb gitpython greenlet humanfriendly immutables importlib-metadata jsonschema
           jsonschema-specifications jupyter-core lazy-importer nbformat platformdirs pydantic pydantic-core
           referencing rpds-py smart-open smmap snakemake snakemake-interface-common
           snakemake-interface-executor-plugins snakemake-interface-logger-plugins snakemake-interface-report-plugins
           snakemake-interface-scheduler-plugins snakemake-interface-storage-plugins sqlalchemy sqlmodel tenacity
           throttler traitlets typing-inspection yte typing-extensions"
    pins=$(python3 - $NAMES <<'EOF'
import sys
from importlib.metadata import version
print(" ".join(f"{n}=={version(n)}" for n in sys.argv[1:]))
EOF
)
    for pin in $pins; do  # a package published as an sdist only (connection-pool) is pure Python: built here
        # shellcheck disable=SC2086
        python3 -m pip download -q --no-deps $PLAT -d "$DEST/whl" "$pin" 2>/dev/null ||
            python3 -m pip wheel -q --no-deps -w "$DEST/whl" "$pin"
    done
    tmp=$(mktemp -d)
    python3 -m pip download -q --no-deps $PLAT -d "$tmp" "pulp==$(python3 -c 'from importlib.metadata import version; print(version("pulp"))')"
    python3 - "$tmp" "$DEST/whl" <<'EOF'
import sys, zipfile
from pathlib import Path
src = next(Path(sys.argv[1]).glob("pulp-*.whl"))
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(Path(sys.argv[2]) / src.name, "w", zipfile.ZIP_DEFLATED) as zout:
    drop = {i.filename for i in zin.infolist() if "/solverdir/" in i.filename}
    for info in zin.infolist():
        if info.filename in drop:
            continue
        data = zin.read(info.filename)
        if info.filename.endswith(".dist-info/RECORD"):
            data = "".join(l + "\n" for l in data.decode().splitlines() if l.split(",")[0] not in drop).encode()
        zout.writestr(info, data)
EOF
    rm -rf "$tmp"
fi

if [ "$PART" = all ] || [ "$PART" = slurm ]; then
    rm -rf "$DEST/slurm" && mkdir -p "$DEST/slurm/root" "$DEST/slurm/libs"
    for pkg in slurmd slurmctld slurm-client slurm-wlm-basic-plugins munge libmunge2; do
        # files and the packages' own symlinks (libmunge.so.2 -> ...), each under its path
        dpkg -L "$pkg" | grep -vE '^/usr/share/(doc|man|lintian)' | while read -r f; do
            if [ -f "$f" ] || { [ -L "$f" ] && [ ! -d "$f" ]; }; then  # not /lib, Debian's link to /usr/lib
                mkdir -p "$DEST/slurm/root$(dirname "$f")" && cp -a "$f" "$DEST/slurm/root$(dirname "$f")/"
            fi
        done
    done
    # Every shared library the programs and plugins load, but glibc's own and the packages' own
    find "$DEST/slurm/root" -type f \( -perm -u+x -o -name '*.so*' \) -exec ldd {} + 2>/dev/null |
        awk '/=> \// {print $3}' | sort -u |
        grep -vE '/(libc|libm|libdl|libpthread|librt|libresolv|libutil|ld-linux-x86-64)[.-]|/(libslurm|libmunge)' |
        while read -r lib; do cp -L "$lib" "$DEST/slurm/libs/"; done
fi
du -sh "$DEST"/* 2>/dev/null
