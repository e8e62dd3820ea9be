#!/usr/bin/env bash
# Builds the local container images from files on this machine and imports
# them into our containerd's k8s.io namespace (no registry needed).
#
#   hack/images.sh [--tests] [--all] [--control-plane] [--out DIR]
#
# Always built (every pod and the examples need them):
#   registry.k8s.io/pause:3.10.2                      our pause binary
#   docker.io/library/busybox:1.36                    Debian busybox-static,
#   docker.io/library/busybox:latest                  every applet a symlink,
#                                                     /etc/passwd and /etc/group
#                                                     as in the upstream image
# With --tests (or --all), the images the tests use, their binaries built
# first when missing (hack/build-cluster.sh agnhost, busybox):
#   registry.k8s.io/e2e-test-images/busybox:1.37.0-2  busybox 1.37 as upstream
#   registry.k8s.io/e2e-test-images/busybox:1.36.1-1  configures it (see below)
#   registry.k8s.io/e2e-test-images/agnhost:2.66.1    agnhost + busybox applets
#   registry.k8s.io/e2e-test-images/agnhost:2.55      (the same agnhost) and, if
#                                                     their inputs are there,
#                                                     Debian curl, nc, bash,
#                                                     socat, ip and upstream's
#                                                     extra files (see below)
#   registry.k8s.io/e2e-test-images/nonroot:1.5       busybox, USER 1234
# The upstream e2e tests' other images (names from
# test/utils/image/manifest.go), from Debian binaries with the shared
# libraries ldd finds, and small programs of our own:
#   registry.k8s.io/e2e-test-images/nonewprivs:1.4    busybox + setuid-root
#                                                     /usr/local/bin/nnp
#   registry.k8s.io/e2e-test-images/nginx:1.27.0-2    Debian nginx (unpacked by
#   registry.k8s.io/e2e-test-images/nginx:1.28.0-2    hack/install-deps.sh) +
#                                                     busybox, on port 80
#   registry.k8s.io/e2e-test-images/perl:5.26         Debian perl with the
#                                                     perl-base modules + busybox
#   registry.k8s.io/e2e-test-images/glibc-dns-testing:2.1.1
#                                                     dash as /bin/sh, GNU
#                                                     hostname (glibc) + busybox
# With --control-plane, the images of the control plane's static pods
# (hack/local-up.sh --self-hosted), named as kubeadm names them, each the
# binary of _output/bin with the shared libraries ldd finds:
#   registry.k8s.io/kube-apiserver:<v>               <v>: k8s.io/kubernetes'
#   registry.k8s.io/kube-controller-manager:<v>      version in
#   registry.k8s.io/kube-scheduler:<v>               tests/cluster/go.mod
#   registry.k8s.io/etcd:<e>-0                       <e>: etcd's (server/v3)
# One of these whose inputs are missing is skipped with a warning; --all
# makes that an error (hack/conformance.sh uses it).
# An image already present with the same config digest is left alone.
# Needs containerd running (hack/local-up.sh starts it and calls this).
# With --out DIR, nothing is imported and no containerd is needed: each image
# is written to DIR/<name>.tar (an OCI archive with a docker manifest.json, as
# `ctr images import` and `kind load image-archive` read), rebuilt only when
# its inputs changed (hack/kind-e2e.sh loads them into a kind node).
set -euo pipefail
PROG=images
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

