#!/usr/bin/env bash
# The .deb's maintainer scripts (resources/debian) run with deb-systemd-helper,
# deb-systemd-invoke, systemctl and rm replaced by stubs that log their arguments: what each
# dpkg action asks of them, as dh_installsystemd --no-enable --restart-after-upgrade would.
# (/run/systemd/system is the host's: where systemd runs, its branch is taken too.)
#   check_maintscripts.sh RESOURCES_DEBIAN_DIR
set -euo pipefail
dir=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/bin"
for tool in deb-systemd-helper deb-systemd-invoke systemctl rm; do
    cat >"$work/bin/$tool" <<STUB
#!/bin/sh
echo "$tool \$*" >>"$work/calls"
case "$tool \$*" in
    "deb-systemd-helper debian-installed"*) [ -n "\${STUB_INSTALLED:-}" ] ;;
    "deb-systemd-helper --quiet was-enabled"*) [ -n "\${STUB_ENABLED:-}" ] ;;
    "systemctl is-active"*) [ -n "\${STUB_ACTIVE:-}" ] ;;
esac
STUB
    chmod +x "$work/bin/$tool"
done
fail=0
systemd=no
[ -d /run/systemd/system ] && systemd=yes
# run NAME SCRIPT ARGS... -- EXPECTED CALL LINES (each must appear) ! UNEXPECTED (none may)
run() {
    local name=$1 script=$2
    shift 2
    local args=() expected=() unexpected=() mode=args
    for a in "$@"; do
        case "$mode:$a" in
            *:--) mode=expected ;;
            *:!) mode=unexpected ;;
            args:*) args+=("$a") ;;
            expected:*) expected+=("$a") ;;
            unexpected:*) unexpected+=("$a") ;;
        esac
    done
    local before=$fail
    : >"$work/calls"
    if ! PATH="$work/bin:$PATH" sh -e "$dir/$script" "${args[@]}" 2>"$work/err"; then
        echo "FAIL $name: $script ${args[*]} exited non-zero: $(cat "$work/err")"
        fail=1
        return
    fi
    for e in "${expected[@]}"; do
        grep -qxF -- "$e" "$work/calls" || { echo "FAIL $name: no '$e' in: $(tr '\n' ';' <"$work/calls")"; fail=1; }
    done
    for u in "${unexpected[@]}"; do
        ! grep -qF -- "$u" "$work/calls" || { echo "FAIL $name: '$u' in: $(tr '\n' ';' <"$work/calls")"; fail=1; }
    done
    if [ $fail -eq "$before" ]; then echo "ok   $name"; fi
}
for s in postinst prerm postrm; do sh -n "$dir/$s" || { echo "FAIL $s: syntax"; fail=1; }; done

# A fresh install: state recorded, the unit neither enabled nor started.
run "install" postinst configure -- "deb-systemd-helper update-state idemdesk.service" \
    ! "deb-systemd-helper enable" "deb-systemd-invoke"
# An upgrade of an enabled service: enabled again, restarted only if it runs (where systemd runs).
upgrade_expect=("deb-systemd-helper enable idemdesk.service")
[ $systemd = yes ] && upgrade_expect+=("deb-systemd-invoke try-restart idemdesk.service")
STUB_INSTALLED=1 STUB_ENABLED=1 run "upgrade" postinst configure 0.1.0 -- "${upgrade_expect[@]}" ! "deb-systemd-invoke start" "deb-systemd-invoke restart"
# An upgrade leaves it running (postinst restarts it); removal stops it where systemd runs.
run "prerm upgrade" prerm upgrade 0.1.1 -- ! "deb-systemd-invoke"
if [ $systemd = yes ]; then
    run "prerm remove" prerm remove -- "deb-systemd-invoke stop idemdesk.service"
else
    run "prerm remove (no systemd)" prerm remove -- ! "deb-systemd-invoke"
fi
# Remove keeps the store and masks the unit; purge drops the enable symlinks, then the store.
run "remove" postrm remove -- "deb-systemd-helper mask idemdesk.service" ! "rm "
run "purge" postrm purge -- "deb-systemd-helper purge idemdesk.service" \
    "deb-systemd-helper unmask idemdesk.service" "rm -rf /var/lib/private/idemdesk /var/lib/idemdesk"
if [ $systemd = yes ]; then
    STUB_ACTIVE=1 run "purge while running" postrm purge -- "deb-systemd-helper purge idemdesk.service" ! "rm "
fi
# Without init-system-helpers (a minimal chroot): nothing fails.
rm "$work/bin/deb-systemd-helper" "$work/bin/deb-systemd-invoke"
PATH="$work/bin:/usr/bin:/bin"
if command -v deb-systemd-helper >/dev/null; then
    echo "skip without init-system-helpers: it is installed on this machine"
else
    run "install without helpers" postinst configure --
    run "purge without helpers" postrm purge -- "rm -rf /var/lib/private/idemdesk /var/lib/idemdesk"
fi
exit $fail
