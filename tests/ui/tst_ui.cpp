// The dashboard on the offscreen platform: models under QAbstractItemModelTester, actions
// driven through the widgets, against a real store and the embedded receiver. Every store call
// goes through a recording wrapper: none may run on the GUI thread (checked after each test).
#include "deliveriesmodel.h"
#include "engine/engine.h"
#include "http/blockingclient.h"
#include "keydetailview.h"
#include "keysmodel.h"
#include "mainwindow.h"
#include "receiver/receiver.h"
#include "settingsdialog.h"
#include "store/sqlitestore.h"
#include "store/storefactory.h"
#include "stormdialog.h"
#include "support/downstream.h"
#include "support/names.h"
#include "support/serveprocess.h"
#include "textdiff.h"
#include "timelinemodel.h"
#include "trafficview.h"
#include "util/clock.h"

#include <QAbstractItemModelTester>
#include <QAction>
#include <QApplication>
#include <QClipboard>
#include <QComboBox>
#include <QDialogButtonBox>
#include <QElapsedTimer>
#include <QLabel>
#include <QLineEdit>
#include <QMessageBox>
#include <QPushButton>
#include <QRegularExpression>
#include <QSignalSpy>
#include <QSpinBox>
#include <QTabBar>
#include <QTabWidget>
#include <QTableView>
#include <QTableWidget>
#include <QTemporaryDir>
#include <QTest>
#include <QTimer>
#include <QDeadlineTimer>
#include <QScopeGuard>

#include <atomic>
#include <thread>

using namespace idem;
using idem::test::generateSqliteKeys;
using idem::test::name;

