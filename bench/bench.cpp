// Helpers for ./dev bench (not a test):
//   idemdesk_bench http PORT            the HTTP layer alone: answers 200 at once, no store
//   idemdesk_bench sqlite PATH SECONDS  the embedded store alone: claim + complete in a loop (2
//   threads) idemdesk_bench ui [STORE_URL]       the dashboard over one million keys: first page,
//   RSS, stalls
//                                       (SQLite in a temporary file, or the Redis / Redis Cluster
//                                       of STORE_URL, filled first unless it holds a million keys)
//   idemdesk_bench fill STORE_URL COUNT [ENDPOINTS [EXPIRED_PERCENT]]
//                                       COUNT keys of Redis layout v3 written straight in
//   idemdesk_bench query STORE_URL [ENDPOINT]
//                                       the store's part of a first page (100 keys: all,
//                                       completed, failed, one endpoint) and of a count, median
//                                       ms of 7 on a connected store; then one whole purge
//   idemdesk_bench find STORE_URL [COUNT]
//                                       `keys list --type/--search` on COUNT keys (default a
//                                       million, written straight in unless the store holds
//                                       them): the first page of 100, median ms of 5
#include "engine/storm.h"
#include "http/httpserver.h"
#include "keysmodel.h"
#include "mainwindow.h"
#include "receiver/receiver.h"
#include "store/sqlitestore.h"
#include "store/storefactory.h"
#include "support/serveprocess.h"
#include "util/clock.h"

#include <QApplication>
#include <QElapsedTimer>
#include <QFile>
#include <QProcess>
#include <QSocketNotifier>
#include <QTemporaryDir>
#include <QTest>
#include <QThread>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <functional>
#include <thread>

#include <time.h>

using namespace idem;

namespace {

qint64 rssKb(const char *field = "VmRSS:")
{
    QFile status(QStringLiteral("/proc/self/status"));
    status.open(QIODevice::ReadOnly);
    for (const QByteArray &line : status.readAll().split('\n'))
        if (line.startsWith(field))
            return line.mid(qsizetype(strlen(field))).trimmed().split(' ').first().toLongLong();
    return 0;
}

// The calling thread's CPU time (user + system), µs: what the GUI thread itself spent, apart
// from the time it waited for a core on a busy machine.
qint64 threadCpuUs()
{
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return qint64(t.tv_sec) * 1'000'000 + t.tv_nsec / 1000;
}

int httpOnly(int argc, char **argv)
{
    QCoreApplication app(argc, argv);
    const quint16 port = quint16(QByteArray(argv[2]).toUInt());
    HttpServer server({}, [](HttpRequest, Responder responder) {
        HttpResponse r = HttpResponse::json(200, {{QStringLiteral("ok"), true}});
        r.setHeader("Idempotency-Outcome", "processed");
        responder.send(r);
    });
    if (!server.listen(QHostAddress::LocalHost, port))
        return 1;
    std::signal(SIGTERM, [](int) { std::_Exit(0); });
    return app.exec();
}

int sqliteLoop(const char *path, int seconds)
{
    std::atomic<qint64> ops{0};
    std::atomic<bool> stop{false};
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t) {
        threads.emplace_back([&, t] {
            auto store = SqliteStore::open(QString::fromLocal8Bit(path));
            if (!store)
                return;
            for (qint64 i = 0; !stop; ++i) {
                ClaimRequest c;
                c.key = u"bench:%1-%2-%3"_qs.arg(t).arg(i).arg(wallMs());
                c.endpoint = u"bench"_qs;
                c.provider = u"generic"_qs;
                c.fingerprint = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
                c.request = {"POST", "/hooks/bench", {{"Content-Type", "application/json"}}, QByteArray(1000, 'x')};
                auto claimed = (*store)->claim(c);
                FinishRequest f;
                f.key = c.key;
                f.token = claimed ? claimed->record.token : 0;
                f.result = {200, {{"Content-Type", "application/json"}}, "{\"processed\":true}"};
                if ((*store)->finish(f))
                    ++ops;
            }
        });
    }
    QThread::sleep(seconds);
    stop = true;
    for (auto &t : threads)
        t.join();
    std::printf("%.0f\n", double(ops.load()) / seconds);
    return 0;
}

// Bodies of 100 bytes, not SQLite's 1000: a Redis listing reads only the meta line and the
// error of each record (HMGET m e), never the request or the result, and a million records with
// their replicas fill in half the time.
int fillRedis(const QString &url, int count, int endpoints, int expiredPercent)
{
    QElapsedTimer took;
    took.start();
    const QString failure =
        test::generateRedisKeys(url, count, endpoints, expiredPercent, QByteArray(100, 'x'));
    if (!failure.isEmpty()) {
        std::fprintf(stderr, "fill: %s\n", qPrintable(failure));
        return 1;
    }
    std::printf("fill_ms %lld\n", static_cast<long long>(took.elapsed()));
    return 0;
}

