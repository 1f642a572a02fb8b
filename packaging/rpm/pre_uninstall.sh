# %preun of the gpushare RPM: what %systemd_preun gpushared.service does. $1 is 0 when the
# package is being erased (not upgraded): then the service is disabled and stopped. MPS
# control daemons of claims still prepared keep running (KillMode=process): release claims
# (gpushare unprepare, or drain the node) before removing the package.
if [ "$1" -eq 0 ]; then
    # The plugin first, so that it cannot publish again; then this node's ResourceSlices of
    # its driver go (kubelet would wipe them 30 s later anyway; this makes an erase leave
    # nothing behind). Bounded: an unreachable API server must not hang the erase.
    systemctl --no-reload disable --now gpushare-dra.service >/dev/null 2>&1 || :
    GPUSHARE_DRA_ARGS=
    [ -r /etc/gpushare/gpushare-dra.env ] && . /etc/gpushare/gpushare-dra.env
    timeout 30 /usr/bin/gpushare-dra $GPUSHARE_DRA_ARGS --remove-slices >/dev/null 2>&1 || :
    systemctl --no-reload disable --now gpushared.service >/dev/null 2>&1 || :
fi