namespace {

// Answers the next modal message box with `button` as soon as it shows.
void answerNextMessageBox(QMessageBox::StandardButton button, QString *text = nullptr)
{
    auto *timer = new QTimer(qApp);
    timer->setInterval(20);
    QObject::connect(timer, &QTimer::timeout, timer, [timer, button, text] {
        if (auto *box = qobject_cast<QMessageBox *>(QApplication::activeModalWidget())) {
            if (text)
                *text = box->text();
            box->button(button)->click();
            timer->deleteLater();
        }
    });
    timer->start();
}

// What the store was asked, and on which thread. While `watchGui` is on, each call also waits
// until the GUI thread has turned twice (its heartbeat advanced): if it cannot turn within 5 s,
// the GUI thread was waiting on that very call.
struct StoreCalls
{
    QThread *gui = nullptr;
    std::atomic<int> onGuiThread{0};
    std::atomic<int> operatorCalls{0};
    std::atomic<bool> watchGui{false};
    std::atomic<quint64> heartbeat{0};
    std::atomic<int> watched{0};
    std::atomic<int> guiWaited{0};
    void reset()
    {
        onGuiThread = operatorCalls = watched = guiWaited = 0;
        watchGui = false;
    }
};

// Forwards every call to the real store, recording it in StoreCalls (like the contract suite's
// commit probe).
class RecordingStore final : public IdempotencyStore
{
public:
    RecordingStore(std::unique_ptr<IdempotencyStore> inner, StoreCalls *calls) : m_inner(std::move(inner)), m_calls(calls) {}
    Result<ClaimResult> claim(const ClaimRequest &q) override { return recorded([&] { return m_inner->claim(q); }); }
    Result<FinishVerdict> finish(const FinishRequest &q) override { return recorded([&] { return m_inner->finish(q); }); }
    Result<QList<ClaimResult>> claimBatch(const QList<ClaimRequest> &q) override { return recorded([&] { return m_inner->claimBatch(q); }); }
    Result<QList<FinishVerdict>> finishBatch(const QList<FinishRequest> &q) override { return recorded([&] { return m_inner->finishBatch(q); }); }
    Result<std::optional<KeyRecord>> key(const QString &k) override { return recorded([&] { return m_inner->key(k); }); }
    Result<QList<KeyRecord>> listKeys(const KeyQuery &q) override { return recorded([&] { return m_inner->listKeys(q); }); }
    Result<StateCounts> countKeys(const QString &e) override { return recorded([&] { return m_inner->countKeys(e); }); }
    Result<OperatorVerdict> applyOperator(const QString &k, OperatorAction a, bool f, const QString &d) override
    {
        ++m_calls->operatorCalls;
        return recorded([&] { return m_inner->applyOperator(k, a, f, d); });
    }
    Result<qint64> purgeExpired() override { return recorded([&] { return m_inner->purgeExpired(); }); }
    Result<qint64> clockMs() override { return recorded([&] { return m_inner->clockMs(); }); }
    Result<QStringList> durabilityWarnings() override { return recorded([&] { return m_inner->durabilityWarnings(); }); }
    Result<void> appendDeliveries(const QList<DeliveryEvent> &e) override { return recorded([&] { return m_inner->appendDeliveries(e); }); }
    Result<QList<DeliveryEvent>> deliveries(const DeliveryQuery &q) override { return recorded([&] { return m_inner->deliveries(q); }); }
    Result<void> ping() override { return recorded([&] { return m_inner->ping(); }); }
    bool batches() const override { return m_inner->batches(); }
    bool beginBatch() override { return m_inner->beginBatch(); }
    Result<void> endBatch() override { return m_inner->endBatch(); }

private:
    template<typename Call>
    auto recorded(Call call) -> decltype(call())
    {
        if (QThread::currentThread() == m_calls->gui)
            ++m_calls->onGuiThread;
        if (!m_calls->watchGui)
            return call();
        const quint64 before = m_calls->heartbeat.load();
        auto result = call();
        QDeadlineTimer deadline(5000);
        while (m_calls->heartbeat.load() < before + 2 && !deadline.hasExpired())
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        ++m_calls->watched;
        if (m_calls->heartbeat.load() < before + 2)
            ++m_calls->guiWaited;
        return result;
    }
    std::unique_ptr<IdempotencyStore> m_inner;
    StoreCalls *m_calls;
};

// A pool like openStorePool()'s whose every connection records its calls.
std::shared_ptr<StorePool> recordedPool(const QString &url, StoreCalls *calls)
{
    const StoreUrl parsed = *StoreUrl::parse(url);
    StoreFactory real = storeFactory(parsed);
    return std::make_shared<StorePool>([real, calls]() -> Result<std::unique_ptr<IdempotencyStore>> {
        auto store = real();
        if (!store)
            return store.error();
        return std::unique_ptr<IdempotencyStore>(std::make_unique<RecordingStore>(std::move(store.value()), calls));
    }, defaultWorkers(parsed));
}

struct Desk
{
    std::shared_ptr<StorePool> pool;
    std::unique_ptr<Receiver> receiver;
    std::unique_ptr<MainWindow> window;
    quint16 port = 0;
};

} // namespace

class TestUi : public QObject
{
    Q_OBJECT
    QTemporaryDir m_dir;
    int m_seq = 0;
    StoreCalls m_calls;

    Desk open(const QByteArray &endpoints)
    {
        Desk desk;
        auto config = Config::parse("{\"endpoints\": " + endpoints + "}", u"ui"_qs);
        if (!config)
            qFatal("%s", qPrintable(config.error().message));
        const QString url = u"sqlite:"_qs + m_dir.filePath(u"ui%1.db"_qs.arg(++m_seq));
        desk.pool = recordedPool(url, &m_calls);
        desk.receiver = std::make_unique<Receiver>(*config, desk.pool);
        ListenAddress any;
        any.port = 0;
        desk.port = desk.receiver->start(any)->port;
        desk.window = std::make_unique<MainWindow>(DeskSession{*config, url, m_dir.filePath(u"cfg%1.json"_qs.arg(m_seq)), desk.pool, desk.receiver.get()});
        desk.window->show();
        return desk;
    }
    // Deliveries from another thread, while the GUI thread keeps running its event loop.
    static ClientResponse deliver(quint16 port, const QByteArray &endpoint, const QByteArray &key, const QByteArray &body = "{\"a\":1}")
    {
        ClientResponse response;
        std::thread t([&] { response = post(port, "/hooks/" + endpoint, body, {{"Idempotency-Key", key}}); });
        while (!QTest::qWaitFor([&] { return response.status != 0 || !response.error.isEmpty(); }, 50)) {
        }
        t.join();
        return response;
    }
    static void selectAndWait(MainWindow &w, const QString &key)
    {
        QTRY_VERIFY(w.keys()->rowOfKey(key) >= 0);
        w.selectKey(key);
        QTRY_COMPARE(w.detail()->currentKey(), key);
    }

private Q_SLOTS:
    void initTestCase() { m_calls.gui = QThread::currentThread(); }
    void init() { m_calls.reset(); }
    void cleanup()
    {
        // Every pool of the test is gone by now (each joins its workers when destroyed).
        QCOMPARE(m_calls.onGuiThread.load(), 0);
    }

