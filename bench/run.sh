#!/usr/bin/env bash
# ./dev bench: the receiver on each store, driven by wrk in three shapes, side by side with the
# store's own ceiling and the HTTP layer alone, in one run. Prints the table and writes RESULTS.md.
# Expects: BUILD_DIR, IDEM_TEST_REDIS_URL/PORT, IDEM_TEST_POSTGRES_URL/PORT (./dev starts them).
# BASELINE_BIN: another build's idemdesk (e.g. the previous main) run on the Redis rows too, so
# the table shows before and after side by side. BENCH_BACKENDS: which stores (default all).
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${BENCH_SECONDS:-10}
CONNECTIONS=64
BIN="$BUILD_DIR/app/idemdesk"
BASELINE_BIN=${BASELINE_BIN:-}
BACKENDS=${BENCH_BACKENDS:-sqlite redis postgres}
HELPER="$BUILD_DIR/bench/idemdesk_bench"
WORK=$(mktemp -d /tmp/idemdesk-bench.XXXXXX)
# `kill` with no jobs left fails, and under set -e that failure was the script's exit status.
trap 'jobs -p | xargs -r kill 2> /dev/null || true; rm -rf "$WORK"' EXIT
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

# wrk with one of the Lua shapes; prints "req/s p50_ms p99_ms non2xx requests".
run_wrk() {
    local url=$1 shape=$2 out="$WORK/wrk.txt"
    wrk -t2 -c$CONNECTIONS -d${DURATION}s --latency -s "bench/$shape.lua" "$url" > "$out"
    local rps p50 p99 non2xx total
    rps=$(awk '/Requests\/sec/ {print $2}' "$out")
    p50=$(awk '$1 == "50%" {print $2}' "$out")
    p99=$(awk '$1 == "99%" {print $2}' "$out")
    non2xx=$(awk '/Non-2xx/ {print $5}' "$out")
    total=$(awk '/requests in/ {print $1}' "$out")
    echo "$rps $(to_ms "$p50") $(to_ms "$p99") ${non2xx:-0} $total"
}
rcli() { redis-cli -p "$IDEM_TEST_REDIS_PORT" "$@"; }
# Redis's own CPU (user + sys) in µs since it started, and its command time (INFO commandstats).
redis_cpu_us() { rcli INFO cpu | tr -d '\r' | awk -F: '/^used_cpu_(sys|user):/ {t += $2} END {printf "%.0f", t * 1e6}'; }
redis_cmd_us() { rcli INFO commandstats | tr -d '\r' | awk -F'[:=,]' '/^cmdstat_/ {t += $5} END {printf "%.0f", t}'; }
# The commands that took Redis's time since CONFIG RESETSTAT, µs per delivery each.
redis_breakdown() {
    rcli INFO commandstats | tr -d '\r' | awk -F'[:=,]' -v n="$1" '/^cmdstat_/ {sub("cmdstat_", "", $1); if ($5 / n >= 0.5) printf "%s %.1f, ", $1, $5 / n}' | sed 's/, $//'
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

# Redis: the minimal work any idempotent receiver must do per delivery: `SET key NX PX` (the
# claim) then a `SET` of the 1 KB result, each driven by redis-benchmark (50 connections, random
# keys); one delivery costs the time of both. Beside it, the repo's own claim.lua + finish.lua
# run back to back inside one script: what the desk's scripts cost, without the desk.
redis_port=$IDEM_TEST_REDIS_PORT
body=$(head -c 1000 /dev/zero | tr '\0' 'x')
rb() { redis-benchmark -p "$redis_port" -c 50 -n "$1" -r 100000000 -q "${@:2}" | tr '\r' '\n' | grep -oE '[0-9.]+ requests per second' | tail -n 1 | cut -d' ' -f1; }
rcli CONFIG RESETSTAT > /dev/null
cpu0=$(redis_cpu_us)
nx=$(rb 200000 SET "ceil:nx:__rand_int__" '{"status":"processing"}' NX PX 604800000)
res=$(rb 200000 SET "ceil:res:__rand_int__" "$body" PX 604800000)
cpu1=$(redis_cpu_us)
CEILING[redis]=$(awk -v a="$nx" -v b="$res" 'BEGIN { printf "%.0f", 1 / (1 / a + 1 / b) }')
CEILING_REDIS_CPU=$(awk -v d=$((cpu1 - cpu0)) 'BEGIN { printf "%.1f", d / 200000 }')
echo "   Redis alone, SET NX PX + SET of the result (redis-benchmark, 50 connections): ${CEILING[redis]} deliveries/s (SET NX $nx/s, SET $res/s), Redis CPU ${CEILING_REDIS_CPU} µs/delivery"
{
    echo "local CAP = 64"
    cat resources/redis/common.lua
    echo 'local function claim(KEYS, ARGV)'; cat resources/redis/claim.lua; echo 'end'
    echo 'local function finish(KEYS, ARGV)'; cat resources/redis/finish.lua; echo 'end'
    echo "local k = {'ceil:{' .. ARGV[1] .. '}:r', 'ceil:{' .. ARGV[1] .. '}:t'}"
    echo "local claimed = claim(k, {'ceil', 'generic', 'fp', '60000', '604800000', 'RM', 'POST /hooks/ceil\n[]\n' .. ARGV[2]})"
    echo "if claimed[1] ~= 'create' then return claimed[1] end -- a random key drawn twice"
    echo "local done = finish({k[1]}, {fmt(claimed[3]), 'completed', '200', '[]', '{}', ''})"
    echo "if type(done) == 'table' then return done[1] end"
    echo "return done"
} > "$WORK/ceiling.lua"
both_sha=$(rcli -x SCRIPT LOAD < "$WORK/ceiling.lua")
rcli --scan --pattern 'ceil:*' | xargs -r -n 1000 redis-cli -p "$redis_port" DEL > /dev/null
answer=$(rcli EVALSHA "$both_sha" 0 "k:probe" "$body")
[ "$answer" = accept ] || { echo "the Redis script ceiling answered '$answer', not accept"; exit 1; }
cpu0=$(redis_cpu_us)
SCRIPT_CEILING=$(rb 100000 EVALSHA "$both_sha" 0 "k:__rand_int__" "$body" | cut -d. -f1)
cpu1=$(redis_cpu_us)
SCRIPT_CPU=$(awk -v d=$((cpu1 - cpu0)) 'BEGIN { printf "%.1f", d / 100000 }')
echo "   Redis scripts alone (claim.lua + finish.lua in one script, redis-benchmark): $SCRIPT_CEILING claim+complete/s, Redis CPU $SCRIPT_CPU µs/delivery"
rcli --scan --pattern 'ceil:*' | xargs -r -n 1000 redis-cli -p "$redis_port" DEL > /dev/null

# The receiver `bin` (label: which build) on `backend`, one row per shape. For Redis, its CPU per
# delivery is read from Redis itself (INFO cpu), and where its time went from INFO commandstats.
bench_backend() {
    local label=$1 backend=$2 store port pid shape
    shift 2 # the rest: the command that serves, {store} and {listen} filled in
    case $backend in
        sqlite) store="sqlite:$WORK/desk.db" ;;
        redis) store=$IDEM_TEST_REDIS_URL; rcli FLUSHDB > /dev/null ;;
        postgres) store=$IDEM_TEST_POSTGRES_URL ;;
    esac
    port=$(free_port)
    local cmd=("${@//\{store\}/$store}")
    cmd=("${cmd[@]//\{listen\}/127.0.0.1:$port}")
    cmd=("${cmd[@]//\{port\}/$port}")
    "${cmd[@]}" > /dev/null 2> "$WORK/serve.log" & pid=$!
    wait_port "$port" || { cat "$WORK/serve.log"; exit 1; }
    if [ $backend = postgres ] && [ -z "${CEILING[postgres]:-}" ]; then
        # pgbench with the store's claim and complete statements (the schema exists now).
        CEILING[postgres]=$(PGPASSWORD= pgbench -n -h 127.0.0.1 -p "$IDEM_TEST_POSTGRES_PORT" -U idem -c 16 -j 2 -T "$DURATION" \
            -f bench/pg_claim_complete.sql postgres 2>/dev/null | awk '/^tps/ {printf "%.0f", $3}')
        echo "   PostgreSQL alone, pgbench claim + complete (16 clients): ${CEILING[postgres]} tps"
    fi
    echo "== $label on $backend ($store)"
    for shape in unique duplicates bursts; do
        mapfile -t spids < <(store_pids $backend)
        [ $backend = redis ] && { rcli CONFIG RESETSTAT > /dev/null; rbefore=$(redis_cpu_us); }
        before=$(cpu_ticks $pid); sbefore=$(store_ticks "${spids[@]}"); read -r ibefore tbefore < <(idle_ticks)
        read -r rps p50 p99 non2xx total < <(run_wrk "http://127.0.0.1:$port/hooks/generic" "$shape")
        mapfile -t spids < <(store_pids $backend)
        after=$(cpu_ticks $pid); safter=$(store_ticks "${spids[@]}"); read -r iafter tafter < <(idle_ticks)
        cpu_us=$(awk -v t=$((after - before)) -v hz="$TICKS" -v n="$total" 'BEGIN { printf "%.1f", t / hz * 1e6 / n }')
        breakdown=""
        case $backend in
            sqlite) store_us="in-process" ;;
            redis)
                store_us=$(awk -v d=$(($(redis_cpu_us) - rbefore)) -v n="$total" 'BEGIN { printf "%.1f", d / n }')
                breakdown=$(redis_breakdown "$total") ;;
            *) store_us=$(awk -v t=$((safter - sbefore)) -v hz="$TICKS" -v n="$total" 'BEGIN { printf "%.1f", t / hz * 1e6 / n }') ;;
        esac
        idle=$(awk -v i=$((iafter - ibefore)) -v t=$((tafter - tbefore)) 'BEGIN { printf "%.0f%%", t ? 100 * i / t : 0 }')
        rss=$(awk '/VmHWM/ {printf "%.0f", $2 / 1024}' "/proc/$pid/status")
        ratio=$(awk -v r="$rps" -v c="${CEILING[$backend]}" 'BEGIN { printf "%.0f%%", 100 * r / c }')
        printf '   %-10s %9.0f req/s  desk %6s us CPU/delivery  store %6s us CPU/delivery  p50 %6.2f ms  p99 %6.2f ms  peak RSS %4s MB  %s of ceiling  idle %s  (%s answers 409/422)\n' \
            "$shape" "$rps" "$cpu_us" "$store_us" "$p50" "$p99" "$rss" "$ratio" "$idle" "$non2xx"
        [ -n "$breakdown" ] && echo "              Redis commands, µs/delivery: $breakdown"
        ROWS+=("| $label | $backend | $shape | $(printf '%.0f' "$rps") | **$cpu_us** | **$store_us** | $p50 | $p99 | $idle | $rss | ${CEILING[$backend]} | $ratio |")
        [ -n "$breakdown" ] && BREAKDOWN+=("- $label, $shape: $breakdown")
        RPS[$label/$backend/$shape]=$rps
    done
    kill -TERM $pid; wait $pid 2>/dev/null || true
}

