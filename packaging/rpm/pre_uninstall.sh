# %preun of the gpushare RPM: what %systemd_preun gpushared.service does. $1 is 0 when the
# package is being erased (not upgraded): then the service is disabled and stopped. MPS
# control daemons of claims still prepared keep running (KillMode=process): release claims
# (gpushare unprepare, or drain the node) before removing the package.
if [ "$1" -eq 0 ]; then
    systemctl --no-reload disable --now gpushared.service >/dev/null 2>&1 || :
fi