    void deliveriesModelContract()
    {
        DeliveriesModel model(3);
        QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
        for (int i = 0; i < 5; ++i) {
            DeliveryEvent e;
            e.atMs = 1000 + i;
            e.endpoint = u"ep"_qs;
            e.key = u"ep:%1"_qs.arg(i);
            e.outcome = i % 2 ? Outcome::Replayed : Outcome::Processed;
            e.status = 200;
            e.latencyUs = 1500;
            model.append(e);
        }
        QCOMPARE(model.rowCount(), 3); // capped
        QCOMPARE(model.index(0, DeliveriesModel::Key).data().toString(), u"ep:4"_qs); // newest first
        QCOMPARE(model.index(0, DeliveriesModel::Latency).data().toString(), u"1.5 ms"_qs);
        QCOMPARE(model.index(0, DeliveriesModel::Latency).data(DeliveriesModel::RawValueRole).toLongLong(), 1500);
    }

    void keysAndTimelineModelContracts()
    {
        auto pool = recordedPool(u"sqlite:"_qs + m_dir.filePath(u"models.db"_qs), &m_calls);
        for (int i = 0; i < 450; ++i) {
            ClaimRequest c;
            c.key = u"ep:%1"_qs.arg(i, 3, 10, QLatin1Char('0'));
            c.endpoint = u"ep"_qs;
            c.provider = u"generic"_qs;
            c.fingerprint = "f";
            c.policy.leaseMs = i % 3 == 0 ? 1 : 60'000; // some of them stuck
            QVERIFY(pool->run<ClaimResult>([&](IdempotencyStore &s) { return s.claim(c); }).ok());
        }
        KeysModel model(pool, 200);
        QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
        model.setFilter(std::nullopt, {}, {});
        QTRY_COMPARE(model.rowCount(), 200); // the first page
        QCOMPARE(model.index(0, KeysModel::Key).data().toString(), u"ep:449"_qs); // newest first
        QVERIFY(model.canFetchMore({}));
        model.fetchMore({});
        QTRY_COMPARE(model.rowCount(), 400);
        model.fetchMore({});
        QTRY_COMPARE(model.rowCount(), 450);
        QTRY_VERIFY(!model.canFetchMore({}));
        QTRY_COMPARE(model.counts().processing, 450);
        const QModelIndex ttl = model.index(0, KeysModel::Ttl);
        QVERIFY2(ttl.data().toString().contains(QRegularExpression(u"^(6d 23h|7d 0h) "_qs)), qPrintable(ttl.data().toString()));
        QVERIFY(ttl.data(KeysModel::RawValueRole).toLongLong() > 600'000'000);
        const int stuckRow = model.rowOfKey(u"ep:447"_qs); // 447 % 3 == 0: its lease ran out
        QTRY_VERIFY(model.index(stuckRow, KeysModel::Lease).data().toString().startsWith(u"stuck"));
        QVERIFY(model.index(stuckRow, 0).data(KeysModel::StuckRole).toBool());
        model.setFilter(std::nullopt, {}, u"ep:01"_qs); // text: matches anywhere
        QTRY_COMPARE(model.rowCount(), 10);
        model.setFilter(KeyState::Completed, {}, {});
        QTRY_VERIFY(!model.isLoading());
        QCOMPARE(model.rowCount(), 0);
        model.refresh();

        TimelineModel timeline;
        QAbstractItemModelTester timelineTester(&timeline, QAbstractItemModelTester::FailureReportingMode::QtTest);
        QList<DeliveryEvent> events;
        for (int i = 0; i < 3; ++i) {
            DeliveryEvent e;
            e.atMs = 5000 - i * 100; // newest first, as the store returns them
            e.outcome = i == 2 ? Outcome::Processed : Outcome::Replayed;
            events << e;
        }
        timeline.setEvents(events);
        QCOMPARE(timeline.rowCount(), 3);
        QCOMPARE(timeline.index(0, TimelineModel::Meaning).data().toString(), u"won the claim: processed"_qs);
        QCOMPARE(timeline.index(2, TimelineModel::Offset).data().toString(), u"+0.200 s"_qs);
        QCOMPARE(timeline.index(1, TimelineModel::Meaning).data().toString(), u"duplicate: got the stored answer"_qs);
    }