int queryBench(const QString &url, const QString &endpoint)
{
    auto pool = openStorePool(url, 1);
    if (!pool) {
        std::fprintf(stderr, "query: %s\n", qPrintable(pool.error().message));
        return 1;
    }
    StorePool &store = **pool;
    (void)store.run<qint64>([](IdempotencyStore &s) { return s.clockMs(); }); // connected
    auto medianMs = [&](const std::function<bool(IdempotencyStore &)> &job) {
        std::vector<double> ms;
        for (int i = 0; i < 7; ++i) {
            QElapsedTimer took;
            took.start();
            const auto ok =
                store.run<bool>([&](IdempotencyStore &s) -> Result<bool> { return job(s); });
            if (!ok || !*ok)
                return -1.0;
            ms.push_back(double(took.nsecsElapsed()) / 1e6);
        }
        std::sort(ms.begin(), ms.end());
        return ms[ms.size() / 2];
    };
    auto page = [](std::optional<KeyState> state, const QString &ep) {
        return [state, ep](IdempotencyStore &s) {
            KeyQuery q;
            q.state = state;
            q.endpoint = ep;
            q.limit = 100;
            auto keys = s.listKeys(q);
            return keys && keys->size() == 100;
        };
    };
    std::printf("list_all_ms %.1f\n", medianMs(page(std::nullopt, {})));
    std::printf("list_completed_ms %.1f\n", medianMs(page(KeyState::Completed, {})));
    std::printf("list_failed_ms %.1f\n", medianMs(page(KeyState::Failed, {})));
    if (!endpoint.isEmpty())
        std::printf("list_endpoint_ms %.1f\n", medianMs(page(std::nullopt, endpoint)));
    std::printf("count_ms %.1f\n",
                medianMs([](IdempotencyStore &s) { return s.countKeys({}).ok(); }));
    QElapsedTimer took;
    took.start();
    auto purged = store.run<qint64>([](IdempotencyStore &s) { return s.purgeExpired(); });
    std::printf("purge_ms %lld\npurged %lld\n", static_cast<long long>(took.elapsed()),
                static_cast<long long>(purged ? *purged : -1));
    return 0;
}

int uiBench(int argc, char **argv, const QString &storeUrl)
{
    QApplication app(argc, argv);
    QTemporaryDir dir;
    QString url = storeUrl;
    if (url.isEmpty()) {
        url = u"sqlite:"_qs + dir.filePath(u"million.db"_qs);
        test::generateSqliteKeys(dir.filePath(u"million.db"_qs), 1'000'000, QByteArray(1000, 'x'));
    } else {
        // Filled unless it already holds the million (a run on a store filled before).
        auto pool = openStorePool(url);
        if (!pool) {
            std::fprintf(stderr, "ui: %s\n", qPrintable(pool.error().message));
            return 1;
        }
        auto counts =
            (*pool)->run<StateCounts>([](IdempotencyStore &s) { return s.countKeys({}); });
        if ((!counts || counts->total() < 1'000'000) && fillRedis(url, 1'000'000, 1, 0) != 0)
            return 1;
    }

    auto config = *Config::parse("{\"endpoints\": [{\"name\": \"big\", \"simulate\": {\"delay_ms\": 5}}]}", u"bench"_qs);
    auto pool = *openStorePool(url);
    Receiver receiver(config, pool);
    ListenAddress any;
    any.port = 0;
    const quint16 port = receiver.start(any)->port;

    QElapsedTimer shown;
    shown.start();
    const qint64 cpuBefore = threadCpuUs();
    MainWindow window(DeskSession{config, url, {}, *openStorePool(url, 0, PoolUse::Window), &receiver}); // as `idemdesk gui` does
    window.show();
    (void)QTest::qWaitFor([&] { return window.keys()->rowCount() >= 200; }, 60000);
    const qint64 firstPageMs = shown.elapsed();
    const qint64 firstPageCpuMs = (threadCpuUs() - cpuBefore) / 1000;
    (void)QTest::qWaitFor([&] { return window.keys()->counts().total() >= 1'000'000; }, 60000);

    // The GUI event loop during a storm: the longest gap between 5 ms ticks.
    qint64 worstGapMs = 0;
    QElapsedTimer gap;
    gap.start();
    QTimer tick;
    QObject::connect(&tick, &QTimer::timeout, &tick, [&] {
        worstGapMs = std::max(worstGapMs, gap.restart());
    });
    tick.start(5);
    std::atomic<bool> done{false};
    StormReport report;
    std::thread storm([&] {
        StormPlan plan;
        plan.copies = 64;
        plan.concurrency = 64;
        plan.keys = 100;
        plan.port = port;
        report = runStorm(plan, *config.endpoint(u"big"));
        done = true;
    });
    (void)QTest::qWaitFor([&] { return done.load(); }, 120000);
    storm.join();
    QTest::qWait(1500); // the dashboard catches up with the storm
    std::printf("first_page_ms %lld\nfirst_page_gui_cpu_ms %lld\nrss_mb %lld\npeak_rss_mb "
                "%lld\nworst_gui_stall_ms %lld\nstorm_exactly_once %d\n",
                static_cast<long long>(firstPageMs), static_cast<long long>(firstPageCpuMs),
                static_cast<long long>(rssKb() / 1024),
                static_cast<long long>(rssKb("VmHWM:") / 1024), static_cast<long long>(worstGapMs),
                report.exactlyOnce() ? 1 : 0);
    return 0;
}

