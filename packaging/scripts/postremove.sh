#!/bin/sh
# @NAME@ postremove (deb postrm, rpm %postun), rendered by packaging/build.sh.
#
# Makes systemd forget the unit. On `dpkg --purge`, also deletes the
# service's data ($purge; empty if it keeps none). dpkg itself deletes
# /etc/tether/@CONFIG@; files the operator put in /etc/tether (certificates,
# keys, kubeconfigs) stay. rpm has no purge: `rpm -e` keeps the data.
set -e

case "$1" in
purge)
	purge="@PURGE@"
	[ -z "$purge" ] || rm -rf $purge
	;;
esac

if [ -d /run/systemd/system ]; then
	systemctl daemon-reload || true
fi
exit 0