    void resetAFailedKeyAndSeeItProcessedOnTheNextDelivery()
    {
        Desk desk = open("[{\"name\": \"strict\", \"on_failed\": \"reject\", \"simulate\": {\"fail_rate\": 1}},"
                         " {\"name\": \"ok\"}]");
        MainWindow &w = *desk.window;
        QCOMPARE(deliver(desk.port, "strict", "f1").status, 500);
        QCOMPARE(deliver(desk.port, "strict", "f1").header("Idempotency-Outcome"), QByteArray("replayed")); // reject: the failure is replayed
        // Find it from the window: the failed tab.
        w.stateTabs()->setCurrentIndex(2);
        QVERIFY(w.stateTabs()->tabText(2).startsWith(u"failed"));
        selectAndWait(w, u"strict:f1"_qs);
        QVERIFY(w.detail()->current().error.contains(u"simulated failure"));
        QSignalSpy done(&w, &MainWindow::actionFinished);
        w.resetAction()->trigger();
        QTRY_COMPARE(done.count(), 1);
        QVERIFY2(done.first().at(1).toBool(), qPrintable(done.first().at(0).toString()));
        QTRY_COMPARE(name(w.detail()->current().state), name(KeyState::Reset));
        QVERIFY(w.detail()->historyText().contains(u"operator (dashboard)"));
        // The next delivery is processed again (and fails again, by this endpoint's simulation).
        QCOMPARE(deliver(desk.port, "strict", "f1").header("Idempotency-Outcome"), QByteArray("reprocessed"));
        // Reset refuses a completed key and says so.
        QCOMPARE(deliver(desk.port, "ok", "c1").status, 200);
        w.stateTabs()->setCurrentIndex(0);
        selectAndWait(w, u"ok:c1"_qs);
        w.resetAction()->trigger();
        QTRY_COMPARE(done.count(), 2);
        QVERIFY(!done.last().at(1).toBool());
        QVERIFY(done.last().at(0).toString().contains(u"Refused"));
    }

    void retryNowShowsTheResult()
    {
        Desk desk = open("[{\"name\": \"flaky\", \"simulate\": {\"fail_rate\": 1}}, {\"name\": \"ok\"}]");
        MainWindow &w = *desk.window;
        QCOMPARE(deliver(desk.port, "flaky", "r1").status, 500);
        selectAndWait(w, u"flaky:r1"_qs);
        QSignalSpy done(&w, &MainWindow::actionFinished);
        w.retryAction()->trigger();
        QTRY_VERIFY(done.count() >= 2); // "Retrying…", then the result
        QVERIFY(done.last().at(0).toString().contains(u"failed again (500)"));
        QTRY_VERIFY(w.detail()->historyText().contains(u"operator retry"));
        // A completed key asks first, then reprocesses.
        QCOMPARE(deliver(desk.port, "ok", "r2").status, 200);
        selectAndWait(w, u"ok:r2"_qs);
        const qint64 tokenBefore = w.detail()->current().token;
        answerNextMessageBox(QMessageBox::Yes);
        done.clear();
        w.retryAction()->trigger();
        QTRY_VERIFY(done.count() >= 2);
        QVERIFY2(done.last().at(0).toString().contains(u"completed and stored"), qPrintable(done.last().at(0).toString()));
        QTRY_VERIFY(w.detail()->current().token > tokenBefore);
        QCOMPARE(name(w.detail()->current().state), name(KeyState::Completed));
        // The timeline shows the operator's run.
        QTRY_VERIFY(w.detail()->timeline()->rowCount() >= 2);
    }