declare -A RPS
BREAKDOWN=()
for backend in $BACKENDS; do
    if [ $backend = redis ] && [ -n "$BASELINE_BIN" ]; then
        bench_backend before redis "$BASELINE_BIN" serve --store {store} --listen {listen}
    fi
    bench_backend desk $backend "$BIN" serve --store {store} --listen {listen}
    # The reference the desk is measured against: a Node.js receiver made idempotent the usual way
    # (SET NX, then SET of the result), if node is here (bench/node, `npm ci` once).
    if [ $backend = redis ] && command -v node > /dev/null && [ -f bench/node/package-lock.json ]; then
        if [ -d bench/node/node_modules ] || (cd bench/node && npm ci --silent > /dev/null 2>&1); then
            bench_backend node redis node bench/node/receiver.js {port} "$IDEM_TEST_REDIS_URL"
        else
            echo "== node: npm ci failed, no Node.js reference row"
        fi
    fi
done

echo "== dashboard over one million keys"
QT_QPA_PLATFORM=offscreen "$HELPER" ui > "$WORK/ui.txt" 2>/dev/null
sed 's/^/   /' "$WORK/ui.txt"

# The same on the Redis Cluster (3 masters + 3 replicas), when the bench has one: a million keys
# of layout v3 written straight in (records and index entries as the desk leaves them; fill_ms),
# the window's first page, then the store's own part of a first page and of a count on a
# connected store (no window, no process start), and a whole purge (none expired: its repair pass).
cluster_masters() { for p in ${IDEM_TEST_REDIS_CLUSTER_PORTS//,/ }; do redis-cli -p "$p" role 2> /dev/null | head -n 1 | grep -q master && echo "$p"; done; }
cluster_flush() { for p in $(cluster_masters); do redis-cli -p "$p" FLUSHALL > /dev/null; done; }
: > "$WORK/cluster.txt"
if [ -n "${IDEM_TEST_REDIS_CLUSTER_URL:-}" ] && [ -n "${IDEM_TEST_REDIS_CLUSTER_PORTS:-}" ]; then
    echo "== dashboard over one million keys on the Redis Cluster"
    cluster_flush
    QT_QPA_PLATFORM=offscreen "$HELPER" ui "$IDEM_TEST_REDIS_CLUSTER_URL" > "$WORK/cluster.txt" 2>/dev/null
    "$HELPER" query "$IDEM_TEST_REDIS_CLUSTER_URL" big >> "$WORK/cluster.txt" 2>/dev/null
    cluster_flush # the million holds a few GB across the nodes
    sed 's/^/   /' "$WORK/cluster.txt"
fi

# The window's and `keys list`'s find (type filter and body search) over a million keys on each
# store (BENCH_FIND_KEYS; docs/stores.md#search): the store's own call, median of 5.
FIND_KEYS=${BENCH_FIND_KEYS:-1000000}
: > "$WORK/find.txt"
find_store() {
    local name=$1 url=$2
    echo "== find over $FIND_KEYS keys on $name"
    if "$HELPER" find "$url" "$FIND_KEYS" > "$WORK/find1.txt" 2> "$WORK/find1.err"; then
        sed 's/^/   /' "$WORK/find1.txt"
        sed "s/^/$name: /" "$WORK/find1.txt" >> "$WORK/find.txt"
    else
        echo "   failed: $(tail -n 1 "$WORK/find1.err")"
        echo "$name: failed: $(tail -n 1 "$WORK/find1.err")" >> "$WORK/find.txt"
    fi
}
for backend in $BACKENDS; do
    case $backend in
        sqlite) rm -f "$WORK/find.db"; find_store sqlite "sqlite:$WORK/find.db"; rm -f "$WORK/find.db"* ;;
        redis) rcli FLUSHDB > /dev/null; find_store redis "$IDEM_TEST_REDIS_URL"; rcli FLUSHDB > /dev/null ;;
        postgres) find_store postgres "$IDEM_TEST_POSTGRES_URL"
            psql -q "$IDEM_TEST_POSTGRES_URL" -c "TRUNCATE idem_keys" > /dev/null 2>&1 || true ;;
    esac
