#!/usr/bin/env bash
# ./dev bench: the receiver on each store, driven by wrk in three shapes, side by side with the
# store's own ceiling and the HTTP layer alone, in one run. Prints the table and writes RESULTS.md.
# Expects: BUILD_DIR, IDEM_TEST_REDIS_URL/PORT, IDEM_TEST_POSTGRES_URL/PORT (./dev starts them).
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${BENCH_SECONDS:-10}
CONNECTIONS=64
BIN="$BUILD_DIR/app/idemdesk"
HELPER="$BUILD_DIR/bench/idemdesk_bench"
WORK=$(mktemp -d /tmp/idemdesk-bench.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$WORK"' EXIT
TICKS=$(getconf CLK_TCK)

free_port() { local p; while :; do p=$((20000 + RANDOM % 30000)); (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo $p; return; }; done; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# CPU ticks of the store's server processes (Redis; PostgreSQL's postmaster and its backends).
store_ticks() {
    local total=0 p
    for p in "$@"; do [ -r "/proc/$p/stat" ] && total=$((total + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done
    echo $total
}
store_pids() {
    case $1 in
        redis) pgrep -f "redis-server .*:$IDEM_TEST_REDIS_PORT" ;;
        postgres) local pm; pm=$(pgrep -f "postgres -D .* -p $IDEM_TEST_POSTGRES_PORT" | head -n 1); echo "$pm"; pgrep -P "$pm" ;;
    esac
}
# Idle share of the whole machine (all cores) between two readings of /proc/stat.
idle_ticks() { awk '/^cpu / {print $5 + $6, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9}' /proc/stat; }
wait_port() { for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done; return 1; }

# wrk with one of the Lua shapes; prints "req/s p50_ms p99_ms non2xx".
run_wrk() {
    local url=$1 shape=$2 out="$WORK/wrk.txt"
    wrk -t2 -c$CONNECTIONS -d${DURATION}s --latency -s "bench/$shape.lua" "$url" > "$out"
    local rps p50 p99 non2xx
    rps=$(awk '/Requests\/sec/ {print $2}' "$out")
    p50=$(awk '$1 == "50%" {print $2}' "$out")
    p99=$(awk '$1 == "99%" {print $2}' "$out")
    non2xx=$(awk '/Non-2xx/ {print $5}' "$out")
    echo "$rps $(to_ms "$p50") $(to_ms "$p99") ${non2xx:-0}"
}
to_ms() { awk -v v="$1" 'BEGIN { if (v ~ /us$/) printf "%.2f", v/1000; else if (v ~ /ms$/) printf "%.2f", v+0; else if (v ~ /s$/) printf "%.2f", v*1000; else print v }'; }

ROWS=()
declare -A CEILING

echo "== ceilings (the same work without the desk)"
port=$(free_port)
"$HELPER" http "$port" & hp=$!
wait_port "$port"
read -r rps p50 p99 _ < <(run_wrk "http://127.0.0.1:$port/hooks/generic" unique)
kill $hp; wait $hp 2>/dev/null || true
CEILING[http]=$rps
echo "   HTTP layer alone (QTcpServer + llhttp, no store): $rps req/s, p99 $p99 ms"

CEILING[sqlite]=$("$HELPER" sqlite "$WORK/ceiling.db" "$DURATION")
echo "   SQLite alone, claim + complete in a loop (2 connections): ${CEILING[sqlite]} /s"

# Redis: the repo's claim.lua and finish.lua run back to back inside one script (claim a new key,
# complete it with the token it got), driven by redis-benchmark with 50 connections: the store
# doing one delivery's transitions, with one round trip where the desk needs two.
redis_port=$IDEM_TEST_REDIS_PORT
{
    cat resources/redis/common.lua
    echo 'local function claim(ARGV)'; cat resources/redis/claim.lua; echo 'end'
    echo 'local function finish(ARGV)'; cat resources/redis/finish.lua; echo 'end'
    echo 'local claimed = claim(ARGV)'
    echo "return finish({ARGV[1], ARGV[2], tostring(claimed[3]), 'completed', '200', '[]', '{}', '', ARGV[14]})"
} > "$WORK/ceiling.lua"
both_sha=$(redis-cli -p "$redis_port" -x SCRIPT LOAD < "$WORK/ceiling.lua")
body=$(head -c 1000 /dev/zero | tr '\0' 'x')
answer=$(redis-cli -p "$redis_port" EVALSHA "$both_sha" 0 ceil: "k:probe" ceil generic fp 60000 604800000 reprocess reject POST /hooks/ceil '[]' "$body" 64)
[ "$answer" = accept ] || { echo "the Redis ceiling script answered '$answer', not accept"; exit 1; }
CEILING[redis]=$(redis-benchmark -p "$redis_port" -c 50 -n 300000 -r 100000000 -q EVALSHA "$both_sha" 0 ceil: "k:__rand_int__" ceil generic fp 60000 604800000 reprocess reject POST /hooks/ceil '[]' "$body" 64 | tr '\r' '\n' | grep -oE '[0-9.]+ requests per second' | tail -n 1 | cut -d' ' -f1 | cut -d. -f1)
echo "   Redis alone (redis-benchmark, claim.lua + finish.lua in one script, 50 connections): ${CEILING[redis]} claim+complete/s"
redis-cli -p "$redis_port" --scan --pattern 'ceil:*' | xargs -r -n 1000 redis-cli -p "$redis_port" DEL > /dev/null

for backend in sqlite redis postgres; do
    case $backend in
        sqlite) store="sqlite:$WORK/desk.db" ;;
        redis) store=$IDEM_TEST_REDIS_URL ;;
        postgres) store=$IDEM_TEST_POSTGRES_URL ;;
    esac
    port=$(free_port)
    "$BIN" serve --store "$store" --listen "127.0.0.1:$port" > /dev/null 2> "$WORK/serve.log" & pid=$!
    wait_port "$port" || { cat "$WORK/serve.log"; exit 1; }
    if [ $backend = postgres ] && [ -z "${CEILING[postgres]:-}" ]; then
        # pgbench with the store's claim and complete statements (the schema exists now).
        CEILING[postgres]=$(PGPASSWORD= pgbench -n -h 127.0.0.1 -p "$IDEM_TEST_POSTGRES_PORT" -U idem -c 16 -j 2 -T "$DURATION" \
            -f bench/pg_claim_complete.sql postgres 2>/dev/null | awk '/^tps/ {printf "%.0f", $3}')
        echo "   PostgreSQL alone, pgbench claim + complete (16 clients): ${CEILING[postgres]} tps"
    fi
    echo "== $backend ($store)"
    for shape in unique duplicates bursts; do
        mapfile -t spids < <(store_pids $backend)
        before=$(cpu_ticks $pid); sbefore=$(store_ticks "${spids[@]}"); read -r ibefore tbefore < <(idle_ticks)
        read -r rps p50 p99 non2xx < <(run_wrk "http://127.0.0.1:$port/hooks/generic" "$shape")
        mapfile -t spids < <(store_pids $backend)
        after=$(cpu_ticks $pid); safter=$(store_ticks "${spids[@]}"); read -r iafter tafter < <(idle_ticks)
        cpu_us=$(awk -v t=$((after - before)) -v hz="$TICKS" -v r="$rps" -v d="$DURATION" 'BEGIN { printf "%.0f", t / hz * 1e6 / (r * d) }')
        if [ $backend = sqlite ]; then store_us="in-process"; else
            store_us=$(awk -v t=$((safter - sbefore)) -v hz="$TICKS" -v r="$rps" -v d="$DURATION" 'BEGIN { printf "%.0f", t / hz * 1e6 / (r * d) }')
        fi
        idle=$(awk -v i=$((iafter - ibefore)) -v t=$((tafter - tbefore)) 'BEGIN { printf "%.0f%%", t ? 100 * i / t : 0 }')
        rss=$(awk '/VmHWM/ {printf "%.0f", $2 / 1024}' "/proc/$pid/status")
        ratio=$(awk -v r="$rps" -v c="${CEILING[$backend]}" 'BEGIN { printf "%.0f%%", 100 * r / c }')
        printf '   %-10s %9.0f req/s  p50 %6.2f ms  p99 %6.2f ms  %5s us CPU/req (store %s)  peak RSS %4s MB  %s of ceiling  machine idle %s  (%s answers 409/422)\n' \
            "$shape" "$rps" "$p50" "$p99" "$cpu_us" "$store_us" "$rss" "$ratio" "$idle" "$non2xx"
        ROWS+=("| $backend | $shape | $(printf '%.0f' "$rps") | $p50 | $p99 | $cpu_us | $store_us | $idle | $rss | ${CEILING[$backend]} | $ratio |")
    done
    kill -TERM $pid; wait $pid 2>/dev/null || true