    void filterByTextAndEndpoint()
    {
        Desk desk = open("[{\"name\": \"a\"}, {\"name\": \"b\"}]");
        MainWindow &w = *desk.window;
        for (const QByteArray &k : {QByteArray("order-1"), QByteArray("order-2"), QByteArray("refund-1")})
            QCOMPARE(deliver(desk.port, "a", k).status, 200);
        QCOMPARE(deliver(desk.port, "b", "order-3").status, 200);
        QTRY_COMPARE(w.keys()->rowCount(), 4);
        QTest::keyClicks(w.textFilter(), u"order"_qs);
        QTRY_COMPARE(w.keys()->rowCount(), 3);
        w.endpointFilter()->setCurrentIndex(w.endpointFilter()->findData(u"a"_qs));
        QTRY_COMPARE(w.keys()->rowCount(), 2);
        w.textFilter()->clear();
        QTest::keyClicks(w.textFilter(), u"a:refund-*"_qs); // a glob
        QTRY_COMPARE(w.keys()->rowCount(), 1);
        QCOMPARE(w.keys()->index(0, KeysModel::Key).data().toString(), u"a:refund-1"_qs);
        QTRY_VERIFY(w.stateTabs()->tabText(0).contains(u"(3)")); // counts of endpoint a
    }

    void deleteAsksForConfirmation()
    {
        Desk desk = open("[{\"name\": \"d\"}]");
        MainWindow &w = *desk.window;
        QCOMPARE(deliver(desk.port, "d", "x1").status, 200);
        selectAndWait(w, u"d:x1"_qs);
        QString asked;
        answerNextMessageBox(QMessageBox::Cancel, &asked);
        w.deleteAction()->trigger(); // the question is modal: answered when this returns
        QVERIFY(asked.contains(u"Delete 1 key"));
        // The pool's one worker runs jobs in order: a delete submitted before this read ran before it.
        QVERIFY(desk.pool->run<std::optional<KeyRecord>>([](IdempotencyStore &s) { return s.key(u"d:x1"_qs); })->has_value());
        QCOMPARE(m_calls.operatorCalls.load(), 0); // cancelled: never asked of the store
        QVERIFY(w.keys()->rowOfKey(u"d:x1"_qs) >= 0);
        answerNextMessageBox(QMessageBox::Yes);
        QSignalSpy done(&w, &MainWindow::actionFinished);
        w.deleteAction()->trigger();
        QTRY_COMPARE(done.count(), 1);
        QTRY_COMPARE(w.keys()->rowOfKey(u"d:x1"_qs), -1);
        auto gone = desk.pool->run<std::optional<KeyRecord>>([](IdempotencyStore &s) { return s.key(u"d:x1"_qs); });
        QVERIFY(!gone->has_value());
        // Deleted: the next delivery is processed again.
        QCOMPARE(deliver(desk.port, "d", "x1").header("Idempotency-Outcome"), QByteArray("processed"));
    }

    void forceFailAStuckKeyAndCopyAsCurl()
    {
        // The delivery is held at the downstream until the test has force-failed it.
        idem::test::CountingDownstream down;
        down.closeGate();
        Desk desk = open("[{\"name\": \"slow\", \"forward_to\": \"" + down.url().toString().toUtf8() + "\"}]");
        MainWindow &w = *desk.window;
        ClientResponse slow;
        std::jthread t([&] { slow = post(desk.port, "/hooks/slow", "{\"it's\":1}", {{"Idempotency-Key", "s1"}, {"Authorization", "Bearer hunter2"}}); });
        QTRY_COMPARE(down.held(), 1);
        selectAndWait(w, u"slow:s1"_qs);
        QCOMPARE(name(w.detail()->current().state), name(KeyState::Processing));
        w.copyCurlAction()->trigger();
        const QString curl = QApplication::clipboard()->text();
        QVERIFY2(curl.contains(u"/hooks/slow"_qs) && curl.contains(u"Idempotency-Key: s1"_qs), qPrintable(curl));
        QVERIFY(!curl.contains(u"hunter2"_qs));
        QVERIFY(curl.contains(u"'{\"it'\\''s\":1}'"_qs)); // shell-quoted body
        answerNextMessageBox(QMessageBox::Yes);
        w.forceFailAction()->trigger();
        QTRY_COMPARE(name(w.detail()->current().state), name(KeyState::Failed));
        QCOMPARE(down.held(), 1); // its worker is still waiting for the downstream
        down.openGate();
        t.join();
        QCOMPARE(slow.status, 409); // its worker could not record the result any more
        QCOMPARE(name(w.detail()->current().state), name(KeyState::Failed));
    }

