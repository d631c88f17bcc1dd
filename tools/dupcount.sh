#!/usr/bin/env bash
# Counts the duplicated runs of six or more lines in the production code:
# the pairs the `duplicates` command lists over the tracked .go files that
# are neither tests nor e2e, internal/testenv or tools, leaving out the
# pairs it marks boilerplate and those whose two places both lie in their
# files' import blocks. Prints the count; with -v, also the rows counted.
#
#   tools/dupcount.sh       the count
#   tools/dupcount.sh -v    the rows counted, then the count
#
# Needs: git, awk and the `duplicates` command.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
verbose=false
[ "${1:-}" = -v ] && verbose=true

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$root"
git ls-files '*.go' |
	grep -v -e '_test\.go$' -e '^e2e/' -e '^internal/testenv/' -e '^tools/' |
	while read -r f; do
		mkdir -p "$tmp/src/$(dirname "$f")"
		cp "$f" "$tmp/src/$f"
	done

duplicates --repo "$tmp/src" --most 200 --seconds 120 >"$tmp/rows"
if grep -q '^incomplete:' "$tmp/rows"; then
	grep '^incomplete:' "$tmp/rows" >&2
	exit 1
fi
if grep -q '^(+[0-9]* more pairs)' "$tmp/rows"; then
	echo "dupcount: more than 200 pairs; the count would be short" >&2
	exit 1
fi

# imports: one line per file, "path first last", the lines of its import
# block (an "import (" ... ")" block or a single import line).
for f in $(awk '/^D[0-9]+ / {split($2, a, ":"); split($4, b, ":"); print a[1]; print b[1]}' "$tmp/rows" | sort -u); do
	awk -v f="$f" '
		/^import \($/ && !first { first = NR; open = 1; next }
		open && /^\)$/ { print f, first, NR; found = 1; exit }
		/^import "/ && !first { print f, NR, NR; found = 1; exit }
		END { if (!found) print f, 0, 0 }
	' "$tmp/src/$f"
done >"$tmp/imports"

awk -v verbose="$verbose" '
	NR == FNR { first[$1] = $2; last[$1] = $3; next }
	!/^D[0-9]+ / { next }
	/ boilerplate/ { next }
	{
		n = split($2, a, "[:-]"); split($4, b, "[:-]")
		inA = first[a[1]] > 0 && a[2] >= first[a[1]] && a[3] <= last[a[1]]
		inB = first[b[1]] > 0 && b[2] >= first[b[1]] && b[3] <= last[b[1]]
		if (inA && inB) next
		count++
		if (verbose == "true") print
	}
	END { print count + 0 }
' "$tmp/imports" "$tmp/rows"
