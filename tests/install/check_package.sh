#!/usr/bin/env bash
# The .deb as ./dev package makes it (CPack), unpacked with dpkg-deb -x: its control fields,
# then its binary run: --version, and `serve` with the packaged config (store and ports moved
# to a scratch directory) answering /readyz and a delivery, its /metrics accepted by
# `promtool check metrics`, and SIGTERM ending it with exit 0.   check_package.sh BUILD_DIR
set -euo pipefail
build=$1
work=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$work"' EXIT
(cd "$build" && cpack -G DEB -B "$work/out" >"$work/cpack.log" 2>&1) || { cat "$work/cpack.log"; exit 1; }
deb=$(ls "$work"/out/idemdesk_*.deb)
depends=$(dpkg-deb -f "$deb" Depends)
for lib in libqt6core6 libhiredis0.14 libpqxx-6.4 libsqlite3-0 libssl3 libprometheus-cpp-core1.0; do
    grep -q "$lib" <<<"$depends" || { echo "Depends lacks $lib (dpkg-shlibdeps): $depends"; exit 1; }
done
dpkg-deb -x "$deb" "$work/root"
bin=$work/root/usr/bin/idemdesk
"$bin" --version | tee "$work/version"
# "idemdesk 0.1.0 (commit abc123456789)", "(commit abc123456789-dirty)" or "(commit unknown)"
head -1 "$work/version" | grep -Eqx "idemdesk [0-9]+\.[0-9]+\.[0-9]+ \(commit ([0-9a-f]{7,40}(-dirty)?|unknown)\)" \
    || { echo "--version: unexpected first line: $(head -1 "$work/version")"; exit 1; }
for lib in Qt hiredis libpqxx SQLite OpenSSL; do
    grep -Eq "^$lib [0-9]" "$work/version" || { echo "--version lacks $lib"; exit 1; }
done

"$bin" serve --config "$work/root/etc/idemdesk/config.json" --store "sqlite:$work/store.db" \
    --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 >"$work/out.log" 2>"$work/err.log" &
pid=$!
for _ in $(seq 1 100); do grep -q "receiving webhooks" "$work/err.log" && break; sleep 0.1; done
hooks=$(grep -o 'receiving webhooks at http://[0-9.:]*' "$work/err.log" | sed 's|.*http://||')
metrics=$(grep -o 'metrics at http://[0-9.:]*' "$work/err.log" | sed 's|.*http://||')
[ -n "$hooks" ] && [ -n "$metrics" ] || { cat "$work/err.log"; exit 1; }
[ "$(curl -s -o /dev/null -w '%{http_code}' "http://$hooks/readyz")" = 200 ]
outcome=$(curl -s -D - -o /dev/null -XPOST -H 'Idempotency-Key: pkg-1' -d '{"a":1}' "http://$hooks/hooks/generic" \
    | tr -d '\r' | sed -n 's/^Idempotency-Outcome: //p')
[ "$outcome" = processed ] || { echo "delivery: outcome '$outcome'"; exit 1; }
curl -s "http://$metrics/metrics" >"$work/metrics.txt"
grep -q '^idemdesk_deliveries_total{endpoint="generic",outcome="processed"} 1$' "$work/metrics.txt"
promtool check metrics <"$work/metrics.txt"
kill -TERM "$pid"
wait "$pid"
pid=
grep -q "stopped" "$work/err.log"
echo "package $(basename "$deb"): $(du -k "$deb" | cut -f1) KB, served and stopped cleanly"
