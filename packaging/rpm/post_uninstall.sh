# %postun of the gpushare RPM: what %systemd_postun_with_restart gpushared.service does. $1 is
# the number of gpushare packages left: 1 or more on an upgrade, when a running gpushared is
# restarted on the new binary (its MPS control daemons survive: KillMode=process), 0 on erase.
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || :
fi
if [ "$1" -ge 1 ]; then
    systemctl try-restart gpushared.service >/dev/null 2>&1 || :
    systemctl try-restart gpushare-dra.service >/dev/null 2>&1 || :
fi
