#!/usr/bin/env bash
# Builds a Tether container image from packaging/docker/Dockerfile (`make
# image` runs it after `make build`).
#
#   packaging/docker/build-image.sh BIN_DIR PROGRAM IMAGE
#
# PROGRAM is tether-gateway or tether-edge (the Dockerfile's target), taken
# from BIN_DIR, where `make build` put it (static, CGO disabled); IMAGE is
# the name:tag to give the image. The build context is a directory of its
# own with the binary and the CA bundle of this host, so no base image is
# pulled and nothing else reaches the image. Environment:
#   VERSION          recorded in the image's labels
#   CONTAINER_TOOL   podman (default) or docker
#   CA_BUNDLE        CA certificates to copy (default: Debian's bundle)
set -euo pipefail

if [ $# -ne 3 ]; then
	sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
	exit 2
fi
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=$1 program=$2 image=$3
tool=${CONTAINER_TOOL:-podman}
ca=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}

case $program in
tether-gateway | tether-edge) ;;
*) echo "image: unknown program $program (want tether-gateway or tether-edge)" >&2; exit 2 ;;
esac
# The image has no C library: refuse a binary that needs one.
if ! go version -m "$bin/$program" | grep -q 'CGO_ENABLED=0'; then
	echo "image: $bin/$program was not built with CGO_ENABLED=0 (run make build)" >&2
	exit 1
fi
if [ ! -s "$ca" ]; then
	echo "image: no CA bundle at $ca (apt-get install ca-certificates, or set CA_BUNDLE)" >&2
	exit 1
fi

ctx=$(mktemp -d "$bin/.image-context.XXXXXX")
trap 'rm -rf "$ctx"' EXIT
cp "$bin/$program" "$ctx/"
cp "$ca" "$ctx/ca-certificates.crt"

args=(build --file "$root/packaging/docker/Dockerfile" --target "$program" --tag "$image"
	--build-arg "VERSION=${VERSION:-dev}")
if [ "$tool" = podman ]; then
	# Daemonless podman as root in a container (ENVIRONMENT.md). No layer
	# cache: the build copies two files, and old layers would pile up.
	export CONTAINERS_CONF=${CONTAINERS_CONF:-$root/packaging/docker/containers.conf}
	# --network none: the Dockerfile has no RUN step, and without it podman
	# would set up its bridge network (netavark rules and ip_forward) in the
	# host namespace.
	args=(--cgroup-manager cgroupfs "${args[@]}" --runtime runc --layers=false --network none)
fi
"$tool" "${args[@]}" "$ctx" >&2
printf '%s\n' "$image"
