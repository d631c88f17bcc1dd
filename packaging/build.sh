#!/usr/bin/env bash
# Builds the deb and rpm packages of tether-edge and tether-gateway with nfpm
# (`make package` runs it after `make build`).
#
#   packaging/build.sh BIN_DIR OUT_DIR
#
# BIN_DIR holds the static binaries (tether-edge, tether-gateway, tetherctl);
# the packages land in OUT_DIR, whose .work/ keeps the rendered nfpm configs
# and install scripts. Environment:
#   VERSION         the binaries' version, from `git describe --tags --always
#                   --dirty` (the package version is derived from it)
#   NFPM            the nfpm binary (default: tools/build-nfpm.sh builds it)
#   GOARCH          package architecture (default: `go env GOARCH`)
#   PKG_MAINTAINER  the packages' Maintainer field
#   PACKAGES, FORMATS  subsets (default: "tether-edge tether-gateway", "deb rpm")
#
# It prints the path of every package it wrote.
set -euo pipefail

if [ $# -ne 2 ]; then
	sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
	exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$(cd "$1" && pwd)
mkdir -p "$2"
out=$(cd "$2" && pwd)
cd "$root"

version=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
arch=${GOARCH:-$(go env GOARCH)}
maintainer=${PKG_MAINTAINER:-Tether maintainers <tether-maintainers@users.noreply.github.com>}
nfpm=${NFPM:-$(tools/build-nfpm.sh)}

# package_version turns a `git describe` output into a version that sorts
# right for both dpkg and rpm (no "-", "~" sorts before the release, "+"
# after it):
#   v1.2.3              1.2.3
#   v1.2.3-rc.1         1.2.3~rc.1
#   v1.2.3-4-gabc1234   1.2.3+git4.abc1234
#   abc1234 (no tag)    0.0.0~git<commits>.abc1234
#   ...-dirty           ...+dirty, or .dirty after a "+" part
package_version() {
	local v=$1 dirty= base meta=
	if [[ $v == *-dirty ]]; then
		dirty=1
		v=${v%-dirty}
	fi
	local tag='^v?([0-9]+\.[0-9]+\.[0-9]+)(-([0-9A-Za-z.]+))?(-([0-9]+)-g([0-9a-f]+))?$'
	if [[ $v =~ $tag ]]; then
		base=${BASH_REMATCH[1]}
		[ -z "${BASH_REMATCH[3]}" ] || base+="~${BASH_REMATCH[3]}"
		[ -z "${BASH_REMATCH[4]}" ] || meta="git${BASH_REMATCH[5]}.${BASH_REMATCH[6]}"
	elif [[ $v =~ ^[0-9a-f]{4,40}$ ]]; then
		local n
		n=$(git rev-list --count HEAD 2>/dev/null || true)
		base="0.0.0~git${n:+$n.}$v"
	else
		base="0.0.0~$(printf '%s' "$v" | tr -c 'A-Za-z0-9.' '.')"
	fi
	if [ -n "$dirty" ]; then
		meta=${meta:+$meta.}dirty
	fi
	printf '%s%s\n' "$base" "${meta:++$meta}"
}

pkgversion=$(package_version "$version")
echo "package: version $pkgversion (from $version), $arch" >&2

# render FILE NAME: FILE with the placeholders of package NAME filled in.
render() {
	local config purge=
	case $2 in
	tether-edge) config=edge.yaml purge=/var/lib/tether ;;
	tether-gateway) config=gateway.yaml purge=/var/lib/tether-gateway ;;
	*) echo "package: unknown package $2" >&2; return 1 ;;
	esac
	sed -e "s|@NAME@|$2|g" -e "s|@CONFIG@|$config|g" -e "s|@PURGE@|$purge|g" \
		-e "s|@VERSION@|$pkgversion|g" -e "s|@ARCH@|$arch|g" -e "s|@MAINTAINER@|$maintainer|g" \
		-e "s|@BIN@|$bin|g" -e "s|@WORK@|$out/.work/$2|g" "$1"
}

for name in ${PACKAGES:-tether-edge tether-gateway}; do
	# Packages of earlier versions would only confuse `dpkg -i *.deb`.
	rm -f "$out/${name}"_*.deb "$out/${name}"-[0-9]*.rpm
	work="$out/.work/$name"
	rm -rf "$work"
	mkdir -p "$work"
	for s in postinstall preremove postremove; do
		render "packaging/scripts/$s.sh" "$name" >"$work/$s.sh"
		chmod 0755 "$work/$s.sh"
	done
	render "packaging/nfpm/$name.yaml" "$name" >"$work/nfpm.yaml"
	for format in ${FORMATS:-deb rpm}; do
		# nfpm names the file itself (name_version-release_arch.deb,
		# name-version-release.arch.rpm); find it by what it prints.
		log=$("$nfpm" package --config "$work/nfpm.yaml" --packager "$format" --target "$out/" 2>&1) || {
			printf '%s\n' "$log" >&2
			exit 1
		}
		file=$(printf '%s\n' "$log" | sed -n 's/.*created package: //p' | tail -1)
		if [ ! -f "$file" ]; then
			printf 'package: nfpm did not say which file it wrote:\n%s\n' "$log" >&2
			exit 1
		fi
		printf '%s\n' "$file"
	done
done
