# %post of the gpushare RPM: what %systemd_post gpushared.service does, without the macros.
# $1 is the number of gpushare packages installed after this transaction: 1 on a fresh
# install, 2 on an upgrade. Nothing here may fail the install (`|| :`), and systemctl is only
# asked when systemd runs: at AMI bake time in a chroot, or under `rpm --root`, it does not.
systemd-tmpfiles --create /usr/lib/tmpfiles.d/gpushare.conf >/dev/null 2>&1 || :
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || :
fi
if [ "$1" -eq 1 ]; then
    # Enables gpushared.service as 90-gpushare.preset says; it starts at the next boot (or
    # `systemctl start gpushared`), so that installing from cloud-init before nodeadm runs
    # never races the node's bootstrap.
    systemctl --no-reload preset gpushared.service >/dev/null 2>&1 || :
    systemctl --no-reload preset gpushare-dra.service >/dev/null 2>&1 || :
fi
