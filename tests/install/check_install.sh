#!/usr/bin/env bash
# cmake --install into a scratch DESTDIR, then each installed file checked by its own validator:
# desktop-file-validate, appstreamcli validate, systemd-analyze verify (no message allowed),
# the icon in every hicolor size, the man page; a second install keeps an edited configuration;
# an install to a user's prefix writes nothing outside it (no /etc, no systemd unit).
#   check_install.sh BUILD_DIR
set -euo pipefail
build=$1
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
DESTDIR=$root cmake --install "$build" --prefix /usr >/dev/null
fail=0
check() { # name command...: fails on a non-zero exit, or on any message unless it is appstreamcli's verdict
    local name=$1 out
    shift
    if ! out=$("$@" 2>&1) || grep -qv -e "^$" -e "Validation was successful" <<<"$out"; then
        echo "FAIL $name: $out"
        fail=1
    else
        echo "ok   $name"
    fi
}
for f in usr/bin/idemdesk usr/share/applications/idemdesk.desktop usr/share/man/man1/idemdesk.1.gz \
         usr/share/icons/hicolor/scalable/apps/idemdesk.svg lib/systemd/system/idemdesk.service \
         etc/idemdesk/config.json usr/share/idemdesk/prometheus/alerts.yml; do
    f=${f/#lib\/systemd/usr\/lib\/systemd}
    [ -e "$root/$f" ] || { echo "FAIL not installed: /$f"; fail=1; }
done
for size in 16 22 24 32 48 64 128 256; do
    png=$root/usr/share/icons/hicolor/${size}x$size/apps/idemdesk.png
    [ "$(file -b "$png" 2>/dev/null | grep -o "$size x $size")" = "$size x $size" ] \
        || { echo "FAIL icon ${size}x$size: $(file -b "$png" 2>&1)"; fail=1; }
done
[ "$(stat -c %a "$root/etc/idemdesk/config.json")" = 600 ] || { echo "FAIL /etc/idemdesk/config.json is not 0600"; fail=1; }
check desktop-file-validate desktop-file-validate "$root/usr/share/applications/idemdesk.desktop"
check "appstreamcli validate" appstreamcli validate --no-net --explain "$root"/usr/share/metainfo/*.metainfo.xml
# The unit as installed, its ExecStart pointed at the binary in the scratch root.
unit=$root/idemdesk.service
sed "s|^ExecStart=/usr/bin/|ExecStart=$root/usr/bin/|" "$root/usr/lib/systemd/system/idemdesk.service" > "$unit"
grep -q "^ExecStart=$root/usr/bin/idemdesk serve --config %d/config.json" "$unit" || { echo "FAIL ExecStart"; fail=1; }
for key in DynamicUser=yes StateDirectory=idemdesk ProtectSystem=strict NoNewPrivileges=yes RestartPreventExitStatus=2 \
           LoadCredential=config.json:/etc/idemdesk/config.json; do
    grep -qx "$key" "$unit" || { echo "FAIL idemdesk.service lacks $key"; fail=1; }
done
check "systemd-analyze verify" systemd-analyze verify --man=no "$unit"
# The service's store is in its StateDirectory (tests/install/check_package.sh serves with this config).
grep -q '"store": "sqlite:/var/lib/idemdesk/' "$root/etc/idemdesk/config.json" || { echo "FAIL config: the store is not in /var/lib/idemdesk"; fail=1; }

# Installed again over an edited configuration: the operator's file stays as it is.
config=$root/etc/idemdesk/config.json
printf '{"store": "sqlite:/var/lib/idemdesk/edited.db"}\n' >"$config"
DESTDIR=$root cmake --install "$build" --prefix /usr >/dev/null
grep -q edited.db "$config" || { echo "FAIL a second install replaced the edited $config"; fail=1; }

# A user's prefix (cmake --install --prefix ~/.local, no root): everything under it, the
# configuration in PREFIX/etc, no systemd unit (systemd reads none there).
user=$(mktemp -d)
trap 'rm -rf "$root" "$user"' EXIT
DESTDIR=$user cmake --install "$build" --prefix /home/someone/.local >/dev/null
outside=$(cd "$user" && find . -mindepth 1 -not -path './home' -not -path './home/someone' -not -path './home/someone/.local*')
[ -z "$outside" ] || { echo "FAIL --prefix ~/.local wrote outside the prefix: $outside"; fail=1; }
[ -f "$user/home/someone/.local/etc/idemdesk/config.json" ] || { echo "FAIL --prefix ~/.local: no etc/idemdesk/config.json under the prefix"; fail=1; }
! find "$user" -name idemdesk.service | grep -q . || { echo "FAIL --prefix ~/.local installed a systemd unit"; fail=1; }
[ $fail -eq 0 ] && echo "ok   second install keeps the configuration; --prefix ~/.local stays in the prefix"
exit $fail
