#!/bin/sh
# Install Qinglong under systemd from this checkout, as root. Idempotent: run it again to upgrade
# (it reinstalls the package and the units, and keeps the settings files you edited).
#
#   deploy/systemd/install.sh                              # qinglong.service: standalone (or edge)
#   QINGLONG_EXTRAS=cluster deploy/systemd/install.sh      # a worker machine: qinglong-worker.service
#
# Then edit /etc/qinglong/qinglong.toml (or worker.toml: its [worker] url and token_file) and start the unit:
#   systemctl enable --now qinglong         # or qinglong-worker
set -eu

here=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd)
checkout=$(CDPATH= cd -- "$here/../.." && pwd)
extras=${QINGLONG_EXTRAS:-standalone}
prefix=/opt/qinglong

# The package, from the checkout, in its own virtual environment (the units' ExecStart).
[ -x "$prefix/bin/python" ] || python3 -m venv "$prefix"
"$prefix/bin/pip" install --quiet --disable-pip-version-check "$checkout[$extras]"
# The pages the units' Documentation= names.
install -d -m 0755 "$prefix/share/doc/qinglong"
install -m 0644 "$checkout/docs/operations.md" "$checkout/docs/workers.md" "$prefix/share/doc/qinglong/"

# The units' user and group (deploy/systemd/qinglong.sysusers.conf).
install -d -m 0755 /etc/sysusers.d
install -m 0644 "$here/qinglong.sysusers.conf" /etc/sysusers.d/qinglong.conf
systemd-sysusers /etc/sysusers.d/qinglong.conf

# Settings: readable by the units' user (through its group), writable by root alone; a file
# already there is yours and is left as it is.
install -d -m 0750 -o root -g qinglong /etc/qinglong
for name in qinglong.toml worker.toml api.toml; do
    [ -e "/etc/qinglong/$name" ] || install -m 0640 -o root -g qinglong "$here/$name" "/etc/qinglong/$name"
done

install -m 0644 "$here/qinglong.service" "$here/qinglong-worker.service" "$here/qinglong-api.service" \
    /etc/systemd/system/
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload
fi
echo "installed; start with: systemctl enable --now qinglong (or qinglong-worker)"
