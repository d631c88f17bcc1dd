#!/bin/sh
# @NAME@ preremove (deb prerm, rpm %preun), rendered by packaging/build.sh.
#
# When the package goes away (not on an upgrade), stops the service and
# removes the links `systemctl enable` made.
set -e

case "$1" in
remove | 0) # deb: remove; rpm: no version left after this
	if [ -d /run/systemd/system ]; then
		systemctl stop @NAME@.service || true
	fi
	if command -v systemctl >/dev/null 2>&1; then
		systemctl --no-reload disable @NAME@.service >/dev/null 2>&1 || true
	fi
	;;
esac
exit 0
