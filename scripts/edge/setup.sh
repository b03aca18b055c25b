#!/usr/bin/env bash
# Make sure the edge checks' tools exist: qemu-user-static, debootstrap, Node.js + npm,
# Debian's headless Chromium (apt, when run as root; otherwise print the command), then the
# npm packages of scripts/edge/package.json (onnxruntime-web, puppeteer-core) under the cache.
# puppeteer-core never downloads a browser: the checks use Debian's. With --npm only the npm
# packages (what tests/test_web_prefix.py needs to run onnxruntime-web in Node.js).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
NPM_DIR=${EDGESEQ_EDGE_CACHE:-$REPO/.edge-cache}/npm

need=()
if [[ ${1:-} == --npm ]]; then
  command -v npm >/dev/null || need+=(npm)
else
  command -v qemu-aarch64-static >/dev/null || need+=(qemu-user-static)
  command -v debootstrap >/dev/null || need+=(debootstrap)
  command -v node >/dev/null || need+=(nodejs)
  command -v npm >/dev/null || need+=(npm)
  [[ -x /usr/bin/chromium-headless-shell || -x /usr/bin/chromium || -n ${CHROMIUM:-} ]] ||
    need+=(chromium-headless-shell)
fi
if [[ ${#need[@]} -gt 0 ]]; then
  if [[ $(id -u) -ne 0 ]]; then
    echo "error: missing ${need[*]}; install them with: sudo apt-get install -y ${need[*]}" >&2
    exit 3
  fi
  echo "edge: apt-get install -y ${need[*]}" >&2
  apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null
fi

mkdir -p "$NPM_DIR"
if ! cmp -s "$REPO/scripts/edge/package.json" "$NPM_DIR/package.json" ||
  [[ ! -d $NPM_DIR/node_modules/onnxruntime-web ]]; then
  echo "edge: npm install onnxruntime-web puppeteer-core into $NPM_DIR" >&2
  cp "$REPO/scripts/edge/package.json" "$NPM_DIR/package.json"
  (cd "$NPM_DIR" && PUPPETEER_SKIP_DOWNLOAD=1 npm install --no-audit --no-fund --ignore-scripts >&2)
fi
