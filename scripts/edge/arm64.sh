#!/usr/bin/env bash
# Run `edgeseq generate` on an emulated ARM64 (aarch64) Debian with edgeseq's torch-free runtime.
#
#   scripts/edge/arm64.sh BUNDLE WORDS OUT_DIR [VARIANT ...]     # default variants: fp32 int8
#
# A VARIANT is a graph variant (fp32, int8: the two-graph loop, `--search loop`) or
# search-fp32 / search-int8 (the bundle's one-graph search variant of that precision,
# `--variant fp32 --search graph`).
#
# Builds once, and caches under $EDGESEQ_EDGE_CACHE (default .edge-cache/arm64):
#   rootfs/  Debian bookworm arm64 (debootstrap --foreign --arch=arm64, python3 included); the
#            downloaded packages are unpacked with dpkg-deb, so no binfmt_misc/chroot is needed
#            and the script works in containers; /proc/cpuinfo inside it is a fake ARM one.
#   wheels/  aarch64 wheels of numpy, onnxruntime, tokenizers, click (pip download --platform).
# The wheels are installed once (by the host's pip, for aarch64) into rootfs/opt/edgeseq-deps.
# Every run builds edgeseq's own wheel from this checkout and installs it (--no-deps) into a
# temporary directory of its own, then runs, per variant, under qemu-aarch64-static -L rootfs:
#   python3 -m edgeseq.cli.main generate BUNDLE --input WORDS --variant V --search loop|graph
#     > OUT_DIR/arm64-VARIANT.txt
# with $GENERATE_FLAGS (words, e.g. "--target-lang deu_Latn") after those flags when set,
# and writes the seconds it took to OUT_DIR/arm64-V.seconds.
#
# The emulated CPU is $QEMU_CPU (default neoverse-n1: ARMv8.2 with dot product, the core of
# AWS Graviton2; cortex-a76, the Raspberry Pi 5's, gives the same outputs). qemu's default
# "max" CPU made the int8 graphs' outputs wrong (0 of 20 words equal to x86 with qemu 7.2 and
# onnxruntime 1.31, while fp32 stayed identical), and cortex-a72 (ARMv8.0) stops with an illegal
# instruction: the aarch64 wheels need ARMv8.2.
#
# Why the fake /proc/cpuinfo: onnxruntime's CPU detection reads /proc/cpuinfo; under
# emulation it would read the host's x86 file and segfault. qemu's -L prefix redirects the read
# to rootfs/proc/cpuinfo.
set -euo pipefail

