#!/usr/bin/env bash
# `make docker-check`: build deploy/Dockerfile and run the image, not only lint it.
#
#   sudo bash deploy/docker_check.sh        # from any directory; needs root, podman, network
#
# Steps: build the image with podman (a stand-in python:3.11-slim is made with debootstrap
# when that base image is not in podman's store: no base-image registry may be reachable),
# export models/g2p-en to a bundle, start the image's ENTRYPOINT as the image's user with
# the bundle at /srv/bundle on 127.0.0.1, then check /health, one generation equal to
# offline `edgeseq generate` on the host, torch absent in the image, the server's uid
# (10001, read from /proc/PID/status) and exit status 0 after SIGTERM.
#
# `podman run` cannot start containers on every host (crun fails to set RLIMIT_NOFILE in
# some sandboxes), so the image is run without a container runtime: its filesystem
# (`podman image mount`) is copied, /proc, /dev and the bundle are mounted into the copy,
# and the entrypoint runs under `chroot --userspec` with the image's environment and
# working directory. The network is the host's, hence 127.0.0.1.
#
# Environment: EDGESEQ_DOCKER_BUNDLE=DIR serves DIR instead of a fresh export;
# DEBIAN_MIRROR (default http://deb.debian.org/debian) for the stand-in base;
# XDG_CACHE_HOME (the debootstrap tree is kept under edgeseq/docker-base there).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
BIN=$REPO/.venv/bin
BASE=docker.io/library/python:3.11-slim
IMAGE=localhost/edgeseq-serve:check
BASE_CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/edgeseq/docker-base
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
EXPECTED_UID=10001
INPUTS=(hello quokkaesque edgeseq)
START=$SECONDS

step() { echo "docker-check: $*" >&2; }
fail() {
  echo "docker-check: FAILED: $*" >&2
  exit 1
}