done

echo "== dashboard over one million keys"
QT_QPA_PLATFORM=offscreen "$HELPER" ui > "$WORK/ui.txt" 2>/dev/null
sed 's/^/   /' "$WORK/ui.txt"

{
    echo "# Benchmark results"
    echo
    echo "\`./dev bench\` on $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $(date -u +%Y-%m-%d),"
    echo "wrk -t2 -c$CONNECTIONS -d${DURATION}s with 1 KB JSON bodies, load generator on the same machine, built-in processor."
    echo "Ceilings measured in the same run: HTTP layer alone ${CEILING[http]} req/s; SQLite alone ${CEILING[sqlite]} claim+complete/s;"
    echo "Redis alone (redis-benchmark, claim.lua + finish.lua in one script) ${CEILING[redis]} claim+complete/s; PostgreSQL alone (pgbench) ${CEILING[postgres]} tps."
    echo
    echo "| backend | shape | req/s | p50 ms | p99 ms | desk CPU µs/req | store CPU µs/req | machine idle | peak RSS MB | store ceiling | ratio |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|"
    printf '%s\n' "${ROWS[@]}"
    echo
    echo "Dashboard over one million keys (SQLite, offscreen):"
    echo
    sed 's/^/- /' "$WORK/ui.txt"
} > bench/RESULTS.md
echo "== wrote bench/RESULTS.md"