    void copyAsCurlSendsTheBodyAsItIs()
    {
        // A stored body beginning with @ made `curl --data-binary` read one of the operator's
        // files; --data-raw sends it as it is, and --globoff keeps [ ] { } in the path literal.
        Desk desk = open("[{\"name\": \"c\"}]");
        KeyRecord r;
        r.request.method = "POST";
        r.request.path = "/hooks/c?x[1]={a}";
        r.request.headers = {{"Idempotency-Key", "k"}};
        r.request.body = "@/etc/passwd";
        const QString curl = desk.window->curlFor(r);
        QVERIFY2(curl.contains(u"--data-raw '@/etc/passwd'"_qs) && !curl.contains(u"--data-binary"_qs), qPrintable(curl));
        QVERIFY2(curl.contains(u"--globoff"_qs), qPrintable(curl));
    }

    void settingsShowNoCredentials()
    {
        // forward_to and the store URL carry passwords: the table and the fields do not show
        // them, and saving keeps them.
        auto config = Config::parse("{\"endpoints\": [{\"name\": \"f\", \"forward_to\": \"http://deskuser:hunter2@127.0.0.1:3000/hook\"}]}", u"ui"_qs);
        QVERIFY(config.ok());
        const QString path = m_dir.filePath(u"credentials.json"_qs);
        SettingsDialog dialog(*config, u"redis://:hunter2@127.0.0.1:1/0"_qs, path);
        const QString forward = dialog.endpointTable()->item(0, 3)->text();
        QVERIFY2(forward.contains(u"127.0.0.1:3000/hook"_qs) && !forward.contains(u"hunter2"_qs) && !forward.contains(u"deskuser"_qs),
                 qPrintable(forward));
        QVERIFY2(!dialog.storeEdit()->text().contains(u"hunter2"_qs), qPrintable(dialog.storeEdit()->text()));
        QCOMPARE(dialog.storeUrl(), u"redis://:hunter2@127.0.0.1:1/0"_qs);
        // Another port typed in: the password stays.
        dialog.storeEdit()->setText(dialog.storeEdit()->text().replace(u"127.0.0.1:1"_qs, u"127.0.0.1:2"_qs));
        QCOMPARE(dialog.storeUrl(), u"redis://:hunter2@127.0.0.1:2/0"_qs);
        // The endpoint form: its forward field hides the password too, and OK keeps it.
        QString shown;
        auto *timer = new QTimer(&dialog);
        timer->setInterval(20);
        connect(timer, &QTimer::timeout, timer, [timer, &shown] {
            auto *form = qobject_cast<QDialog *>(QApplication::activeModalWidget());
            if (!form)
                return;
            for (auto *edit : form->findChildren<QLineEdit *>())
                if (edit->text().contains(u"127.0.0.1:3000"_qs))
                    shown = edit->text();
            form->findChild<QDialogButtonBox *>()->button(QDialogButtonBox::Ok)->click();
            timer->deleteLater();
        });
        timer->start();
        dialog.editEndpoint(0);
        QVERIFY2(!shown.isEmpty() && !shown.contains(u"hunter2"_qs), qPrintable(shown));
        QVERIFY(dialog.save());
        auto saved = Config::load(path);
        QVERIFY(saved.ok());
        QCOMPARE(saved->store, u"redis://:hunter2@127.0.0.1:2/0"_qs);
        QCOMPARE(saved->endpoints.first().forwardTo.password(), u"hunter2"_qs);
        QCOMPARE(saved->endpoints.first().forwardTo.userName(), u"deskuser"_qs);
    }