if [[ $# -lt 3 ]]; then
  echo "usage: $0 BUNDLE WORDS OUT_DIR [VARIANT ...]" >&2
  exit 2
fi
BUNDLE=$(realpath "$1")
WORDS=$(realpath "$2")
OUT=$(realpath -m "$3")
shift 3
VARIANTS=(fp32 int8)
[[ $# -gt 0 ]] && VARIANTS=("$@")

REPO=$(cd "$(dirname "$0")/../.." && pwd)
CACHE=$(realpath -m "${EDGESEQ_EDGE_CACHE:-$REPO/.edge-cache}/arm64")
ROOTFS=$CACHE/rootfs
WHEELS=$CACHE/wheels
PY=${PYTHON:-$REPO/.venv/bin/python}
SUITE=bookworm           # python3.11 on arm64
PYVER=3.11
QEMU_CPU=${QEMU_CPU:-neoverse-n1}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# tokenizers and protobuf publish manylinux_2_17 (manylinux2014) wheels, onnxruntime 2_28.
PLATFORMS=(--platform manylinux_2_28_aarch64 --platform manylinux_2_17_aarch64
  --platform manylinux2014_aarch64)

missing=()
for tool in debootstrap qemu-aarch64-static dpkg-deb; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "error: missing ${missing[*]}; install them with: apt-get install -y qemu-user-static debootstrap" >&2
  exit 3
fi

build_rootfs() {
  local tmp=$ROOTFS.partial
  rm -rf "$tmp"
  echo "arm64: debootstrap $SUITE into $ROOTFS (downloads ~40 MB of packages, once)" >&2
  debootstrap --foreign --arch=arm64 --variant=minbase --include=python3 \
    "$SUITE" "$tmp" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 || {
    echo "error: debootstrap failed; see $CACHE/debootstrap.log" >&2
    exit 4
  }
  for deb in "$tmp"/var/cache/apt/archives/*.deb; do
    dpkg-deb -x "$deb" "$tmp"
  done
  rm -f "$tmp"/var/cache/apt/archives/*.deb
  mkdir -p "$tmp/proc"
  cat >"$tmp/proc/cpuinfo" <<'CPUINFO'
processor	: 0
BogoMIPS	: 50.00
Features	: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs
CPU implementer	: 0x41
CPU architecture: 8
CPU variant	: 0x3
CPU part	: 0xd0c
CPU revision	: 1

CPUINFO
  mv "$tmp" "$ROOTFS"
}

download_wheels() {
  echo "arm64: downloading aarch64 wheels of ${RUNTIME_DEPS[*]} (once)" >&2
  rm -rf "$WHEELS.partial"
  mkdir -p "$WHEELS.partial"
  "$PY" -m pip download -q --dest "$WHEELS.partial" "${PLATFORMS[@]}" \
    --python-version "$PYVER" --implementation cp --only-binary=:all: "${RUNTIME_DEPS[@]}"
  mv "$WHEELS.partial" "$WHEELS"
}

install_deps() {
  # Host pip installs the aarch64 wheels as files: no pip needs to run under emulation.
  rm -rf "$DEPS.partial"
  "$PY" -m pip install -q --no-index --find-links "$WHEELS" --target "$DEPS.partial" \
    "${PLATFORMS[@]}" --python-version "$PYVER" --implementation cp --only-binary=:all: \
    "${RUNTIME_DEPS[@]}"
  mv "$DEPS.partial" "$DEPS"
}

install_edgeseq() {
  # This checkout's wheel, into a directory of this run's own (runs may overlap).
  "$PY" -m pip wheel -q --no-deps --no-build-isolation --wheel-dir "$SITE/wheel" "$REPO" >&2
  "$PY" -m pip install -q --no-deps --target "$SITE/edgeseq" "$SITE"/wheel/edgeseq-*.whl
}

# The same versions as the x86 runtime it is compared with (onnxruntime-gpu there).
mapfile -t RUNTIME_DEPS < <("$PY" - <<'PYCODE'
from importlib.metadata import PackageNotFoundError, version
for name, dist in [("numpy",) * 2, ("tokenizers",) * 2, ("click",) * 2,
                   ("onnxruntime", "onnxruntime"), ("onnxruntime", "onnxruntime-gpu")]:
    try:
        print(f"{name}=={version(dist)}")
    except PackageNotFoundError:
        pass
PYCODE
)
RUNTIME_DEPS=($(printf '%s\n' "${RUNTIME_DEPS[@]}" | sort -u -t= -k1,1))
WHEELS=$WHEELS/$(printf '%s_' "${RUNTIME_DEPS[@]}" | tr -c 'A-Za-z0-9._\n' '_')

DEPS=$ROOTFS/opt/edgeseq-deps/$(basename "$WHEELS")

mkdir -p "$CACHE" "$OUT"
[[ -x $ROOTFS/usr/bin/python$PYVER ]] || build_rootfs
[[ -d $WHEELS ]] || download_wheels
[[ -d $DEPS ]] || install_deps
SITE=$(mktemp -d "$CACHE/run.XXXXXX")
trap 'rm -rf "$SITE"' EXIT
install_edgeseq

for variant in "${VARIANTS[@]}"; do
  graph=${variant#search-}
  search=loop
  [[ $graph != "$variant" ]] && search=graph
  start=$(date +%s.%N)
  PYTHONPATH=$SITE/edgeseq:$DEPS PYTHONDONTWRITEBYTECODE=1 \
    qemu-aarch64-static -cpu "$QEMU_CPU" -L "$ROOTFS" "$ROOTFS/usr/bin/python$PYVER" -m edgeseq.cli.main \
    generate "$BUNDLE" --input "$WORDS" --variant "$graph" --search "$search" --provider cpu \
    ${GENERATE_FLAGS:-} >"$OUT/arm64-$variant.txt"
  end=$(date +%s.%N)
  awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f\n", b - a }' >"$OUT/arm64-$variant.seconds"
done
