"""deploy/systemd/install.sh, run as root the way its header says, twice, in a private mount
namespace whose /etc and /opt are overlays (the machine's own stay untouched): it installs the
package from the checkout, creates the units' user, settings that user can read, the pages the
units' Documentation= names and the units, which `systemd-analyze verify` then accepts as
installed (their ExecStart programs are the installed ones)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SYSTEMD = REPO / "deploy" / "systemd"
UNITS = ("qinglong.service", "qinglong-worker.service")

pytestmark = pytest.mark.slow

#: Run inside `unshare --mount`: overlays on /etc and /opt, the install script twice (an edit of
#: the operator's settings in between must survive), then every check as the units' user.
NAMESPACE_SCRIPT = r"""
set -eu
mount --make-rprivate /
for d in etc opt; do
    mkdir -p "$SCRATCH/upper-$d" "$SCRATCH/work-$d"
    mount -t overlay overlay -o "lowerdir=/$d,upperdir=$SCRATCH/upper-$d,workdir=$SCRATCH/work-$d" "/$d"
done
# a running systemd must not be told about units that exist only in here
if [ -d /run/systemd ]; then mount -t tmpfs tmpfs /run/systemd; fi
if getent passwd qinglong >/dev/null; then echo "the user qinglong exists before the install" >&2; exit 90; fi

sh "$CHECKOUT/deploy/systemd/install.sh"
echo "# edited by the operator" >> /etc/qinglong/qinglong.toml
sh "$CHECKOUT/deploy/systemd/install.sh"
grep -q "edited by the operator" /etc/qinglong/qinglong.toml || { echo "settings overwritten" >&2; exit 91; }

getent passwd qinglong
stat -c 'etc-qinglong %U:%G %a' /etc/qinglong
stat -c 'qinglong.toml %U:%G %a' /etc/qinglong/qinglong.toml
stat -c 'worker.toml %U:%G %a' /etc/qinglong/worker.toml
runuser -u qinglong -- test -r /etc/qinglong/qinglong.toml
runuser -u qinglong -- test -r /etc/qinglong/worker.toml
if runuser -u qinglong -- test -w /etc/qinglong/qinglong.toml; then echo "settings writable by the user" >&2; exit 92; fi
cd /
runuser -u qinglong -- env QINGLONG_SETTINGS=/etc/qinglong/qinglong.toml /opt/qinglong/bin/qinglong config show >/dev/null
for unit in $UNITS; do
    doc=$(sed -n 's|^Documentation=file://||p' "/etc/systemd/system/$unit")
    test -s "$doc" || { echo "$unit: Documentation=$doc does not exist" >&2; exit 93; }
    exec_start=$(sed -n 's|^ExecStart=\([^ ]*\).*|\1|p' "/etc/systemd/system/$unit")
    test -x "$exec_start" || { echo "$unit: ExecStart=$exec_start is not installed" >&2; exit 94; }
done
out=$(cd "$SCRATCH" && systemd-analyze verify $(for u in $UNITS; do echo "/etc/systemd/system/$u"; done) 2>&1) \
    || { echo "verify failed: $out" >&2; exit 95; }
[ -z "$out" ] || { echo "verify: $out" >&2; exit 96; }
echo "all checks passed"
"""


def _checkout_copy(tmp_path: Path) -> Path:
    """The checkout as a user has it (no virtualenvs, caches or build output), so the install
    builds from its sources alone and writes nothing into this repository."""
    ignore = shutil.ignore_patterns(".git", "__pycache__", "*.egg-info", "build", "dist", ".venv", "venv",
                                    ".pytest_cache", ".hypothesis", "bench", "*.db*")
    target = tmp_path / "checkout"
    shutil.copytree(REPO, target, ignore=ignore, symlinks=True)
    return target


def test_install_script_as_root_gives_the_units_user_its_settings_and_verifiable_units(tmp_path):
    """The steps the unit shipped with failed on a fresh machine: they installed a qinglong.toml
    deploy/systemd did not have, made /etc/qinglong root's 0750 so the unit's user could not read
    its settings (the service died at start, exit 3), pip-installed a package name no registry
    serves, and pointed Documentation= at a file nothing installed. Run twice, the script must
    also keep the operator's edited settings."""
    assert os.geteuid() == 0, "the install steps run as root (CI runs as root)"
    for tool in ("unshare", "systemd-sysusers", "systemd-analyze", "runuser"):
        assert shutil.which(tool), f"{tool} is missing (.ci/install-system-deps installs systemd)"
    checkout = _checkout_copy(tmp_path)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QINGLONG_", "PIP_", "VIRTUAL_ENV"))}
    env.update(SCRATCH=str(scratch), CHECKOUT=str(checkout), UNITS=" ".join(UNITS),
               PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    result = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", NAMESPACE_SCRIPT],
                            env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[-1] == "all checks passed"
    assert "etc-qinglong root:qinglong 750" in lines
    assert "qinglong.toml root:qinglong 640" in lines and "worker.toml root:qinglong 640" in lines
    # nothing of it reached the machine
    assert not Path("/opt/qinglong").exists() or Path("/opt/qinglong").stat().st_mtime < scratch.stat().st_mtime
    assert not Path("/etc/systemd/system/qinglong-worker.service").exists()


def test_every_unit_the_script_installs_is_shipped_and_names_a_documented_settings_file():
    """A unit the script does not install (or a settings file it does not ship) is one the
    operator has to find by hand; a unit naming a settings file the script does not install
    refuses to start (exit 3, settings file not found)."""
    script = (SYSTEMD / "install.sh").read_text()
    shipped = {p.name for p in SYSTEMD.glob("*.service")}
    assert shipped == set(UNITS) | {"qinglong-api.service"}
    for unit in sorted(shipped):
        assert f'"$here/{unit}"' in script, unit
        text = (SYSTEMD / unit).read_text()
        (settings,) = [line.split("=", 2)[2] for line in text.splitlines()
                       if line.startswith("Environment=QINGLONG_SETTINGS=")]
        assert settings.startswith("/etc/qinglong/")
        name = Path(settings).name
        assert (SYSTEMD / name).exists() and name in script, name