    void mismatchShowsThePayloadDifference()
    {
        Desk desk = open("[{\"name\": \"m\"}]");
        MainWindow &w = *desk.window;
        QCOMPARE(deliver(desk.port, "m", "k", "{\"amount\":10,\"currency\":\"eur\"}").status, 200);
        QCOMPARE(deliver(desk.port, "m", "k", "{\"amount\":99,\"currency\":\"eur\"}").status, 422);
        selectAndWait(w, u"m:k"_qs);
        QTRY_VERIFY(w.detail()->diffText().contains(u"+     \"amount\": 99"_qs));
        QVERIFY(w.detail()->diffText().contains(u"-     \"amount\": 10"_qs));
        QVERIFY(w.detail()->diffText().contains(u"      \"currency\": \"eur\""_qs));
        QCOMPARE(lineDiff({u"a"_qs, u"b"_qs}, {u"a"_qs, u"c"_qs}), QStringList({u"  a"_qs, u"- b"_qs, u"+ c"_qs}));
    }

    void stormTurnsIntoOneProcessing()
    {
        Desk desk = open("[{\"name\": \"orders\", \"simulate\": {\"delay_ms\": 100}}]");
        StormDialog dialog(desk.receiver->engine()->config(), u"http://"_qs + desk.receiver->address().toString());
        dialog.copies()->setValue(64);
        dialog.concurrency()->setValue(64);
        dialog.keys()->setValue(2);
        QSignalSpy finished(&dialog, &StormDialog::finished);
        dialog.start();
        QTRY_COMPARE_WITH_TIMEOUT(finished.count(), 1, 30000);
        QVERIFY(dialog.report().exactlyOnce());
        QCOMPARE(dialog.report().sent, 128);
        QVERIFY(dialog.resultText().contains(u"one per key"));
        QCOMPARE(desk.receiver->engine()->counters().processorRuns, 2);
        // The traffic view counts them from the store's delivery log.
        QTRY_VERIFY_WITH_TIMEOUT(desk.window->traffic()->total(Outcome::Processed) == 2, 10000);
        QTRY_VERIFY_WITH_TIMEOUT(desk.window->traffic()->total(Outcome::InProgress) + desk.window->traffic()->total(Outcome::Replayed) == 126, 10000);
        QVERIFY(desk.window->traffic()->duplicateRatio(u"orders"_qs) > 0.9);
        QVERIFY(desk.window->traffic()->ratios()->rowCount() >= 1);
    }

    void settingsValidateTestAndPersist()
    {
        Desk desk = open("[{\"name\": \"s\", \"provider\": \"stripe\", \"secret\": \"whsec_abcdefghijklmnop\", \"ttl_seconds\": 3600}]");
        QVERIFY(desk.window->statusWarnings()->toolTip().contains(u"shorter than stripe's retry window"));
        const QString path = m_dir.filePath(u"settings.json"_qs);
        SettingsDialog dialog(desk.receiver->engine()->config(), u"sqlite:"_qs + m_dir.filePath(u"other.db"_qs), path);
        const QString maskedSecret = dialog.endpointTable()->item(0, 2)->text();
        QVERIFY(!maskedSecret.contains(u"abcdefghijklmnop"));
        QVERIFY(maskedSecret.startsWith(u"whsec_"));
        QSignalSpy tested(&dialog, &SettingsDialog::connectionTested);
        dialog.testConnection();
        QTRY_COMPARE(tested.count(), 1);
        QVERIFY(tested.first().first().toBool());
        dialog.storeEdit()->setText(u"redis://127.0.0.1:1/0"_qs);
        dialog.testConnection();
        QTRY_COMPARE(tested.count(), 2);
        QVERIFY(!tested.last().first().toBool());
        QVERIFY(dialog.testResult().contains(u"cannot connect to Redis"));
        dialog.storeEdit()->setText(u"mysql://x"_qs);
        QVERIFY(!dialog.save());
        dialog.storeEdit()->setText(u"sqlite:"_qs + m_dir.filePath(u"other.db"_qs));
        QVERIFY(dialog.save());
        auto saved = Config::load(path);
        QVERIFY(saved.ok());
        QCOMPARE(saved->endpoints.first().secrets.first(), u"whsec_abcdefghijklmnop"_qs);
        QCOMPARE(saved->store, u"sqlite:"_qs + m_dir.filePath(u"other.db"_qs));
        QCOMPARE(QFile::permissions(path) & (QFileDevice::ReadOther | QFileDevice::ReadGroup), QFileDevice::Permissions());
    }