all=false
tests=false
control_plane=false
out_dir=''
while (($#)); do
  case $1 in
    --all) all=true; tests=true; shift ;;
    --tests) tests=true; shift ;;
    --control-plane) control_plane=true; shift ;;
    --out) (($# > 1)) || die "--out needs a directory"; out_dir=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/{/^set -euo/d; s/^# \{0,1\}//; p}' "$0"; exit 0 ;;
    *) die "unknown argument '$1' (usage: hack/images.sh [--tests] [--all] [--control-plane] [--out DIR])" ;;
  esac
done

E2E=registry.k8s.io/e2e-test-images
PAUSE_IMAGE=registry.k8s.io/pause:3.10.2
BUSYBOX_IMAGES=(docker.io/library/busybox:1.36 docker.io/library/busybox:latest)
E2E_BUSYBOX_IMAGES=("$E2E/busybox:1.37.0-2" "$E2E/busybox:1.36.1-1")
AGNHOST_IMAGE=$E2E/agnhost:2.66.1
AGNHOST_PREV_IMAGE=$E2E/agnhost:2.55
NONROOT_IMAGE=$E2E/nonroot:1.5
NONEWPRIVS_IMAGE=$E2E/nonewprivs:1.4
NGINX_IMAGES=("$E2E/nginx:1.27.0-2" "$E2E/nginx:1.28.0-2")
PERL_IMAGE=$E2E/perl:5.26
GLIBC_DNS_IMAGE=$E2E/glibc-dns-testing:2.1.1
BUSYBOX=${BUSYBOX:-/bin/busybox}
E2E_BUSYBOX=$BIN/busybox-$E2E_BUSYBOX_VERSION

for b in imagebuild pause ctr; do
  [[ -x $BIN/$b ]] || die "missing $BIN/$b (run hack/build-cluster.sh)"
done
[[ -x $BUSYBOX ]] || die "missing dependency: $BUSYBOX (Debian package busybox-static)"
if $tests; then
  # Built when a test first asks for them: the main job needs neither.
  [[ -x $BIN/agnhost ]] || "$ROOT/hack/build-cluster.sh" agnhost || die "hack/build-cluster.sh agnhost failed"
  [[ -x $E2E_BUSYBOX ]] || "$ROOT/hack/build-cluster.sh" busybox || die "hack/build-cluster.sh busybox failed"
fi
[[ -n $out_dir || -S $CTRD_SOCK ]] || die "containerd is not running on $CTRD_SOCK (start it with hack/local-up.sh)"
[[ -z $out_dir ]] || mkdir -p "$out_dir"

STAMPS=$LOCAL/images
mkdir -p "$STAMPS"
work=$(mktemp -d "${TMPDIR:-/tmp}/rustlet-images.XXXXXX")
trap 'rm -rf "$work"' EXIT

# load_applets BINARY: busybox_bin and busybox_applets for the busybox
# BINARY: its applets at their usual paths (/sbin/sysctl, /usr/bin/nc, ...)
# and, as in the upstream busybox image, every one in /bin too (tests run
# /bin/sysctl).
load_applets() {
  local applet a
  busybox_bin=$1
  busybox_applets=()
  local -A seen=()
  while IFS= read -r applet; do
    [[ -n $applet && $applet != bin/busybox ]] || continue
    for a in "/$applet" "/bin/${applet##*/}"; do
      [[ -n ${seen[$a]:-} ]] || busybox_applets+=("$a")
      seen[$a]=1
    done
  done < <("$busybox_bin" --list-full)
  [[ -n ${seen[/bin/sh]:-} ]] || busybox_applets+=(/bin/sh)
}

# busybox_links [NAME...]: sets links to imagebuild arguments that add the
# busybox binary (of the last load_applets) and a symlink to it for every
# applet, except the applets with the given names (which other binaries
# provide).
busybox_links() {
  local a skip=" $* "
  links=(--add "$busybox_bin=/bin/busybox")
  for a in "${busybox_applets[@]}"; do
    [[ $skip == *" ${a##*/} "* ]] || links+=(--link "$a=/bin/busybox")
  done
}
load_applets "$BUSYBOX"

# Files written for the images live in $STAMPS/files and are replaced only
# when their content changes, so the inputs key below stays the same.
FILES=$STAMPS/files
mkdir -p "$FILES"
# put_file NAME MODE: writes standard input to $FILES/NAME with MODE, unless
# it already holds exactly that.
put_file() {
  local f=$FILES/$1
  cat >"$work/new"
  chmod "$2" "$work/new"
  if cmp -s "$work/new" "$f" && [[ $(stat -c %a "$f") == "$(stat -c %a "$work/new")" ]]; then
    rm -f "$work/new"
  else
    mv "$work/new" "$f"
  fi
}

# /etc/passwd and /etc/group as in the upstream busybox image (whoami, id
# and user names in securityContext tests need them), plus the nginx user.
put_file passwd 644 <<'EOF'
root:x:0:0:root:/root:/bin/sh
daemon:x:1:1:daemon:/usr/sbin:/bin/false
bin:x:2:2:bin:/bin:/bin/false
sys:x:3:3:sys:/dev:/bin/false
sync:x:4:100:sync:/bin:/bin/sync
mail:x:8:8:mail:/var/spool/mail:/bin/false
www-data:x:33:33:www-data:/var/www:/bin/false
operator:x:37:37:Operator:/var:/bin/false
nginx:x:101:101:nginx:/nonexistent:/bin/false
nobody:x:65534:65534:nobody:/home:/bin/false
EOF
put_file group 644 <<'EOF'
root:x:0:
daemon:x:1:
bin:x:2:
sys:x:3:
adm:x:4:
tty:x:5:
disk:x:6:
lp:x:7:
mail:x:8:
kmem:x:9:
wheel:x:10:root
floppy:x:11:
uucp:x:14:
www-data:x:33:
operator:x:37:
staff:x:50:
users:x:100:
nginx:x:101:
nogroup:x:65534:
EOF
etc_files=(--add "$FILES/passwd=/etc/passwd" --add "$FILES/group=/etc/group")
# agnhost's image also has a user and a group of its own (the
# securityContext tests look for group 50000 in `id -G`).
{ cat "$FILES/passwd"; echo 'user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh'; } |
  put_file agnhost-passwd 644
{
  cat "$FILES/group"
  echo 'user-defined-in-image:x:1000:'
  echo 'group-defined-in-image:x:50000:user-defined-in-image'
} | put_file agnhost-group 644

# shared_libs BINARY...: sets libs to imagebuild arguments that add the
# shared libraries and the dynamic loader that ldd resolves for the binaries
# (image_libs). Returns 1 (after a warning) if one is missing; with --all
# that is an error instead.
shared_libs() {
  if ! image_libs "$@"; then
    $all && die "$libs_missing"
    warn "skipping an image: $libs_missing"
    return 1
  fi
}

# missing FILE...: true (after a warning) if a file is missing; with --all
# that is an error instead.
missing() {
  local f gone=()
  for f in "$@"; do [[ -e $f ]] || gone+=("$f"); done
  ((${#gone[@]})) || return 1
  $all && die "missing ${gone[*]} (run hack/install-deps.sh and hack/build-cluster.sh images)"
  warn "skipping an image: missing ${gone[*]} (run hack/install-deps.sh and hack/build-cluster.sh images)"
}

# config_digest_of_archive TAR: the image config digest (the image id).
config_digest_of_archive() {
  tar -xOf "$1" manifest.json | jq -r '.[0].Config'
}

# config_digest_in_containerd NAME: the config digest of image NAME in
# containerd, or nothing if it is absent.
config_digest_in_containerd() {
  local target
  target=$(ctr_k8s images list "name==$1" 2>/dev/null | awk 'NR == 2 { print $3 }')
  [[ $target == sha256:* ]] || return 0
  ctr_k8s content get "$target" 2>/dev/null | jq -r '.config.digest // empty' 2>/dev/null || true
}

# inputs_key IMAGEBUILD-ARGS...: a hash of the arguments and of the size,
# mtime, inode and mode of imagebuild, of every --add source and of every
# file under a --tree source: when it matches the last build's, the archive
# would be the same and is not rebuilt.
inputs_key() {
  local a prev='' files=("$BIN/imagebuild") trees=()
  for a in "$@"; do
    [[ $prev == --add ]] && files+=("${a%%=*}")
    [[ $prev == --tree ]] && trees+=("${a%%=*}")
    prev=$a
  done
  {
    printf '%s\n' "$@"
    stat -L -c '%n %s %Y %i %a' "${files[@]}"
    ((${#trees[@]} == 0)) || find "${trees[@]}" -printf '%p %s %T@ %i %m %l\n' | sort
  } | sha256sum | cut -c1-64
}

# all_tags_at DIGEST TAG...: every tag names an image with config DIGEST.
all_tags_at() {
  local want=$1 t
  shift
  for t in "$@"; do
    [[ $(config_digest_in_containerd "$t") == "$want" ]] || return 1
  done
}

# image LABEL ARCHIVE-NAME IMAGEBUILD-ARGS...: builds the archive and imports
# it, unless every tag already points at the same config.
image() {
  local label=$1 out=$work/$2.tar stamp=$STAMPS/$2
  shift 2
  local t0 tags=() a prev='' key k want
  t0=$(now_ms)
  for a in "$@"; do
    [[ $prev == --tag ]] && tags+=("$a")
    prev=$a
  done
  key=$(inputs_key "$@")
  if [[ -n $out_dir ]]; then
    out=$out_dir/$label.tar stamp=$out_dir/.$label.key
    if [[ -f $out && -f $stamp && $(<"$stamp") == "$key" ]]; then
      log "$label: up to date ($out)"
    else
      "$BIN/imagebuild" --out "$out" "$@" >/dev/null
      echo "$key" >"$stamp"
      log "$label: wrote $out in $(since "$t0")"
    fi
    return
  fi
  # Same inputs as last time, and containerd still has that image.
  if [[ -f $stamp ]] && read -r k want <"$stamp" && [[ $k == "$key" ]] && all_tags_at "$want" "${tags[@]}"; then
    log "$label: up to date (${want:7:12}, ${#tags[@]} tags)"
    return
  fi
  "$BIN/imagebuild" --out "$out" "$@" >/dev/null
  want=$(config_digest_of_archive "$out")
  if all_tags_at "$want" "${tags[@]}"; then
    echo "$key $want" >"$stamp"
    log "$label: up to date (${want:7:12}, ${#tags[@]} tags)"
    return
  fi
  # Importing re-tags every name in the archive, so one import serves all.
  # ctr relays containerd's deprecation warnings (cgroup v1) on stderr; keep
  # them out of the way unless the import fails.
  if ! ctr_k8s images import --snapshotter overlayfs "$out" >"$work/import.log" 2>&1; then
    sed 's/^/    /' "$work/import.log" >&2
    die "$label: ctr images import $out failed"
  fi
  all_tags_at "$want" "${tags[@]}" || die "$label: ${tags[*]} do not all name $want after import"
  echo "$key $want" >"$stamp"
  log "$label: imported ${tags[*]} (${want:7:12}) in $(since "$t0")"
}


# tag_args IMAGE...: sets tags to --tag arguments.
tag_args() {
  local t
  tags=()
  for t in "$@"; do tags+=(--tag "$t"); done
}

PAUSE_ARGS=(--tag "$PAUSE_IMAGE" --add "$BIN/pause=/pause" --entrypoint '["/pause"]' --user 65535:65535)
image pause pause "${PAUSE_ARGS[@]}"

busybox_links
tag_args "${BUSYBOX_IMAGES[@]}"
image busybox busybox "${tags[@]}" "${links[@]}" "${etc_files[@]}" --cmd '["sh"]'

# test_images: the images of the tests (--tests).
test_images() {
# The e2e busybox image: upstream's is busybox 1.37 as configured by default,
# built here from its source (hack/build-cluster.sh busybox). Debian's busybox
# would not do: it leaves out nmeter (the node suite's lifecycle tests take
# millisecond timestamps with it), and its sh drops environment variables
# whose names are not shell identifiers (envFrom of ConfigMap key "data-1").
tag_args "${E2E_BUSYBOX_IMAGES[@]}"
load_applets "$E2E_BUSYBOX"
busybox_links
image e2e-busybox e2e-busybox "${tags[@]}" "${links[@]}" "${etc_files[@]}" --cmd '["sh"]'
load_applets "$BUSYBOX"

# agnhost: like upstream's (alpine) image: /agnhost and /agnhost-2 (a
# symlink the entrypoint tests run), /uploads, porter's localhost.crt and
# .key, /var/registry for fake-registry-server (the local pause image as
# pause:testing), its own user and group, and the tools the tests run in it:
# curl, nc (OpenBSD's: UDP with -u), bash, socat, ip from Debian; busybox
# for the rest (nslookup, wget, ...). /bin/sh is dash: Debian's busybox sh
# runs its own applets before PATH (its nc has no -u), alpine's does not. The previous agnhost name is the same
# binary in an image of its own (one environment variable apart).
agnhost_args=()
AGNHOST_TOOLS=(/usr/bin/curl=/usr/bin/curl "$DEBS/netcat-openbsd/bin/nc.openbsd=/usr/bin/nc"
  /usr/bin/bash=/bin/bash /usr/bin/socat=/usr/bin/socat /usr/sbin/ip=/sbin/ip /usr/bin/dash=/bin/sh)
tool_srcs=() tool_names=()
for t in "${AGNHOST_TOOLS[@]}"; do
  tool_srcs+=("${t%%=*}")
  tool_names+=("${t##*/}")
done
PORTER=$BIN/agnhost-porter
if ! missing "${tool_srcs[@]}" "$PORTER/localhost.crt" "$PORTER/localhost.key" "$BIN/registrylayout" &&
  shared_libs "${tool_srcs[@]}"; then
  for t in "${AGNHOST_TOOLS[@]}"; do agnhost_args+=(--add "$t"); done
  agnhost_args+=("${libs[@]}" --add "$PORTER/localhost.crt=/localhost.crt" --add "$PORTER/localhost.key=/localhost.key")
  # /var/registry, rewritten when the pause image or the writer changes.
  # Upstream's pause:testing is registry.k8s.io/pause itself; here it is a
  # distinct image (one environment variable apart). Otherwise, once a test
  # pulled it with a secret, the kubelet (KubeletEnsureSecretPulledImages)
  # would make every later pod that runs registry.k8s.io/pause as a
  # container pull that again, from a registry this machine cannot reach.
  REGISTRY_PAUSE_ARGS=("${PAUSE_ARGS[@]}" --env "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    --env "FAKE_REGISTRY_IMAGE=pause:testing")
  reg_key=$(inputs_key "${REGISTRY_PAUSE_ARGS[@]}" --add "$BIN/registrylayout=/")
  if [[ ! -f $FILES/registry.key || $(<"$FILES/registry.key") != "$reg_key" ]]; then
    "$BIN/imagebuild" --out "$work/pause-registry.tar" "${REGISTRY_PAUSE_ARGS[@]}" >/dev/null
    rm -rf "$FILES/registry" "$FILES/registry.key"
    "$BIN/registrylayout" --archive "$work/pause-registry.tar" --dir "$FILES/registry" --name pause --tag testing >/dev/null
    echo "$reg_key" >"$FILES/registry.key"
  fi
  agnhost_args+=(--tree "$FILES/registry=/var/registry")
else
  tool_names=()
fi
busybox_links "${tool_names[@]}"
agnhost_args+=(--add "$BIN/agnhost=/agnhost" --link /agnhost-2=agnhost --dir /uploads "${links[@]}"
  --add "$FILES/agnhost-passwd=/etc/passwd" --add "$FILES/agnhost-group=/etc/group"
  --entrypoint '["/agnhost"]' --cmd '["pause"]')
image agnhost agnhost --tag "$AGNHOST_IMAGE" "${agnhost_args[@]}"
image agnhost-prev agnhost-prev --tag "$AGNHOST_PREV_IMAGE" "${agnhost_args[@]}" \
  --env "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" --env "AGNHOST_IMAGE=$AGNHOST_PREV_IMAGE"

busybox_links

# nonroot: upstream is debian-base with USER 1234; the tests run `id -u`.
image nonroot nonroot --tag "$NONROOT_IMAGE" "${links[@]}" "${etc_files[@]}" --user 1234 --cmd '["sh"]'

# nonewprivs: upstream is alpine with a setuid-root nnp that prints its
# effective uid. imagebuild keeps the setuid bit of the copy made here.
if ! missing "$BIN/nnp"; then
  put_file nnp 4755 <"$BIN/nnp"
  image nonewprivs nonewprivs --tag "$NONEWPRIVS_IMAGE" --add "$FILES/nnp=/usr/local/bin/nnp" \
    "${links[@]}" "${etc_files[@]}" --cmd '["nnp"]'
fi

# nginx: Debian's nginx with a configuration like the upstream (alpine)
# image's: port 80, /usr/share/nginx/html, logs to stdout and stderr.
NGINX=$DEBS/nginx/usr/sbin/nginx
NGINX_COMMON=$DEBS/nginx-common
if ! missing "$NGINX" "$NGINX_COMMON/etc/nginx/mime.types" && shared_libs "$NGINX"; then
  put_file nginx.conf 644 <<'EOF'
user nginx;
worker_processes auto;
error_log /var/log/nginx/error.log notice;
pid /run/nginx.pid;
events {
    worker_connections 1024;
}
http {
    include /etc/nginx/mime.types;
    default_type application/octet-stream;
    access_log /var/log/nginx/access.log;
    sendfile on;
    keepalive_timeout 65;
    server {
        listen 80;
        server_name localhost;
        location / {
            root /usr/share/nginx/html;
            index index.html index.htm;
        }
    }
}
EOF
  tag_args "${NGINX_IMAGES[@]}"
  image nginx nginx "${tags[@]}" --add "$NGINX=/usr/sbin/nginx" "${libs[@]}" \
    --add "$FILES/nginx.conf=/etc/nginx/nginx.conf" \
    --add "$NGINX_COMMON/etc/nginx/mime.types=/etc/nginx/mime.types" \
    --add "$NGINX_COMMON/usr/share/nginx/html/index.html=/usr/share/nginx/html/index.html" \
    --link /var/log/nginx/access.log=/dev/stdout --link /var/log/nginx/error.log=/dev/stderr \
    --dir /var/lib/nginx --dir /run \
    "${links[@]}" "${etc_files[@]}" --cmd '["nginx", "-g", "daemon off;"]'
fi

# perl: upstream is the Docker library's perl image (Debian); here Debian's
# perl (5.36) with the modules of perl-base.
PERL=/usr/bin/perl
PERL_BASE=/usr/lib/x86_64-linux-gnu/perl-base
if ! missing "$PERL" "$PERL_BASE" && shared_libs "$PERL"; then
  image perl perl --tag "$PERL_IMAGE" --add "$PERL=/usr/bin/perl" "${libs[@]}" \
    --tree "$PERL_BASE=$PERL_BASE" "${links[@]}" "${etc_files[@]}" --cmd '["perl"]'
fi

# glibc-dns-testing: upstream is debian:bookworm-slim with dnsutils and
# coredns; the node tests run `sh -c 'echo $(hostname)";"$(hostname -f)";"'`,
# which needs glibc's resolver: dash and GNU hostname, busybox for the rest.
DASH=/usr/bin/dash
HOSTNAME_BIN=/usr/bin/hostname
if ! missing "$DASH" "$HOSTNAME_BIN" && shared_libs "$DASH" "$HOSTNAME_BIN"; then
  busybox_links sh hostname
  image glibc-dns-testing glibc-dns-testing --tag "$GLIBC_DNS_IMAGE" \
    --add "$DASH=/bin/dash" --add "$HOSTNAME_BIN=/bin/hostname" "${libs[@]}" --link /bin/sh=/bin/dash \
    "${links[@]}" "${etc_files[@]}" --cmd '["sh"]'
fi
}
if $tests; then test_images; fi

# The control plane's images: the binary at /usr/local/bin/<name>, its shared
# libraries, and nothing else; the static pods give the command.
if $control_plane; then
  # Asked for, so a missing part is an error: without its image the static
  # pod would wait for a pull that cannot happen.
  for c in kube-apiserver kube-controller-manager kube-scheduler etcd; do
    tag=$(control_plane_image "$c")
    [[ -x $BIN/$c ]] || die "missing $BIN/$c (run hack/build-cluster.sh k8s)"
    image_libs "$BIN/$c" || die "$libs_missing"
    image "$c" "$c" --tag "$tag" --add "$BIN/$c=/usr/local/bin/$c" "${libs[@]}" \
      --dir /tmp --entrypoint "[\"/usr/local/bin/$c\"]"
  done
fi
