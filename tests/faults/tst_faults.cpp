// The fault-injection suite (docs/guarantees.md#the-fault-suite): exactly once under faults, on one
// store per run (`tst_faults sqlite|redis|postgres|cluster`).
//
// Two `idemdesk serve` share the store; the second runs with its clock 90 s ahead (libfaketime).
// A driver sends each of 150 keys three times at once and retries like a webhook sender, while a
// schedule injects faults: the store link delayed, blackholed, reset (a proxy per desk), the store
// server stopped (SIGSTOP), each desk killed (SIGKILL) and restarted; the downstream fails,
// hangs or trickles the first run of some keys. The downstream records every run; the checker
// (checker.h) holds that history, the senders' answers and the store's records to the promises.
#include "faults/checker.h"
#include "faults/driver.h"
#include "faults/faultstore.h"
#include "store/storefactory.h"
#include "support/recordingdownstream.h"
#include "support/serveprocess.h"
#include "util/clock.h"

#include <QDir>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QProcess>
#include <QTemporaryDir>
#include <QTest>

#include <csignal>

using namespace idem;
using namespace idem::test;

namespace {

constexpr int kKeys = 150;
constexpr int kCopies = 3;
// A lease long enough for a finish to outlast a store fault longer than the desk's 3 s Redis
// command timeout (so the finish meets an error, and must be retried), yet legal: at least the
// forward timeout plus 2 s.
constexpr int kLeaseSeconds = 6;
constexpr int kForwardTimeoutSeconds = 1;
constexpr int kSkewSeconds = 90;
constexpr int kSpreadMs = 22'000;  // the keys' first deliveries, one after the other
constexpr int kGiveUpMs = 40'000;  // a sender's patience
constexpr int kProxyDelayMs = 150; // each way, per chunk
const QString kEndpoint = QStringLiteral("faults");

FaultStore::Kind g_kind = FaultStore::Kind::Sqlite;

qint64 nowMs()
{
    return monotonicUs() / 1000;
}

// The first run of some keys misbehaves: every 10th fails (500), every 10th hangs past the
// forward timeout, every 10th trickles its answer (4 bytes every 500 ms: never silent for a
// whole second, but ~9 s long, past the lease). Every other run answers 200 after 100-300 ms of
// "work", long enough that copies arrive while it runs.
RunPlan planRun(const QByteArray &key, int earlierRuns)
{
    const int index = key.mid(key.lastIndexOf(":k") + 2).toInt();
    if (earlierRuns == 0) {
        switch (index % 10) {
        case 3:
            return {RunPlan::Kind::Answer, 500, 50};
        case 6:
            return {RunPlan::Kind::Answer, 200, kForwardTimeoutSeconds * 1000 + 1500};
        case 9:
            return {RunPlan::Kind::Trickle, 200, 500};
        }
    }
    return {RunPlan::Kind::Answer, 200, 100 + (index * 37) % 200};
}

enum class Fault { ProxyDelay, ProxyBlackhole, ProxyReset, StoreStop, DeskKill };

// One step of the schedule: at `atMs` after the driver started, for `durationMs`, on desk
// `slot` (0: a, 1: b, -1: both) or on the store.
struct ScheduledFault
{
    int atMs;
    Fault fault;
    int slot;
    int durationMs;
};

// One fault at a time. The store faults last 3.5 s: longer than the desk's Redis command timeout
// (3 s), so claims and finishes meet errors and in-doubt outcomes, and shorter than a lease minus
// a run, so a finish retried while its lease lasts gets through.
// clang-format off
const QList<ScheduledFault> kServerSchedule = {
    {2'000,  Fault::ProxyDelay,     -1, 3'000},
    {6'000,  Fault::DeskKill,        0, 0},
    {8'500,  Fault::ProxyBlackhole,  0, 3'500},
    {13'000, Fault::StoreStop,      -1, 3'500},
    {18'000, Fault::ProxyReset,      1, 1'500},
    {21'000, Fault::ProxyReset,     -1, 1'000},
    {23'000, Fault::DeskKill,        1, 0},
};
// One master paused: first under the cluster's 2 s node timeout (its slots wait), then past it
// (a replica takes its slots over; it comes back as a replica).
const QList<ScheduledFault> kClusterSchedule = {
    {2'000,  Fault::StoreStop,      -1, 1'500},
    {6'000,  Fault::DeskKill,        0, 0},
    {11'000, Fault::StoreStop,      -1, 5'000},
    {23'000, Fault::DeskKill,        1, 0},
};
const QList<ScheduledFault> kSqliteSchedule = {
    {6'000,  Fault::DeskKill, 0, 0},
    {15'000, Fault::DeskKill, 1, 0},
};
// clang-format on

QString slotName(int slot)
{
    return slot < 0    ? QStringLiteral("a, b")
           : slot == 0 ? QStringLiteral("a")
                       : QStringLiteral("b");
}

// The two desk instances, a and b, restarted under a new name after a kill (a1, a2, ...).
// b's clock is kSkewSeconds ahead: a wrapper script starts it under libfaketime.
class Desks
{
public:
    Desks(FaultStore &store, RecordingDownstream &downstream, QString dir)
        : m_store(store), m_downstream(downstream), m_dir(std::move(dir))
    {}

    ~Desks() { stop(); }

    const Driver::Ports &ports() const { return m_ports; }
    QString instance(int slot) const { return m_instance[size_t(slot)]; }

    // Starts the next generation of `slot`; false (with `error`) when it did not start.
    bool start(int slot, QString &error)
    {
        m_generation[size_t(slot)] += 1;
        const QString name =
            QString(QChar(u'a' + slot)) + QString::number(m_generation[size_t(slot)]);
        const QString config = QDir(m_dir).filePath(name + QStringLiteral(".json"));
        QFile file(config);
        if (!file.open(QIODevice::WriteOnly)) {
            error = file.errorString();
            return false;
        }
        const QJsonObject endpoint{
            {QStringLiteral("name"), kEndpoint},
            {QStringLiteral("provider"), QStringLiteral("generic")},
            {QStringLiteral("forward_to"), m_downstream.url(name).toString()}};
        const QJsonObject defaults{
            {QStringLiteral("lease_seconds"), kLeaseSeconds},
            {QStringLiteral("forward_timeout_seconds"), kForwardTimeoutSeconds},
            {QStringLiteral("ttl_seconds"), 3600}};
        file.write(QJsonDocument(QJsonObject{{QStringLiteral("store"), m_store.deskUrl(slot)},
                                             {QStringLiteral("defaults"), defaults},
                                             {QStringLiteral("endpoints"), QJsonArray{endpoint}}})
                       .toJson());
        file.close();
        QString binary = QStringLiteral(IDEMDESK_BIN);
        // SQLite's clock is this machine's: two processes on one machine never disagree on it.
        if (slot == 1 && m_store.hasServer() && !skewedBinary(binary, error))
            return false;
        quint16 port = 0;
        QByteArray stderrText;
        m_process[size_t(slot)] =
            startServe(binary, {QStringLiteral("--config"), config}, port, &stderrText);
        if (!port) {
            error = QStringLiteral("%1 did not start: %2")
                        .arg(name, QString::fromLocal8Bit(stderrText));
            return false;
        }
        m_instance[size_t(slot)] = name;
        m_ports[size_t(slot)] = port;
        return true;
    }

    void kill(int slot)
    {
        QProcess *process = m_process[size_t(slot)].get();
        ::kill(pid_t(process->processId()), SIGKILL);
        process->waitForFinished(5000);
    }

    // Desks that exited although nobody killed them: their names and last words.
    QStringList crashed() const
    {
        QStringList out;
        for (int slot = 0; slot < 2; ++slot)
            if (QProcess *p = m_process[size_t(slot)].get();
                p && p->state() == QProcess::NotRunning)
                out << QStringLiteral("%1 exited (%2): %3")
                           .arg(instance(slot))
                           .arg(p->exitCode())
                           .arg(QString::fromLocal8Bit(p->readAllStandardError().right(2000)));
        return out;
    }

    // SIGTERM: each desk finishes what it has in flight and exits.
    void stop()
    {
        for (auto &process : m_process)
            if (process && process->state() != QProcess::NotRunning)
                ::kill(pid_t(process->processId()), SIGTERM);
        for (auto &process : m_process)
            if (process && !process->waitForFinished(15'000))
                process->kill();
    }

private:
    // A script that runs the desk with its clock kSkewSeconds ahead: exec keeps the pid, so a
    // SIGKILL reaches the desk itself.
    bool skewedBinary(QString &binary, QString &error) const
    {
        QString library;
        for (const QString &dir :
             QDir(QStringLiteral("/usr/lib")).entryList(QDir::Dirs | QDir::NoDotAndDotDot))
            if (QFile::exists(QStringLiteral("/usr/lib/%1/faketime/libfaketime.so.1").arg(dir)))
                library = QStringLiteral("/usr/lib/%1/faketime/libfaketime.so.1").arg(dir);
        if (library.isEmpty()) {
            error = QStringLiteral(
                "libfaketime is not installed (Debian package faketime; ./dev installs it)");
            return false;
        }
        binary = QDir(m_dir).filePath(QStringLiteral("idemdesk-skewed.sh"));
        QFile script(binary);
        if (!script.open(QIODevice::WriteOnly)) {
            error = script.errorString();
            return false;
        }
        script.write(QStringLiteral("#!/bin/sh\nexport LD_PRELOAD=%1 FAKETIME=+%2s "
                                    "FAKETIME_DONT_FAKE_MONOTONIC=1\nexec %3 \"$@\"\n")
                         .arg(library)
                         .arg(kSkewSeconds)
                         .arg(QStringLiteral(IDEMDESK_BIN))
                         .toUtf8());
        script.close();
        script.setPermissions(script.permissions() | QFileDevice::ExeOwner);
        return true;
    }

    FaultStore &m_store;
    RecordingDownstream &m_downstream;
    QString m_dir;
    Driver::Ports m_ports{};
    std::array<int, 2> m_generation{0, 0};
    std::array<QString, 2> m_instance;
    std::array<std::unique_ptr<QProcess>, 2> m_process;
};

// Waits, handling events (the desks' output), until the monotonic time `untilMs`.
void waitUntil(qint64 untilMs)
{
    for (qint64 left = untilMs - nowMs(); left > 0; left = untilMs - nowMs())
        QTest::qWait(int(std::min<qint64>(left, 100)));
}

// The store's record of each key. The suite's one direct call into the store API: 150
// `idemdesk keys show` processes would cost more than the rest of the run on two cores.
QString readStore(const QString &storeUrl, int keys, QHash<QString, StoredKey> &stored)
{
    auto pool = openStorePool(storeUrl, 1);
    if (!pool)
        return pool.error().message;
    for (int k = 0; k < keys; ++k) {
        const QString key = kEndpoint + u':' + QString::fromLatin1(Driver::key(k));
        auto record = (*pool)->run<std::optional<KeyRecord>>(
            [&](IdempotencyStore &s) { return s.key(key); });
        if (!record)
            return record.error().message;
        StoredKey &entry = stored[key];
        entry.found = record->has_value();
        if (!entry.found)
            continue;
        entry.state = toString((*record)->state);
        entry.token = (*record)->token;
        entry.resultStatus = (*record)->result.status;
        entry.resultBody = (*record)->result.body;
    }
    return {};
}

} // namespace

class TestFaults : public QObject
{
    Q_OBJECT

private Q_SLOTS:
    void exactlyOnceUnderFaults()
    {
        const qint64 setupMs = nowMs();
        QTemporaryDir dir;
        QVERIFY(dir.isValid());
        QString error;
        std::unique_ptr<FaultStore> store = FaultStore::start(g_kind, dir.path(), error);
        QVERIFY2(store, qPrintable(error));
        RecordingDownstream downstream(planRun);
        Desks desks(*store, downstream, dir.path());
        QVERIFY2(desks.start(0, error), qPrintable(error));
        QVERIFY2(desks.start(1, error), qPrintable(error));

        FaultHistory history;
        history.store = store->name();
        history.endpoint = kEndpoint;
        history.keys = kKeys;
        history.originMs = nowMs();
        history.leaseMs = kLeaseSeconds * 1000;
        history.forwardTimeoutMs = kForwardTimeoutSeconds * 1000;
        history.faults.append({QStringLiteral("clock skew"),
                               QStringLiteral("b +%1 s").arg(kSkewSeconds), history.originMs, 0});

        Driver::Options options;
        options.path = "/hooks/" + kEndpoint.toUtf8();
        options.keys = kKeys;
        options.copies = kCopies;
        options.spreadMs = kSpreadMs;
        options.giveUpMs = kGiveUpMs;
        Driver driver(options, desks.ports());
        driver.start();

        const QList<ScheduledFault> &schedule = store->hasProxies() ? kServerSchedule
                                                : store->kind() == FaultStore::Kind::Cluster
                                                    ? kClusterSchedule
                                                    : kSqliteSchedule;
        for (const ScheduledFault &step : schedule) {
            waitUntil(history.originMs + step.atMs);
            inject(step, *store, desks, downstream, history);
            if (QTest::currentTestFailed())
                return;
        }
        QVERIFY2(QTest::qWaitFor([&] { return driver.finished(); }, kSpreadMs + kGiveUpMs + 15'000),
                 "the senders did not finish: an attempt hangs past its timeout");
        const qint64 trafficEndMs = nowMs();
        const QStringList crashed = desks.crashed();
        QVERIFY2(crashed.isEmpty(), qPrintable(crashed.join(u'\n')));
        desks.stop();
        const qint64 stoppedMs = nowMs();

        history.senders = driver.logs();
        history.deliveries = driver.attempts();
        history.runs = downstream.runs();
        const QString unread = readStore(store->directUrl(), kKeys, history.stored);
        QVERIFY2(unread.isEmpty(), qPrintable(unread));
        const CheckOutcome outcome = checkHistory(history);
        qInfo().noquote() << outcome.summary
                          << QStringLiteral("\n  wall time: set-up %1 s, traffic %2 s, shutdown %3 "
                                            "s, reading the store %4 s")
                                 .arg(double(history.originMs - setupMs) / 1000, 0, 'f', 1)
                                 .arg(double(trafficEndMs - history.originMs) / 1000, 0, 'f', 1)
                                 .arg(double(stoppedMs - trafficEndMs) / 1000, 0, 'f', 1)
                                 .arg(double(nowMs() - stoppedMs) / 1000, 0, 'f', 1);
        if (!outcome.failures.isEmpty()) {
            // Every failing key in one line, then the whole story of the first few.
            constexpr int kHistories = 12;
            QString message = QStringLiteral("%1 of %2 keys broke a promise under faults on %3:")
                                  .arg(outcome.failures.size())
                                  .arg(kKeys)
                                  .arg(store->name());
            for (const KeyFailure &f : outcome.failures)
                message +=
                    QStringLiteral("\n%1: %2").arg(f.key, f.problems.join(QStringLiteral("; ")));
            message += QStringLiteral("\nhistories (times from the driver's start):");
            for (const KeyFailure &f : outcome.failures.mid(0, kHistories))
                message += QStringLiteral("\n%1:%2").arg(f.key, f.history);
            QFAIL(qPrintable(message));
        }
    }

private:
    static void inject(const ScheduledFault &step, FaultStore &store, Desks &desks,
                       const RecordingDownstream &downstream, FaultHistory &history)
    {
        const QList<int> slots = step.slot < 0 ? QList<int>{0, 1} : QList<int>{step.slot};
        auto hold = [&](const QString &kind, const QString &target) {
            history.faults.append({kind, target, nowMs(), step.durationMs});
            waitUntil(nowMs() + step.durationMs);
        };
        auto proxies = [&](FaultProxy::Mode mode, const QString &kind) {
            for (int slot : slots)
                store.proxy(slot).setMode(mode, kProxyDelayMs);
            hold(kind, slotName(step.slot));
            for (int slot : slots)
                store.proxy(slot).setMode(FaultProxy::Mode::Pass);
        };
        switch (step.fault) {
        case Fault::ProxyDelay:
            return proxies(FaultProxy::Mode::Delay,
                           QStringLiteral("proxy delay %1 ms").arg(kProxyDelayMs));
        case Fault::ProxyBlackhole:
            return proxies(FaultProxy::Mode::Blackhole, QStringLiteral("proxy blackhole"));
        case Fault::ProxyReset:
            return proxies(FaultProxy::Mode::Reset, QStringLiteral("proxy reset"));
        case Fault::StoreStop:
            store.pause();
            hold(QStringLiteral("store SIGSTOP"), QStringLiteral("store"));
            store.resume();
            return;
        case Fault::DeskKill: {
            // Killed while it holds a lease: when one of its runs is in progress (if none
            // starts within 3 s, killed all the same).
            const QString victim = desks.instance(step.slot);
            (void)QTest::qWaitFor([&] { return downstream.openRuns(victim.toLatin1()) > 0; }, 3000);
            history.faults.append({QStringLiteral("desk SIGKILL"), victim, nowMs(), 0});
            desks.kill(step.slot);
            QString error;
            QVERIFY2(desks.start(step.slot, error), qPrintable(error));
            return;
        }
        }
    }
};

int main(int argc, char **argv)
{
    QCoreApplication app(argc, argv);
    QStringList args = app.arguments();
    const QString store =
        args.size() > 1 && !args.at(1).startsWith(u'-') ? args.takeAt(1) : QStringLiteral("sqlite");
    if (store == QLatin1String("sqlite"))
        g_kind = FaultStore::Kind::Sqlite;
    else if (store == QLatin1String("redis"))
        g_kind = FaultStore::Kind::Redis;
    else if (store == QLatin1String("postgres"))
        g_kind = FaultStore::Kind::Postgres;
    else if (store == QLatin1String("cluster"))
        g_kind = FaultStore::Kind::Cluster;
    else {
        qCritical("unknown store %s: sqlite, redis, postgres or cluster", qPrintable(store));
        return 2;
    }
    TestFaults suite;
    return QTest::qExec(&suite, args);
}

#include "tst_faults.moc"