// Key i of the find benchmark: a Stripe-like body of ~600 bytes, one of ten types, and the
// customer "acme" in one key of a hundred (i % 100 == 0: type 0).
void findBenchKey(int i, QByteArray &body, QByteArray &type)
{
    static const char *const kTypes[] = {
        "payment_intent.succeeded", "invoice.paid",      "charge.refunded",
        "customer.created",         "invoice.finalized", "checkout.session.completed",
        "payment_intent.created",   "charge.succeeded",  "customer.subscription.updated",
        "invoice.upcoming"};
    type = kTypes[i % 10];
    const QByteArray customer =
        i % 100 == 0 ? QByteArray("ACME Corp") : "globex-" + QByteArray::number(i % 997);
    body = "{\"id\":\"evt_" + QByteArray::number(i) + "\",\"object\":\"event\",\"type\":\"" + type +
           "\",\"livemode\":false,\"data\":{\"object\":{\"id\":\"pi_" + QByteArray::number(i * 7) +
           "\",\"amount\":" + QByteArray::number(i % 50000) +
           ",\"currency\":\"eur\",\"customer_name\":\"" + customer + "\",\"description\":\"" +
           QByteArray(420, 'x') + "\"}}}";
}

// PostgreSQL: the same keys as findBenchKey(), by one INSERT … SELECT in the server.
bool fillPostgres(const QString &url, int count)
{
    const QByteArray sql =
        "INSERT INTO idem_keys (key, endpoint, provider, state, fingerprint, token, attempts,"
        " created_ms, updated_ms, lease_until_ms, expires_at_ms, req_method, req_path, req_body,"
        " res_status, res_body, type)"
        " SELECT 'big:evt_' || i, 'big', 'generic', CASE WHEN i % 4 = 3 THEN 'failed' ELSE"
        " 'completed' END, 'f', nextval('idem_tokens'), 1, n - " +
        QByteArray::number(count) + " + i, n - " + QByteArray::number(count) +
        " + i, 0, n + 86400000, 'POST', '/hooks/big',"
        " convert_to('{\"id\":\"evt_' || i || '\",\"object\":\"event\",\"type\":\"' || t ||"
        " '\",\"livemode\":false,\"data\":{\"object\":{\"id\":\"pi_' || i * 7 || '\",\"amount\":' "
        "||"
        " i % 50000 || ',\"currency\":\"eur\",\"customer_name\":\"' || CASE WHEN i % 100 = 0 THEN"
        " 'ACME Corp' ELSE 'globex-' || i % 997 END || '\",\"description\":\"' || repeat('x', 420)"
        " || '\"}}}', 'UTF8'), 200, '{\"ok\":true}', t"
        " FROM (SELECT i, (ARRAY['payment_intent.succeeded', 'invoice.paid', 'charge.refunded',"
        " 'customer.created', 'invoice.finalized', 'checkout.session.completed',"
        " 'payment_intent.created', 'charge.succeeded', 'customer.subscription.updated',"
        " 'invoice.upcoming'])[i % 10 + 1] AS t, (extract(epoch from clock_timestamp()) * "
        "1000)::bigint"
        " AS n FROM generate_series(0, " +
        QByteArray::number(count - 1) +
        ") AS i) AS g;"
        " ANALYZE idem_keys;";
    QProcess psql;
    psql.start(u"psql"_qs, {u"-q"_qs, u"-v"_qs, u"ON_ERROR_STOP=1"_qs, u"-d"_qs, url, u"-c"_qs,
                            QString::fromUtf8(sql)});
    psql.waitForFinished(-1);
    if (psql.exitCode() != 0)
        std::fprintf(stderr, "fill: %s\n", psql.readAllStandardError().constData());
    return psql.exitCode() == 0;
}