    void attachModeSeesAnotherInstance()
    {
        // Another instance writes to the store; the window has no receiver of its own.
        const QString url = u"sqlite:"_qs + m_dir.filePath(u"shared.db"_qs);
        auto config = *Config::parse("{\"endpoints\": [{\"name\": \"shared\"}]}", u"c"_qs);
        auto otherPool = *openStorePool(url);
        Receiver other(config, otherPool);
        ListenAddress any;
        any.port = 0;
        const quint16 port = other.start(any)->port;
        auto pool = recordedPool(url, &m_calls);
        MainWindow window(DeskSession{config, url, {}, pool, nullptr});
        window.show();
        QVERIFY(!window.stormAction()->isEnabled());
        QCOMPARE(deliver(port, "shared", "elsewhere").status, 200);
        QTRY_VERIFY_WITH_TIMEOUT(window.keys()->rowOfKey(u"shared:elsewhere"_qs) >= 0, 5000);
        QTRY_VERIFY_WITH_TIMEOUT(window.traffic()->total(Outcome::Processed) == 1, 5000);
        QVERIFY(window.statusText().contains(u"Attach mode"));
    }

    void aMillionKeysStayResponsive()
    {
        // A generated store: one million keys written straight into the SQLite file.
        const QString path = m_dir.filePath(u"million.db"_qs);
        generateSqliteKeys(path, 1'000'000);

        auto pool = recordedPool(u"sqlite:"_qs + path, &m_calls);
        auto config = *Config::parse("{\"endpoints\": [{\"name\": \"big\"}]}", u"c"_qs);
        // The GUI thread keeps turning while each read of a million keys runs: every store call
        // waits for two heartbeats of the GUI thread, which a GUI thread waiting on it cannot give.
        QTimer heartbeat;
        connect(&heartbeat, &QTimer::timeout, this, [this] { ++m_calls.heartbeat; });
        heartbeat.start(5);
        m_calls.watchGui = true;
        MainWindow window(DeskSession{config, u"sqlite:"_qs + path, {}, pool, nullptr});
        // Off before the window and the pool go: their destructors wait on the workers.
        const auto unwatch = qScopeGuard([this] { m_calls.watchGui = false; });
        window.show();
        QTRY_COMPARE_WITH_TIMEOUT(window.keys()->rowCount(), 200, 20000);
        QCOMPARE(window.keys()->index(0, KeysModel::Key).data().toString(), u"big:evt_999999"_qs);
        QTRY_COMPARE_WITH_TIMEOUT(window.keys()->counts().total(), 1'000'000, 30000);
        QCOMPARE(window.keys()->counts().failed, 250'000);
        window.stateTabs()->setCurrentIndex(2); // failed
        QTRY_COMPARE_WITH_TIMEOUT(window.keys()->rowCount(), 200, 20000);
        QCOMPARE(window.keys()->index(0, KeysModel::State).data().toString(), u"failed"_qs);
        window.keysTable()->scrollToBottom();
        QTRY_VERIFY_WITH_TIMEOUT(window.keys()->rowCount() >= 400, 20000); // the next page, fetched as it scrolls
        QVERIFY2(m_calls.watched.load() >= 4, qPrintable(QString::number(m_calls.watched.load()))); // pages and counts
        QCOMPARE(m_calls.guiWaited.load(), 0);
    }
};

QTEST_MAIN(TestUi)
#include "tst_ui.moc"