WORK='' SERVER_PID='' IMAGE_MOUNTED=''
MOUNTS=() # mount points inside the image copy, unmounted in reverse order
cleanup() {
  local rc=$? i
  trap - EXIT INT TERM
  if [[ -n $SERVER_PID ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -KILL "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do
    umount "${MOUNTS[i]}" 2>/dev/null || umount -l "${MOUNTS[i]}" ||
      echo "docker-check: could not unmount ${MOUNTS[i]}" >&2
  done
  [[ -z $IMAGE_MOUNTED ]] || podman image unmount "$IMAGE" >/dev/null || true
  if [[ -n $WORK && -d $WORK ]]; then
    # Never delete through a mount point (the copy's /dev is the host's /dev).
    if grep -qF " $WORK/" /proc/self/mountinfo; then
      echo "docker-check: left $WORK in place: something is still mounted under it" >&2
      rc=1
    else
      rm -rf --one-file-system "$WORK"
    fi
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'echo "docker-check: interrupted" >&2; exit 130' INT
trap 'echo "docker-check: terminated" >&2; exit 143' TERM

# --- tools -----------------------------------------------------------------------------
[[ $(id -u) -eq 0 ]] ||
  fail "needs root (podman image mount, bind mounts, chroot); run it with sudo"
[[ -x $BIN/edgeseq ]] || fail "no $BIN/edgeseq; run make .venv/.installed first"
need=()
command -v podman >/dev/null || need+=(podman)
command -v debootstrap >/dev/null || need+=(debootstrap)
if [[ ${#need[@]} -gt 0 ]]; then
  step "apt-get install -y ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq "${need[@]}" >/dev/null ||
    { apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null; } ||
    fail "could not install ${need[*]} with apt-get"
fi

# --- the base image --------------------------------------------------------------------
if podman image exists "$BASE"; then
  step "base image $BASE: present"
else
  rootfs=$BASE_CACHE/bookworm
  if [[ ! -e $rootfs/.complete ]]; then
    step "no $BASE and no registry assumed: debootstrap bookworm into $rootfs (a few minutes)"
    rm -rf --one-file-system "$rootfs"
    mkdir -p "$BASE_CACHE"
    debootstrap --variant=minbase --include=python3,python3-pip,ca-certificates \
      bookworm "$rootfs" "$MIRROR" >"$BASE_CACHE/debootstrap.log" 2>&1 ||
      fail "debootstrap failed; see $BASE_CACHE/debootstrap.log"
    rm -f "$rootfs"/usr/lib/python3.*/EXTERNALLY-MANAGED
    ln -sf python3 "$rootfs/usr/bin/python"
    ln -sf pip3 "$rootfs/usr/bin/pip"
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    touch "$rootfs/.complete"
  fi
  step "import $rootfs as the stand-in $BASE"
  tar -C "$rootfs" --exclude=./.complete -c . |
    podman import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' -q - "$BASE" >/dev/null ||
    fail "podman import of the stand-in base failed"
fi

# --- the image -------------------------------------------------------------------------
# chroot isolation: crun's default isolation fails on hosts with hybrid cgroups. pip inside
# the build reads the host's pip.conf and CA bundle where they exist (proxies, mirrors).
# --no-cache: podman's layer cache does not look at what `RUN --mount=type=bind` mounts, so
# a cached image would hold an older checkout. --layers=false: no intermediate images kept.
build=(podman build --no-cache --layers=false --isolation=chroot --network host
  -f "$REPO/deploy/Dockerfile" -t "$IMAGE")
[[ ! -f /etc/pip.conf ]] || build+=(-v /etc/pip.conf:/etc/pip.conf:ro)
ca=/etc/ssl/certs/ca-certificates.crt
[[ ! -f $ca ]] || build+=(-v "$ca:$ca:ro")
# The context is a copy of what docker would send (the checkout's files less those named in
# deploy/Dockerfile.dockerignore): podman bind-mounts the context itself for
# `RUN --mount=type=bind,rw`, ignoring that file, and pip's in-tree build writes there.
WORK=$(mktemp -d /tmp/edgeseq-docker-check.XXXXXX)
step "copy the build context to $WORK/context"
mkdir "$WORK/context"
# Plain names in it (no wildcards) become a regex: .git|.venv|build|...
ignored=$(sed -e '/^#/d' -e '/[*?[]/d' -e '/^$/d' -e 's/[.]/[.]/g' \
  deploy/Dockerfile.dockerignore | paste -sd'|')
git ls-files -z --cached --others --exclude-standard | grep -zEv "^(${ignored})(/|\$)" |
  tar --null --ignore-failed-read -T - -cf - 2>/dev/null | tar -xf - -C "$WORK/context" ||
  fail "could not copy the build context"
step "build $IMAGE from deploy/Dockerfile"
previous=$(podman image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)
"${build[@]}" "$WORK/context" >"$WORK/build.log" 2>&1 || {
  tail -n 30 "$WORK/build.log" >&2
  fail "podman build failed (log above)"
}
# The previous build, now untagged, goes (it fails harmlessly if something else uses it).
[[ -z $previous ]] || [[ $(podman image inspect --format '{{.Id}}' "$IMAGE") == "$previous" ]] ||
  podman rmi "$previous" >/dev/null 2>&1 || true

# --- the bundle ------------------------------------------------------------------------
if [[ -n ${EDGESEQ_DOCKER_BUNDLE:-} ]]; then
  BUNDLE=$(cd "$EDGESEQ_DOCKER_BUNDLE" && pwd)
  step "bundle: $BUNDLE"
else
  BUNDLE=$WORK/bundle
  step "export models/g2p-en to a bundle (no parity run)"
  "$BIN/edgeseq" export models/g2p-en --out "$BUNDLE" --no-verify >"$WORK/export.log" 2>&1 || {
    tail -n 20 "$WORK/export.log" >&2
    fail "edgeseq export failed (log above)"
  }
fi

# --- the image's filesystem, user and command -----------------------------------------
step "copy the image's filesystem"
mnt=$(podman image mount "$IMAGE") || fail "podman image mount $IMAGE failed"
IMAGE_MOUNTED=1
TREE=$WORK/tree
mkdir "$TREE"
cp -a "$mnt/." "$TREE/"
podman image unmount "$IMAGE" >/dev/null
IMAGE_MOUNTED=''

inspect() { podman image inspect --format "$1" "$IMAGE"; }
user=$(inspect '{{.Config.User}}')
workdir=$(inspect '{{.Config.WorkingDir}}')
mapfile -t image_env < <(inspect '{{range .Config.Env}}{{println .}}{{end}}' | sed '/^$/d')
mapfile -t entrypoint < <(inspect '{{range .Config.Entrypoint}}{{println .}}{{end}}' | sed '/^$/d')
[[ -n $user && $user != root && $user != 0 ]] || fail "the image runs as root (USER '$user')"
[[ ${entrypoint[*]} == "edgeseq serve /srv/bundle"* ]] ||
  fail "unexpected ENTRYPOINT: ${entrypoint[*]}"
# The user's uid and gid as the image's /etc/passwd says (the server's uid is checked below).
IFS=: read -r _ _ user_uid user_gid _ < <(grep "^${user%%:*}:" "$TREE/etc/passwd") ||
  fail "user $user is not in the image's /etc/passwd"
home=$(awk -F: -v u="${user%%:*}" '$1 == u { print $6 }' "$TREE/etc/passwd")

mkdir -p "$TREE/srv/bundle"
mount -t proc proc "$TREE/proc" || fail "could not mount /proc in the image copy"
MOUNTS+=("$TREE/proc")
mount --bind /dev "$TREE/dev" || fail "could not bind-mount /dev in the image copy"
MOUNTS+=("$TREE/dev")
mount --bind "$BUNDLE" "$TREE/srv/bundle" || fail "could not bind-mount the bundle"
MOUNTS+=("$TREE/srv/bundle")
mount -o remount,bind,ro "$TREE/srv/bundle" || fail "could not make the bundle read-only"

# A command in the image as its user, with the image's environment and working directory.
# chroot and env exec, so the PID of `"${in_image[@]}" CMD &` is CMD's.
in_image=(chroot --userspec="$user_uid:$user_gid" "$TREE"
  /usr/bin/env -i -C "${workdir:-/}" HOME="$home" "${image_env[@]}")

# --- torch ------------------------------------------------------------------------------
step "check that torch is absent from the image"
"${in_image[@]}" python -c 'import edgeseq.runtime.serve' ||
  fail "edgeseq.runtime.serve does not import in the image"
out=$("${in_image[@]}" python -c 'import torch' 2>&1) && fail "torch imports in the image"
[[ $out == *"No module named 'torch'"* ]] || fail "python -c 'import torch' failed otherwise: $out"
packages=$("${in_image[@]}" pip list --format=freeze 2>/dev/null) ||
  fail "pip list failed in the image"
grep -qi '^torch==' <<<"$packages" && fail "pip lists torch in the image"
step "image: $(grep -iE '^(edgeseq|onnxruntime[a-z-]*)==' <<<"$packages" | paste -sd' '), no torch"

# --- serve ------------------------------------------------------------------------------
PORT=$("$BIN/python" -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')
step "start the ENTRYPOINT (${entrypoint[*]}) --host 127.0.0.1 --port $PORT" \
  "as $user in the image"
# Options after the ENTRYPOINT's win (as with `docker run IMAGE --host ... --port ...`).
"${in_image[@]}" "${entrypoint[@]}" --host 127.0.0.1 --port "$PORT" >"$WORK/serve.log" 2>&1 &
SERVER_PID=$!
URL=http://127.0.0.1:$PORT
for ((i = 0; i < 240; i++)); do
  curl -fs "$URL/health" >/dev/null 2>&1 && break
  kill -0 "$SERVER_PID" 2>/dev/null || {
    tail -n 20 "$WORK/serve.log" >&2
    fail "the server exited before /health answered (log above)"
  }
  sleep 0.5
done
curl -fs "$URL/health" >/dev/null || fail "/health did not answer 200 within 120 s"
step "/health: 200"

read -r _ ruid euid suid fsuid < <(grep '^Uid:' "/proc/$SERVER_PID/status")
[[ "$ruid $euid $suid $fsuid" == "$EXPECTED_UID $EXPECTED_UID $EXPECTED_UID $EXPECTED_UID" ]] ||
  fail "the server runs with uids $ruid $euid $suid $fsuid, not $EXPECTED_UID"
cmdline=$(tr '\0' ' ' <"/proc/$SERVER_PID/cmdline")
[[ $cmdline == *"edgeseq serve /srv/bundle"* ]] ||
  fail "process $SERVER_PID is not the server: $cmdline"
read -r _ rgid egid sgid fsgid < <(grep '^Gid:' "/proc/$SERVER_PID/status")
read -r _ groups < <(grep '^Groups:' "/proc/$SERVER_PID/status")
groups=${groups//[[:space:]]/ }
[[ "$rgid $egid $sgid $fsgid" == "$user_gid $user_gid $user_gid $user_gid" &&
  " $groups " != *" 0 "* ]] ||
  fail "the server runs with gids $rgid $egid $sgid $fsgid, groups $groups"
step "server process $SERVER_PID: uid $ruid, gid $user_gid, groups ${groups:-none}"

request=$("$BIN/python" -c 'import json, sys; print(json.dumps({"inputs": sys.argv[1:]}))' \
  "${INPUTS[@]}")
curl -fsS "$URL/v1/generate" -H 'Content-Type: application/json' -d "$request" \
  >"$WORK/served.json" || fail "POST /v1/generate failed"
"$BIN/edgeseq" generate "$BUNDLE" --json --provider cpu "${INPUTS[@]}" \
  >"$WORK/offline.jsonl" 2>"$WORK/generate.log" ||
  fail "offline edgeseq generate failed: $(tail -n 1 "$WORK/generate.log")"
# Everything but the float scores must be equal; the scores to 1e-4 (the image may hold
# another onnxruntime build than the host).
"$BIN/python" - "$WORK/served.json" "$WORK/offline.jsonl" <<'EOF' || fail "served != offline"
import json, sys

served = json.load(open(sys.argv[1]))["results"]
offline = [json.loads(line) for line in open(sys.argv[2])]
floats = ("score", "logprob")
strip = [[{k: v for k, v in r.items() if k not in floats} for r in rs] for rs in (served, offline)]
if strip[0] != strip[1]:
    sys.exit(f"served {strip[0]}\noffline {strip[1]}")
diff = max(abs(s[k] - o[k]) for s, o in zip(served, offline) for k in floats)
if diff > 1e-4:
    sys.exit(f"scores differ by {diff:.2e}")
print(
    "docker-check: served = offline for "
    + ", ".join(f"{r['input']} -> {r['output']}" for r in served)
    + f" (max score difference {diff:.1e})",
    file=sys.stderr,
)
EOF

# --- SIGTERM ----------------------------------------------------------------------------
step "SIGTERM the server"
kill -TERM "$SERVER_PID"
for ((i = 0; i < 300; i++)); do
  kill -0 "$SERVER_PID" 2>/dev/null || break
  sleep 0.1
done
kill -0 "$SERVER_PID" 2>/dev/null && fail "the server still runs 30 s after SIGTERM"
status=0
wait "$SERVER_PID" || status=$?
SERVER_PID=''
[[ $status -eq 0 ]] || {
  tail -n 10 "$WORK/serve.log" >&2
  fail "the server exited with status $status after SIGTERM (log above)"
}

echo "docker-check: OK: $IMAGE built from deploy/Dockerfile; served on 127.0.0.1 as uid" \
  "$EXPECTED_UID: /health 200, ${#INPUTS[@]} outputs equal to offline generate, no torch," \
  "exit 0 on SIGTERM ($((SECONDS - START)) s)"