done
if [ -n "${IDEM_TEST_REDIS_CLUSTER_URL:-}" ] && [ -n "${IDEM_TEST_REDIS_CLUSTER_PORTS:-}" ]; then
    cluster_flush; find_store redis-cluster "$IDEM_TEST_REDIS_CLUSTER_URL"; cluster_flush
fi

ratios=()
for shape in unique duplicates bursts; do
    for base in before node; do
        [ -n "${RPS[$base/redis/$shape]:-}" ] && [ -n "${RPS[desk/redis/$shape]:-}" ] &&
            ratios+=("$shape: desk $(awk -v a="${RPS[desk/redis/$shape]}" -v b="${RPS[$base/redis/$shape]}" 'BEGIN { printf "%.2f", a / b }')× $base")
    done
done
{
    echo "# Benchmark results"
    echo
    echo "\`./dev bench\` on $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $(date -u +%Y-%m-%d),"
    echo "wrk -t2 -c$CONNECTIONS -d${DURATION}s with 1 KB JSON bodies, load generator on the same machine, built-in processor."
    echo "\"before\" is ${BASELINE_LABEL:-the previous build} (BASELINE_BIN), \"desk\" this build, \"node\" the Node.js reference"
    echo "(bench/node: SET NX PX, then SET of the result), all on the same Redis in the same run."
    echo
    echo "Ceilings measured in the same run: HTTP layer alone ${CEILING[http]} req/s; SQLite alone ${CEILING[sqlite]} claim+complete/s;"
    echo "Redis alone, the minimal work of any receiver (redis-benchmark: SET NX PX, then SET of the 1 KB result) ${CEILING[redis]} deliveries/s"
    echo "at ${CEILING_REDIS_CPU} µs Redis CPU per delivery; the desk's scripts alone (claim.lua + finish.lua in one script) $SCRIPT_CEILING/s"
    echo "at $SCRIPT_CPU µs; PostgreSQL alone (pgbench) ${CEILING[postgres]:-} tps."
    echo
    echo "CPU per delivery (the headline): the desk's process (utime + stime from /proc) and the store's (Redis: INFO cpu;"
    echo "PostgreSQL: its processes from /proc) over the run, divided by the deliveries answered."
    echo
    echo "| build | backend | shape | req/s | desk CPU µs/delivery | store CPU µs/delivery | p50 ms | p99 ms | machine idle | peak RSS MB | store ceiling | ratio |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
    printf '%s\n' "${ROWS[@]}"
    echo
    if [ ${#ratios[@]} -gt 0 ]; then
        echo "Throughput on Redis, this build against the others: $(IFS=';'; echo "${ratios[*]}" | sed 's/;/; /g')."
        echo
    fi
    if [ ${#BREAKDOWN[@]} -gt 0 ]; then
        echo "Where Redis's time went (INFO commandstats, µs per delivery, commands ≥ 0.5 µs):"
        echo
        printf '%s\n' "${BREAKDOWN[@]}"
        echo
    fi
    echo "Dashboard over one million keys (SQLite, offscreen):"
    echo
    sed 's/^/- /' "$WORK/ui.txt"
    if [ -s "$WORK/cluster.txt" ]; then
        echo
        echo "Dashboard over one million keys (Redis Cluster, 3 masters + 3 replicas on loopback, offscreen; one"
        echo "endpoint; list_*_ms and count_ms: the store's own part of a 100-key page and of a count, median of 7):"
        echo
        sed 's/^/- /' "$WORK/cluster.txt"
    fi
    if [ -s "$WORK/find.txt" ]; then
        echo
        echo "Find over $FIND_KEYS keys (\`idemdesk_bench find\`: type filter and body search, the store's own call, median of 5;"
        echo "the window's first answer must stay under 150 ms):"
        echo
        sed 's/^/- /' "$WORK/find.txt"
    fi
} > bench/RESULTS.md
echo "== wrote bench/RESULTS.md"
