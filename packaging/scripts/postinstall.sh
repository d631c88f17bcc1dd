#!/bin/sh
# @NAME@ postinstall (deb postinst, rpm %post), rendered by packaging/build.sh.
#
# Makes systemd see the unit. Never enables or starts the service: the
# default /etc/tether/@CONFIG@ configures nothing, and the service would only
# fail. The operator edits it, then runs `systemctl enable --now @NAME@`.
# On an upgrade, a running service is restarted with the new binary.
set -e

upgrade=
case "$1" in
configure) [ -z "$2" ] || upgrade=1 ;; # deb: configure <previously installed version>
[0-9]*) [ "$1" -lt 2 ] || upgrade=1 ;; # rpm: installed versions, counting this one
esac

if [ -d /run/systemd/system ]; then
	systemctl daemon-reload || true
	if [ -n "$upgrade" ]; then
		systemctl try-restart @NAME@.service || true
	fi
fi
exit 0