// What one call of the window's find may spend (KeysModel::kFindBudgetMs).
constexpr int kWindowBudgetMs = 150;

int findBench(const QString &url, int count)
{
    QElapsedTimer took;
    took.start();
    auto pool = openStorePool(url, 1);
    if (!pool) {
        std::fprintf(stderr, "find: %s\n", qPrintable(pool.error().message));
        return 1;
    }
    StorePool &store = **pool;
    auto counts = store.run<StateCounts>([](IdempotencyStore &s) { return s.countKeys({}); });
    if (!counts) {
        std::fprintf(stderr, "find: %s\n", qPrintable(counts.error().message));
        return 1;
    }
    if (counts->total() < count) {
        bool filled = true;
        if (url.startsWith(u"sqlite:"))
            test::generateSqliteKeys(url.mid(7), count, {}, findBenchKey);
        else if (url.startsWith(u"redis")) {
            const QString failure = test::generateRedisKeys(url, count, 1, 0, {}, findBenchKey);
            if (!failure.isEmpty())
                std::fprintf(stderr, "fill: %s\n", qPrintable(failure));
            filled = failure.isEmpty();
        } else
            filled = fillPostgres(url, count);
        if (!filled)
            return 1;
        std::printf("fill_ms %lld\n", static_cast<long long>(took.elapsed()));
    }
    auto medianMs = [&](KeyQuery q, int runs, qint64 *scanned, int *found) {
        std::vector<double> ms;
        for (int i = 0; i < runs; ++i) {
            QElapsedTimer t;
            t.start();
            auto page = store.run<KeyPage>([&](IdempotencyStore &s) { return s.findKeys(q); });
            if (!page) {
                std::fprintf(stderr, "find: %s\n", qPrintable(page.error().message));
                return -1.0;
            }
            ms.push_back(double(t.nsecsElapsed()) / 1e6);
            *scanned = page->scanned;
            *found = int(page->records.size());
        }
        std::sort(ms.begin(), ms.end());
        return ms[ms.size() / 2];
    };
    auto report = [&](const char *name, const QString &type, const QString &search, int budget,
                      int runs) {
        KeyQuery q;
        q.type = type;
        q.search = search;
        q.limit = 100;
        q.budgetMs = budget;
        qint64 scanned = 0;
        int found = 0;
        const double ms = medianMs(q, runs, &scanned, &found);
        std::printf("%s_ms %.1f (found %d, looked at %lld)\n", name, ms, found,
                    static_cast<long long>(scanned));
    };
    report("type_first_page", u"invoice.paid"_qs, {}, 0, 5);
    report("search_1pct_first_page", {}, u"acme"_qs, 0, 5);
    report("search_1pct_window_call", {}, u"acme"_qs, kWindowBudgetMs, 5);
    report("type_and_search_first_page", u"payment_intent.succeeded"_qs, u"acme"_qs, 0, 5);
    report("search_absent_window_call", {}, u"initech"_qs, kWindowBudgetMs, 5);
    report("search_absent_whole_store", {}, u"initech"_qs, 0, 1);
    return 0;
}

} // namespace

int main(int argc, char **argv)
{
    const QByteArray mode = argc > 1 ? argv[1] : "";
    if (mode == "http" && argc == 3)
        return httpOnly(argc, argv);
    if (mode == "sqlite" && argc == 4)
        return sqliteLoop(argv[2], QByteArray(argv[3]).toInt());
    if (mode == "ui" && argc <= 3)
        return uiBench(argc, argv, argc == 3 ? QString::fromLocal8Bit(argv[2]) : QString());
    if (mode == "query" && (argc == 3 || argc == 4))
        return queryBench(QString::fromLocal8Bit(argv[2]),
                          argc == 4 ? QString::fromLocal8Bit(argv[3]) : QString());
    if (mode == "find" && (argc == 3 || argc == 4))
        return findBench(QString::fromLocal8Bit(argv[2]),
                         argc == 4 ? QByteArray(argv[3]).toInt() : 1'000'000);
    if (mode == "fill" && argc >= 4 && argc <= 6)
        return fillRedis(QString::fromLocal8Bit(argv[2]), QByteArray(argv[3]).toInt(),
                         argc > 4 ? QByteArray(argv[4]).toInt() : 1,
                         argc > 5 ? QByteArray(argv[5]).toInt() : 0);
    std::fprintf(
        stderr,
        "usage: idemdesk_bench http PORT | sqlite PATH SECONDS | ui [STORE_URL]"
        " | fill STORE_URL COUNT [ENDPOINTS [EXPIRED_PERCENT]] | query STORE_URL [ENDPOINT]\n");
    return 2;
}
