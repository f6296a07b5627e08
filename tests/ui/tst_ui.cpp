// The dashboard on the offscreen platform: models under QAbstractItemModelTester, actions
// driven through the widgets, against a real store and the embedded receiver. Every store call
// goes through a recording wrapper: none may run on the GUI thread (checked after each test).
#include "colours.h"
#include "curlcommand.h"
#include "deliveriesmodel.h"
#include "engine/engine.h"
#include "http/blockingclient.h"
#include "jsonhighlighter.h"
#include "keydetailview.h"
#include "keysmodel.h"
#include "mainwindow.h"
#include "receiver/receiver.h"
#include "senddialog.h"
#include "settingsdialog.h"
#include "store/sqlitestore.h"
#include "store/storefactory.h"
#include "stormdialog.h"
#include "support/downstream.h"
#include "support/names.h"
#include "support/serveprocess.h"
#include "support/servers.h"
#include "textdiff.h"
#include "timelinemodel.h"
#include "trafficview.h"
#include "traymonitor.h"
#include "util/clock.h"
#include "util/version.h"

#include "util/version.h"
#include <QAbstractItemModelTester>
#include <QAction>
#include <QApplication>
#include <QClipboard>
#include <QComboBox>
#include <QCryptographicHash>
#include <QDeadlineTimer>
#include <QDialogButtonBox>
#include <QDir>
#include <QElapsedTimer>
#include <QLabel>
#include <QLineEdit>
#include <QMenuBar>
#include <QMessageBox>
#include <QPlainTextEdit>
#include <QProcess>
#include <QPushButton>
#include <QRegularExpression>
#include <QScopeGuard>
#include <QScrollBar>
#include <QSettings>
#include <QSignalSpy>
#include <QSpinBox>
#include <QSplitter>
#include <QSystemTrayIcon>
#include <QTabBar>
#include <QTabWidget>
#include <QTableView>
#include <QTableWidget>
#include <QTemporaryDir>

#include <QTest>
#include <QTextBlock>
#include <QTextDocument>
#include <QTextLayout>
#include <QTimer>
#include <cmath>
#include <csignal>

#include <atomic>
#include <thread>

using namespace idem;
using idem::test::generateSqliteKeys;
using idem::test::name;

namespace {

// What a label, a tooltip or a notification shows of `text`.
QString shownText(const QString &text, Qt::TextFormat format = Qt::AutoText)
{
    if (format == Qt::PlainText || (format == Qt::AutoText && !Qt::mightBeRichText(text)))
        return text;
    QTextDocument doc;
    doc.setHtml(text);
    return doc.toPlainText();
}

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
    std::atomic<int> failPages{0}; // this many key pages past the first are refused (Unavailable)
    std::atomic<int> firstPageReads{0}; // reads of a list's start: refreshes (and first pages)
    void reset()
    {
        onGuiThread = operatorCalls = watched = guiWaited = failPages = firstPageReads = 0;
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
    Result<QList<KeyRecord>> listKeys(const KeyQuery &q) override
    {
        return recorded([&]() -> Result<QList<KeyRecord>> {
            if (q.offset == 0)
                ++m_calls->firstPageReads;
            if (q.offset > 0 && m_calls->failPages.fetch_sub(1) > 0)
                return makeError(ErrorCode::Unavailable,
                                 u"the store refused this page (injected)"_qs);
            return m_inner->listKeys(q);
        });
    }
    Result<QStringList> keyNames(const KeyQuery &q) override
    {
        return recorded([&] { return m_inner->keyNames(q); });
    }
    Result<KeyPage> findKeys(const KeyQuery &q) override
    {
        return recorded([&] { return m_inner->findKeys(q); });
    }
    Result<StateCounts> countKeys(const QString &e) override { return recorded([&] { return m_inner->countKeys(e); }); }
    Result<OperatorVerdict> applyOperator(const QString &k, OperatorAction a, bool f, const QString &d) override
    {
        ++m_calls->operatorCalls;
        return recorded([&] { return m_inner->applyOperator(k, a, f, d); });
    }
    Result<qint64> purgeExpired() override
    {
        return recorded([&] { return m_inner->purgeExpired(); });
    }
    Result<ImportVerdict> importRecord(const KeyRecord &r, qint64 ttl, qint64 lease) override
    {
        return recorded([&] { return m_inner->importRecord(r, ttl, lease); });
    }
    Result<QString> serverVersion() override
    {
        return recorded([&] { return m_inner->serverVersion(); });
    }
    Result<qint64> clockMs() override
    {
        return recorded([&] { return m_inner->clockMs(); });
    }
    Result<QStringList> durabilityWarnings() override
    {
        return recorded([&] { return m_inner->durabilityWarnings(); });
    }
    Result<void> appendDeliveries(const QList<DeliveryEvent> &e) override
    {
        return recorded([&] { return m_inner->appendDeliveries(e); });
    }
    Result<QList<DeliveryEvent>> deliveries(const DeliveryQuery &q) override
    {
        return recorded([&] { return m_inner->deliveries(q); });
    }
    Result<void> ping() override
    {
        return recorded([&] { return m_inner->ping(); });
    }
    bool deliveriesIndexedByKey() const override { return m_inner->deliveriesIndexedByKey(); }
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

    // `storeUrl`: the URL the desk says it was configured with (its window and Settings show
    // it), the store being a SQLite file all the same.
    Desk open(const QByteArray &endpoints, const QString &storeUrl = {})
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
        desk.window = std::make_unique<MainWindow>(DeskSession{
            *config, storeUrl.isEmpty() ? url : storeUrl,
            m_dir.filePath(u"cfg%1.json"_qs.arg(m_seq)), desk.pool, desk.receiver.get()});
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
    // A window (no receiver here) on a SQLite store of `count` keys written straight into its file
    // (generateSqliteKeys), shown.
    struct Generated
    {
        std::shared_ptr<StorePool> pool;
        std::unique_ptr<MainWindow> window; // goes first
    };
    Generated generated(const QString &name, int count, const QByteArray &body = {})
    {
        const QString url = u"sqlite:"_qs + m_dir.filePath(name + u".db"_qs);
        generateSqliteKeys(url.mid(7), count, body);
        Generated g;
        g.pool = recordedPool(url, &m_calls);
        g.window = std::make_unique<MainWindow>(
            DeskSession{*Config::parse("{\"endpoints\": [{\"name\": \"big\"}]}", u"c"_qs),
                        url,
                        {},
                        g.pool,
                        nullptr});
        g.window->show();
        return g;
    }
    // A new key of endpoint "big", claimed: the newest in the Keys table.
    static bool claim(StorePool &pool, const QString &id)
    {
        ClaimRequest c;
        c.key = u"big:"_qs + id;
        c.endpoint = u"big"_qs;
        c.provider = u"generic"_qs;
        c.fingerprint = "f";
        c.policy.leaseMs = 60'000;
        return pool.run<ClaimResult>([&](IdempotencyStore &s) { return s.claim(c); }).ok();
    }
    // Pages loaded as a view scrolling down would, until `rows` are (or 60 pages were asked).
    static void loadRows(KeysModel *keys, int rows)
    {
        QSignalSpy loaded(keys, &KeysModel::loaded);
        for (int page = 0; page < 100 && keys->rowCount() < rows; ++page) {
            if (keys->canFetchMore({}))
                keys->fetchMore({});
            loaded.wait(5000);
        }
    }
    static void selectAndWait(MainWindow &w, const QString &key)
    {
        QTRY_VERIFY(w.keys()->rowOfKey(key) >= 0);
        w.selectKey(key);
        QTRY_COMPARE(w.detail()->currentKey(), key);
    }

private Q_SLOTS:
    void initTestCase()
    {
        m_calls.gui = QThread::currentThread();
        // Remembered geometry goes to this test's own folder, never the user's settings.
        QSettings::setPath(QSettings::NativeFormat, QSettings::UserScope,
                           m_dir.filePath(u"settings"_qs));
        QSettings().clear();
    }
    void init() { m_calls.reset(); }
    void cleanup()
    {
        // Every pool of the test is gone by now (each joins its workers when destroyed).
        QCOMPARE(m_calls.onGuiThread.load(), 0);
    }

    void selectionSurvivesActionsAndSorting()
    {
        // Reset moves a failed key to the top (sorted by last seen): the row moves, the model is
        // refreshed, and the selection stays on the key, its actions enabled.
        Desk desk = open("[{\"name\": \"f\", \"on_failed\": \"reject\", \"simulate\": "
                         "{\"fail_rate\": 1}}, {\"name\": \"ok\"}]");
        MainWindow &w = *desk.window;
        QCOMPARE(deliver(desk.port, "f", "old").status, 500);
        QCOMPARE(deliver(desk.port, "ok", "newer").status, 200);
        QTRY_COMPARE(w.keys()->rowCount(), 2);
        QTRY_COMPARE(w.keysTable()->model()->index(0, KeysModel::Key).data().toString(),
                     u"ok:newer"_qs);
        selectAndWait(w, u"f:old"_qs);
        QSignalSpy done(&w, &MainWindow::actionFinished);
        w.resetAction()->trigger();
        QTRY_COMPARE(done.count(), 1);
        // The reset key is now the newest: first row, still selected, actions still on.
        QTRY_COMPARE(w.keysTable()->model()->index(0, KeysModel::Key).data().toString(),
                     u"f:old"_qs);
        QTRY_COMPARE(w.selectedKeys(), QStringList{u"f:old"_qs});
        QVERIFY(w.resetAction()->isEnabled() && w.deleteAction()->isEnabled() &&
                w.retryAction()->isEnabled());
        QCOMPARE(w.keysTable()->selectionModel()->selectedRows().first().row(), 0);
        // Refreshes and a new key arriving on top keep it too.
        QCOMPARE(deliver(desk.port, "ok", "newest").status, 200);
        QTRY_COMPARE(w.keys()->rowCount(), 3);
        w.refreshAction()->trigger();
        QTRY_COMPARE(w.keysTable()->model()->index(0, KeysModel::Key).data().toString(),
                     u"ok:newest"_qs);
        QTRY_COMPARE(w.selectedKeys(), QStringList{u"f:old"_qs});
        QCOMPARE(w.detail()->currentKey(), u"f:old"_qs);
        // Sorting by another column keeps it as well.
        w.keysTable()->sortByColumn(KeysModel::Key, Qt::AscendingOrder);
        QCOMPARE(w.selectedKeys(), QStringList{u"f:old"_qs});
        // Small texts: one delivery is "1 delivery".
        Desk one = open("[{\"name\": \"o\"}]");
        QCOMPARE(deliver(one.port, "o", "k").status, 200);
        QTRY_VERIFY(one.window->statusText().contains(u"1 delivery,"_qs));
        QVERIFY(!one.window->statusText().contains(u"1 deliveries"_qs));
    }

    void resetOnTheFailedTabKeepsTheKeyInTheDetail()
    {
        // On the failed tab, Reset takes the key out of the list. The detail keeps showing it
        // (now reset), and the actions still apply to it until another row is chosen.
        Desk desk = open("[{\"name\": \"f\", \"on_failed\": \"reject\", \"simulate\": "
                         "{\"fail_rate\": 1}}]");
        MainWindow &w = *desk.window;
        QCOMPARE(deliver(desk.port, "f", "one").status, 500);
        QCOMPARE(deliver(desk.port, "f", "two").status, 500);
        w.stateTabs()->setCurrentIndex(2); // failed
        QTRY_COMPARE(w.keys()->rowCount(), 2);
        selectAndWait(w, u"f:one"_qs);
        QSignalSpy done(&w, &MainWindow::actionFinished);
        w.resetAction()->trigger();
        QTRY_COMPARE(done.count(), 1);
        QTRY_COMPARE(w.keys()->rowCount(), 1); // it left the failed list
        QVERIFY(w.selectedKeys().isEmpty());
        QCOMPARE(w.actionKeys(), QStringList{u"f:one"_qs});
        QCOMPARE(w.detail()->currentKey(), u"f:one"_qs);
        QVERIFY(w.deleteAction()->isEnabled() && w.retryAction()->isEnabled() &&
                w.copyKeyAction()->isEnabled());
        // The detail follows the key's new state, and Delete still acts on it.
        w.refreshAction()->trigger();
        QTRY_COMPARE(int(w.detail()->current().state), int(KeyState::Reset));
        QCOMPARE(w.detail()->current().key, u"f:one"_qs);
        // Its failed run's error is the last one now, not the key's.
        QVERIFY2(w.detail()->summaryText().contains(u"last error</b> (before it was reset)"_qs) &&
                     !w.detail()->summaryText().contains(u"<b>error:</b>"_qs),
                 qPrintable(w.detail()->summaryText()));
        // Choosing another row moves the actions there.
        selectAndWait(w, u"f:two"_qs);
        QCOMPARE(w.actionKeys(), QStringList{u"f:two"_qs});
    }

    void keysColumnKeepsTheDistinguishingTail()
    {
        Desk desk = open("[{\"name\": \"gh\"}]");
        MainWindow &w = *desk.window;
        const QByteArray prefix = "hook-4242/storage-replication-worker-";
        QCOMPARE(deliver(desk.port, "gh", "a").status, 200);
        QTRY_COMPARE(w.keys()->rowCount(), 1);
        const int narrow = w.keysTable()->columnWidth(KeysModel::Key);
        QCOMPARE(deliver(desk.port, "gh", prefix + "0001").status, 200);
        QCOMPARE(deliver(desk.port, "gh", prefix + "0002").status, 200);
        QTRY_COMPARE(w.keys()->rowCount(), 3);
        // The width follows the content, the text is elided in the middle, the tooltip is whole.
        QTRY_VERIFY(w.keysTable()->columnWidth(KeysModel::Key) > narrow);
        QCOMPARE(w.keysTable()->textElideMode(), Qt::ElideMiddle);
        const QString full = u"gh:"_qs + QString::fromLatin1(prefix) + u"0002"_qs;
        const int row = w.keys()->rowOfKey(full);
        QCOMPARE(shownText(w.keys()->index(row, KeysModel::Key).data(Qt::ToolTipRole).toString()),
                 full);
        const QString shown = w.keysTable()->fontMetrics().elidedText(full, Qt::ElideMiddle, 120);
        QVERIFY2(shown.endsWith(u"0002"_qs), qPrintable(shown)); // what ElideMiddle keeps
        // Copy key (Ctrl+C) puts the selected key on the clipboard.
        selectAndWait(w, full);
        QCOMPARE(w.copyKeyAction()->shortcut(), QKeySequence(QKeySequence::Copy));
        w.copyKeyAction()->trigger();
        QCOMPARE(QApplication::clipboard()->text(), full);
    }

    void hintNamesAConfiguredEndpoint()
    {
        Desk desk = open("[{\"name\": \"orders\", \"key\": {\"header\": \"X-Event-Id\"}}]");
        const QString hint = desk.window->addressLabel()->text();
        QVERIFY2(hint.contains(u"/hooks/orders"_qs) && !hint.contains(u"/hooks/generic"_qs) &&
                     hint.contains(u"X-Event-Id: k1"_qs),
                 qPrintable(hint));
        // The hint works as it says: that curl's request is processed.
        QCOMPARE(
            post(desk.port, "/hooks/orders", "{\"type\":\"test.event\"}", {{"X-Event-Id", "k1"}})
                .status,
            200);
        // Only signed endpoints: no curl can work; Send test event instead.
        auto config = *Config::parse("{\"endpoints\": [{\"name\": \"pay\", \"provider\": "
                                     "\"stripe\", \"secret\": \"whsec_x\"}]}",
                                     u"t"_qs);
        const QString signedHint = tryHint(config, u"http://127.0.0.1:1"_qs);
        QVERIFY2(signedHint.contains(u"Send test event"_qs) && !signedHint.contains(u"curl"_qs),
                 qPrintable(signedHint));
        // An unsigned stripe endpoint: the key goes in the body, where stripe reads it.
        config = *Config::parse("{\"endpoints\": [{\"name\": \"pay\", \"provider\": \"stripe\"}]}",
                                u"t"_qs);
        QVERIFY(tryHint(config, u"http://h"_qs).contains(u"&quot;id&quot;: &quot;k1&quot;"_qs));
    }

    void menuBarShortcutsIconAndAbout()
    {
        Desk desk = open("[{\"name\": \"m\"}]");
        MainWindow &w = *desk.window;
        QStringList menus;
        for (QAction *menu : w.menuBar()->actions())
            menus << menu->text().remove(u'&');
        QCOMPARE(menus, QStringList({u"File"_qs, u"Edit"_qs, u"Keys"_qs, u"View"_qs, u"Help"_qs}));
        QCOMPARE(w.deleteAction()->shortcut(), QKeySequence(QKeySequence::Delete));
        QCOMPARE(w.findAction()->shortcut(), QKeySequence(QKeySequence::Find));
        QCOMPARE(w.refreshAction()->shortcut(), QKeySequence(Qt::Key_F5));
        QVERIFY(!w.windowIcon().isNull());
        QVERIFY(!w.windowIcon().pixmap(256, 256).isNull());
        for (QAction *a : {w.resetAction(), w.retryAction(), w.deleteAction(), w.sendAction(),
                           w.exportAction(), w.importAction()})
            QVERIFY2(!a->icon().isNull(), qPrintable(a->text()));
        // Ctrl+F goes to the key filter.
        w.pages()->setCurrentIndex(1);
        w.activateWindow();
        QVERIFY(QTest::qWaitForWindowActive(&w));
        QTest::keySequence(&w, QKeySequence::Find);
        QTRY_VERIFY(w.textFilter()->hasFocus());
        QCOMPARE(w.pages()->currentIndex(), 0);
        // About: the desk's, Qt's and the store server's versions (asked on a store worker).
        w.aboutAction()->trigger();
        QMessageBox *about = w.findChild<QMessageBox *>(u"about"_qs);
        QVERIFY(about);
        QVERIFY(about->text().contains(QString::fromLatin1(qVersion())));
        QVERIFY(about->text().contains(QStringLiteral(IDEM_VERSION)));
        QTRY_VERIFY2(about->text().contains(u"<td>Store server</td><td>SQLite 3."_qs),
                     qPrintable(about->text()));
        // ... and every line `idemdesk --version` prints: the commit and each library.
        QVERIFY2(about->text().contains(deskCommit()), qPrintable(about->text()));
        for (const auto &[library, version] : libraryVersions())
            QVERIFY2(about->text().contains(u"<td>%1</td><td>%2"_qs.arg(library, version)),
                     qPrintable(library + u" "_qs + version + u" not in "_qs + about->text()));
        about->close();
    }

    void geometryAndSplitterAreRemembered()
    {
        QList<int> sizes;
        {
            Desk desk = open("[{\"name\": \"g\"}]");
            desk.window->resize(1000, 640);
            desk.window->splitter()->setSizes({250, 700});
            sizes = desk.window->splitter()->sizes();
            QVERIFY(sizes[0] < sizes[1]);
        } // saved when the window goes
        Desk again = open("[{\"name\": \"g\"}]");
        QCOMPARE(again.window->size(), QSize(1000, 640));
        QCOMPARE(again.window->splitter()->sizes(), sizes);
    }

    void sendTestEventSignsAndShowsTheAnswers()
    {
        // A SendGrid public key (base64 DER, as SendGrid shows it), made by openssl.
        QProcess keys;
        keys.start(
            u"sh"_qs,
            {u"-c"_qs,
             u"openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 | openssl pkey -pubout -outform DER | base64 -w0"_qs});
        QVERIFY(keys.waitForFinished(30000));
        const QByteArray publicKey = keys.readAllStandardOutput().trimmed();
        QVERIFY(publicKey.startsWith("MFkw"));
        Desk desk = open("[{\"name\": \"pay\", \"provider\": \"stripe\", \"secret\": \"whsec_ui\"},"
                         " {\"name\": \"sg\", \"provider\": \"sendgrid\", \"public_key\": \"" +
                         publicKey + "\"}]");
        MainWindow &w = *desk.window;
        QVERIFY(w.sendAction()->isEnabled());
        w.sendAction()->trigger();
        auto *dialog = w.findChild<SendDialog *>();
        QVERIFY(dialog);
        QCOMPARE(dialog->templates()->currentText(), u"payment_intent.succeeded"_qs);
        QVERIFY(
            dialog->body()->toPlainText().contains(u"\"type\": \"payment_intent.succeeded\""_qs));
        QSignalSpy sent(dialog, &SendDialog::sent);
        // Edited, then sent twice: signed with the secret (else 401), processed once, replayed
        // once.
        dialog->body()->setPlainText(dialog->body()->toPlainText().replace(u"4200"_qs, u"4300"_qs));
        dialog->copies()->setValue(2);
        dialog->send();
        QTRY_COMPARE_WITH_TIMEOUT(sent.count(), 1, 20000);
        QCOMPARE(sent.first().first().toInt(), 0);
        QCOMPARE(dialog->answers()->rowCount(), 2);
        QCOMPARE(dialog->answers()->item(0, 1)->text(), u"200"_qs);
        QCOMPARE(dialog->answers()->item(0, 2)->text(), u"processed"_qs);
        QCOMPARE(dialog->answers()->item(1, 2)->text(), u"replayed"_qs);
        const QString key = dialog->answers()->item(0, 3)->text();
        QVERIFY(key.startsWith(u"pay:evt_test_"_qs));
        QTRY_VERIFY(w.keys()->rowOfKey(key) >= 0);
        selectAndWait(w, key);
        QVERIFY(w.detail()->current().request.body.contains("4300"));
        // SendGrid without the private key: refused before sending, and said why.
        dialog->endpoint()->setCurrentIndex(1);
        QCOMPARE(dialog->templates()->currentText(), u"batch"_qs);
        QVERIFY(dialog->signKey()->isEnabled());
        dialog->send();
        QTRY_COMPARE(sent.count(), 2);
        QCOMPARE(sent.last().first().toInt(), -1);
        QVERIFY2(dialog->summary()->text().contains(u"private key"_qs),
                 qPrintable(dialog->summary()->text()));
        dialog->close();
    }

    void exportFromOneDeskImportIntoAnother()
    {
        Desk colleague = open(
            "[{\"name\": \"e\", \"on_failed\": \"reject\", \"simulate\": {\"fail_rate\": 1}}]");
        QCOMPARE(deliver(colleague.port, "e", "broken").status, 500);
        MainWindow &from = *colleague.window;
        selectAndWait(from, u"e:broken"_qs);
        const QString path = m_dir.filePath(u"moved.jsonl"_qs);
        QSignalSpy exported(&from, &MainWindow::actionFinished);
        from.exportTo(path, from.selectedKeys());
        QTRY_COMPARE(exported.count(), 1);
        QVERIFY2(exported.first().at(1).toBool(), qPrintable(exported.first().at(0).toString()));
        QFile file(path);
        QVERIFY(file.open(QIODevice::ReadOnly));
        QCOMPARE(file.readAll().count('\n'), 1);

        Desk mine = open("[{\"name\": \"e\"}]");
        MainWindow &to = *mine.window;
        QSignalSpy imported(&to, &MainWindow::actionFinished);
        to.importFrom(path);
        QTRY_COMPARE(imported.count(), 1);
        QVERIFY2(imported.first().at(0).toString().contains(u"Imported 1 key"_qs),
                 qPrintable(imported.first().at(0).toString()));
        QTRY_VERIFY(to.keys()->rowOfKey(u"e:broken"_qs) >= 0);
        selectAndWait(to, u"e:broken"_qs);
        QCOMPARE(name(to.detail()->current().state), name(KeyState::Failed));
        QVERIFY(to.detail()->current().error.contains(u"simulated failure"));
        // Again: left alone and said so.
        to.importFrom(path);
        QTRY_COMPARE(imported.count(), 2);
        QVERIFY2(
            imported.last().at(0).toString().contains(u"Already here, left alone: e:broken"_qs),
            qPrintable(imported.last().at(0).toString()));
        // Many lines refused (or keys already here): the first ten named, the rest counted (six
        // thousand keys made a message of 114,000 characters filling the detail pane).
        const QString garbage = m_dir.filePath(u"garbage.jsonl"_qs);
        QFile out(garbage);
        QVERIFY(out.open(QIODevice::WriteOnly));
        for (int i = 0; i < 300; ++i)
            out.write("not json at all\n");
        out.close();
        to.importFrom(garbage);
        QTRY_COMPARE(imported.count(), 3);
        const QString refused = imported.last().at(0).toString();
        QVERIFY2(refused.contains(u"line 10:"_qs) && !refused.contains(u"line 11:"_qs) &&
                     refused.contains(u"and 290 more"_qs) && refused.size() < 2000,
                 qPrintable(refused));
    }

    void stateColoursReadableOnLightAndDark()
    {
        // Each state colour against the view's base colour: WCAG contrast of at least 3:1, on
        // the light palette and on a dark one.
        auto luminance = [](const QColor &c) {
            auto channel = [](double v) {
                return v <= 0.03928 ? v / 12.92 : std::pow((v + 0.055) / 1.055, 2.4);
            };
            return 0.2126 * channel(c.redF()) + 0.7152 * channel(c.greenF()) +
                   0.0722 * channel(c.blueF());
        };
        auto contrast = [&](const QColor &a, const QColor &b) {
            const double la = luminance(a), lb = luminance(b);
            return (std::max(la, lb) + 0.05) / (std::min(la, lb) + 0.05);
        };
        const QPalette original = QApplication::palette();
        const auto restore = qScopeGuard([&] { QApplication::setPalette(original); });
        QPalette light;
        light.setColor(QPalette::Window, QColor(0xef, 0xef, 0xef));
        light.setColor(QPalette::WindowText, Qt::black);
        light.setColor(QPalette::Base, Qt::white);
        light.setColor(QPalette::Text, Qt::black);
        QPalette dark;
        dark.setColor(QPalette::Window, QColor(0x2b, 0x2d, 0x30));
        dark.setColor(QPalette::WindowText, QColor(0xe6, 0xe6, 0xe6));
        dark.setColor(QPalette::Base, QColor(0x1e, 0x1f, 0x22));
        dark.setColor(QPalette::Text, QColor(0xe6, 0xe6, 0xe6));
        for (const QPalette &palette : {light, dark}) {
            QApplication::setPalette(palette);
            QCOMPARE(paletteIsDark(),
                     palette.color(QPalette::Window) == dark.color(QPalette::Window));
            // Text in views (Base) and in dialogs (Window): WCAG AA, 4.5:1.
            for (QPalette::ColorRole role : {QPalette::Base, QPalette::Window}) {
                for (KeyState state :
                     {KeyState::Processing, KeyState::Completed, KeyState::Failed, KeyState::Reset})
                    QVERIFY2(contrast(stateColour(state), palette.color(role)) >= 4.5,
                             qPrintable(toString(state)));
                for (JsonPart part :
                     {JsonPart::Key, JsonPart::String, JsonPart::Number, JsonPart::Literal})
                    QVERIFY(contrast(jsonColour(part), palette.color(role)) >= 4.5);
            }
            QVERIFY(contrast(stuckBackground(), palette.color(QPalette::Text)) >=
                    4.5); // a stuck row's text
            // The JSON highlighter draws with them.
            QTextDocument doc(u"{\"id\": \"evt_1\", \"n\": 2, \"ok\": true}"_qs);
            JsonHighlighter highlighter(&doc);
            highlighter.rehighlight();
            QList<QColor> drawn;
            for (const QTextLayout::FormatRange &range : doc.firstBlock().layout()->formats())
                drawn << range.format.foreground().color();
            QVERIFY(drawn.contains(jsonColour(JsonPart::Key)) &&
                    drawn.contains(jsonColour(JsonPart::String)) &&
                    drawn.contains(jsonColour(JsonPart::Number)) &&
                    drawn.contains(jsonColour(JsonPart::Literal)));
        }
        // A dark palette of the platform theme (Qt's own lightness) counts as dark, whatever
        // its text colour; a desktop asking for a dark GTK theme by any name is followed.
        QPalette dim = dark;
        dim.setColor(QPalette::WindowText, QColor(0x20, 0x20, 0x20));
        QApplication::setPalette(dim);
        QVERIFY(paletteIsDark());
        const QByteArray gtkTheme = qgetenv("GTK_THEME"), desktop = qgetenv("XDG_CURRENT_DESKTOP");
        const auto env = qScopeGuard([&] {
            qputenv("GTK_THEME", gtkTheme);
            qputenv("XDG_CURRENT_DESKTOP", desktop);
        });
        qunsetenv("XDG_CURRENT_DESKTOP");
        for (const char *theme : {"Adwaita:dark", "Adwaita-dark", "Yaru-dark", "Yaru-Dark"}) {
            qputenv("GTK_THEME", theme);
            QVERIFY2(desktopWantsDark(), theme);
        }
        qputenv("GTK_THEME", "Adwaita");
        QVERIFY(!desktopWantsDark());
    }

    void trayMonitorCountsAndRateLimitsNotifications()
    {
        // Failed and stuck counts for the tooltip; a notification when a key fails or a lease
        // runs out, at most one per interval (what comes in between follows in the next), and
        // none when turned off.
        qint64 now = 1'000'000;
        TrayMonitor tray(30'000, [&] { return now; });
        QSignalSpy notes(&tray, &TrayMonitor::notify);
        tray.setCounts(2, 0);
        QVERIFY(tray.toolTip().contains(u"2 failed keys"_qs) &&
                tray.toolTip().contains(u"0 stuck keys"_qs));
        QCOMPARE(notes.count(), 0); // where it starts is not news
        DeliveryEvent failed;
        failed.key = u"orders:evt_1"_qs;
        failed.outcome = Outcome::Processed;
        failed.status = 500;
        tray.delivered(failed);
        QCOMPARE(notes.count(), 1);
        QVERIFY(notes.last().at(1).toString().contains(u"orders:evt_1 failed (500)"_qs));
        DeliveryEvent replay = failed;
        replay.outcome = Outcome::Replayed; // a duplicate of a failed key: not a new failure
        tray.delivered(replay);
        DeliveryEvent ok = failed;
        ok.status = 200;
        tray.delivered(ok);
        now += 1000;
        failed.key = u"orders:evt_2"_qs;
        tray.delivered(failed);
        tray.setCounts(3, 1);       // a lease ran out
        QCOMPARE(notes.count(), 1); // rate limited
        QVERIFY(tray.toolTip().contains(u"3 failed keys"_qs) &&
                tray.toolTip().contains(u"1 stuck key"_qs));
        now += 30'000;
        tray.setCounts(3, 1); // the next poll, once the interval is over (a timer does it too)
        QCOMPARE(notes.count(), 2); // both, in one notification
        const QString text = notes.last().at(1).toString();
        QVERIFY2(text.contains(u"orders:evt_2 failed"_qs) && text.contains(u"1 lease ran out"_qs),
                 qPrintable(text));
        // Turned off: nothing.
        tray.setEnabled(false);
        now += 60'000;
        tray.delivered(failed);
        tray.setCounts(3, 2);
        QTest::qWait(50);
        QCOMPARE(notes.count(), 2);
        // The catch-up: one timer however many notes wait, the notes bounded, then one
        // notification when the interval is over.
        TrayMonitor quick(300);
        QSignalSpy quickNotes(&quick, &TrayMonitor::notify);
        quick.setCounts(0, 0);
        for (int i = 0; i < 200; ++i) {
            failed.key = u"orders:burst_%1"_qs.arg(i);
            quick.delivered(failed);
        }
        QCOMPARE(quickNotes.count(), 1); // the first at once
        QVERIFY(quick.catchUp()->isActive());
        QCOMPARE(quick.findChildren<QTimer *>().size(), 1);
        QTRY_COMPARE(quickNotes.count(), 2); // the rest, once the interval is over
        const QString burst = quickNotes.last().at(1).toString();
        QVERIFY2(burst.contains(u"orders:burst_1 failed"_qs) && burst.contains(u"and 194 more"_qs),
                 qPrintable(burst));
        QCOMPARE(burst.count(u'\n'), 5);
        QVERIFY(!quick.catchUp()->isActive());
        // Attach mode (no receiver's deliveries): a failure is told from the counts.
        TrayMonitor attached(0);
        attached.setSeesDeliveries(false);
        QSignalSpy attachedNotes(&attached, &TrayMonitor::notify);
        attached.setCounts(2, 0);
        attached.setCounts(4, 0);
        QCOMPARE(attachedNotes.count(), 1);
        QVERIFY2(attachedNotes.last().at(1).toString().contains(u"2 keys failed: 4 failed keys"_qs),
                 qPrintable(attachedNotes.last().at(1).toString()));
        // The window's switch, remembered; shown only where there is a tray to notify from.
        Desk desk = open("[{\"name\": \"t\"}]");
        QCOMPARE(desk.window->notificationsAction()->isVisible(),
                 QSystemTrayIcon::isSystemTrayAvailable());
        QVERIFY(desk.window->notificationsAction()->isCheckable());
        desk.window->notificationsAction()->setChecked(false);
        QVERIFY(!desk.window->trayMonitor()->isEnabled());
        QCOMPARE(QSettings().value(u"notifications"_qs).toBool(), false);
        desk.window->notificationsAction()->setChecked(true);
    }

    void liveDeliveriesFilterPauseAndOpen()
    {
        Desk desk = open("[{\"name\": \"a\"}, {\"name\": \"b\"}, {\"name\": \"down\", "
                         "\"simulate\": {\"fail_rate\": 1}}]");
        MainWindow &w = *desk.window;
        // A processed delivery whose processor failed is a failure: coloured and filterable.
        QCOMPARE(deliver(desk.port, "down", "x").status, 500);
        QTRY_COMPARE(w.liveView()->model()->rowCount(), 1);
        const QModelIndex failed = w.liveView()->model()->index(0, DeliveriesModel::Outcome);
        QCOMPARE(failed.data().toString(), u"processed"_qs);
        QCOMPARE(failed.data(Qt::ForegroundRole).value<QBrush>().color(),
                 stateColour(KeyState::Failed));
        QCOMPARE(failed.siblingAtColumn(DeliveriesModel::Status)
                     .data(Qt::ForegroundRole)
                     .value<QBrush>()
                     .color(),
                 stateColour(KeyState::Failed));
        QCOMPARE(deliver(desk.port, "a", "k1").status, 200);
        QCOMPARE(deliver(desk.port, "a", "k1").status, 200); // replayed
        QCOMPARE(deliver(desk.port, "b", "k2").status, 200);
        QTRY_COMPARE(w.liveView()->model()->rowCount(), 4);
        QVERIFY(w.liveView()
                    ->model()
                    ->index(0, DeliveriesModel::Outcome)
                    .data(Qt::ForegroundRole)
                    .value<QBrush>()
                    .color() != stateColour(KeyState::Failed));
        w.liveOutcomeFilter()->setCurrentIndex(w.liveOutcomeFilter()->findData(-2));
        QCOMPARE(w.liveView()->model()->rowCount(), 1);
        w.liveOutcomeFilter()->setCurrentIndex(0);
        w.liveEndpointFilter()->setCurrentIndex(w.liveEndpointFilter()->findData(u"down"_qs));
        QCOMPARE(w.liveView()->model()->rowCount(), 1);
        w.liveEndpointFilter()->setCurrentIndex(w.liveEndpointFilter()->findData(u"a"_qs));
        QCOMPARE(w.liveView()->model()->rowCount(), 2);
        w.liveEndpointFilter()->setCurrentIndex(w.liveEndpointFilter()->findData(u"b"_qs));
        QCOMPARE(w.liveView()->model()->rowCount(), 1);
        w.liveEndpointFilter()->setCurrentIndex(0);
        w.liveOutcomeFilter()->setCurrentIndex(w.liveOutcomeFilter()->findText(u"replayed"_qs));
        QCOMPARE(w.liveView()->model()->rowCount(), 1);
        w.liveOutcomeFilter()->setCurrentIndex(0);
        // Paused: new deliveries wait; resumed: they come in.
        w.livePause()->setChecked(true);
        QCOMPARE(deliver(desk.port, "b", "k3").status, 200);
        QTest::qWait(200);
        QCOMPARE(w.liveView()->model()->rowCount(), 4);
        w.livePause()->setChecked(false);
        QCOMPARE(w.liveView()->model()->rowCount(), 5);
        // A double-click opens the key on the Keys page, even one the current filter hides.
        w.stateTabs()->setCurrentIndex(2); // failed: none of these
        QTRY_COMPARE(w.keys()->rowCount(), 0);
        w.pages()->setCurrentIndex(2);
        const QModelIndex row = w.liveView()->model()->index(3, DeliveriesModel::Key);
        QCOMPARE(row.data().toString(), u"a:k1"_qs);
        Q_EMIT w.liveView()->doubleClicked(row);
        QCOMPARE(w.pages()->currentIndex(), 0);
        QTRY_COMPARE(w.selectedKeys(), QStringList{u"a:k1"_qs});
        QTRY_COMPARE(w.detail()->currentKey(), u"a:k1"_qs);
    }

    // The window's Live list through a real flood of bad signatures and unknown endpoints, more
    // than the list holds: the real deliveries stay, each kind of rejection past the budget is one
    // row with the exact count (the engine counts every rejection too), the filters keep working
    // and a double-click on a folded row opens nothing.
    void liveDeliveriesSurviveAFloodOfRejections()
    {
        Desk desk = open("[{\"name\": \"a\"}, {\"name\": \"gh\", \"provider\": \"github\", "
                         "\"secret\": \"s3cret\"}]");
        MainWindow &w = *desk.window;
        DeliveriesModel &live = *w.deliveries();
        constexpr int kReal = 5;
        for (int i = 0; i < kReal; ++i)
            QCOMPARE(deliver(desk.port, "a", "real" + QByteArray::number(i)).status, 200);
        QTRY_COMPARE(live.rowCount(), kReal);
        constexpr int k401 = 5200, k404 = 300;
        std::atomic<int> answered{0};
        std::thread flood([&] {
            RawConnection c(desk.port);
            const QByteArray badSignature = buildPost("/hooks/gh", "{}",
                                                      {{"X-GitHub-Hook-ID", "1"},
                                                       {"X-GitHub-Delivery", "d"},
                                                       {"X-Hub-Signature-256", "sha256=00"}},
                                                      false);
            const QByteArray unknown = buildPost("/hooks/nope", "{}", {}, false);
            for (int i = 0; i < k401 + k404; ++i) {
                const bool is404 = i % 18 == 0 && i / 18 < k404; // mixed in
                if (!c.send(is404 ? unknown : badSignature))
                    return;
                if (c.readResponse().status == (is404 ? 404 : 401))
                    ++answered;
            }
        });
        const auto joinFlood = qScopeGuard([&flood] { flood.join(); });
        QTRY_COMPARE_WITH_TIMEOUT(answered.load(), k401 + k404, 120'000);
        QCOMPARE(answered.load(), k401 + k404);
        QTRY_COMPARE(desk.receiver->engine()->counters().byOutcome[size_t(Outcome::Rejected)],
                     qint64(k401 + k404));
        // Counted whole: the rejections with a row each and the folded counts add up.
        const auto shown = [&live](const QString &endpoint, int status) {
            qint64 n = 0;
            for (int r = 0; r < live.rowCount(); ++r)
                if (live.at(r).outcome == Outcome::Rejected && live.at(r).endpoint == endpoint &&
                    live.at(r).status == status)
                    n += live.at(r).count;
            return n;
        };
        QTRY_COMPARE(shown(u"gh"_qs, 401), qint64(k401));
        QTRY_COMPARE(shown(QString(), 404), qint64(k404));
        QSet<QString> reals;
        int folded = 0, singles = 0, foldedRow = -1;
        for (int r = 0; r < live.rowCount(); ++r) {
            if (live.at(r).outcome != Outcome::Rejected)
                reals.insert(live.at(r).key);
            else if (live.isFolded(r)) {
                ++folded;
                if (live.at(r).endpoint == u"gh"_qs)
                    foldedRow = r;
            } else
                ++singles;
        }
        QCOMPARE(reals.size(), kReal);
        QCOMPARE(folded, 2);
        QVERIFY2(singles >= 2 * DeliveriesModel::kRejectionBurst && singles < 100,
                 qPrintable(QString::number(singles)));
        QVERIFY(live.index(foldedRow, DeliveriesModel::Key)
                    .data()
                    .toString()
                    .contains(u"more rejected (401) since"_qs));
        // The filters: rejected ones (the folded two among them), one endpoint's.
        QAbstractItemModel *view = w.liveView()->model();
        w.liveOutcomeFilter()->setCurrentIndex(w.liveOutcomeFilter()->findText(u"rejected"_qs));
        QCOMPARE(view->rowCount(), singles + folded);
        w.liveOutcomeFilter()->setCurrentIndex(0);
        w.liveEndpointFilter()->setCurrentIndex(w.liveEndpointFilter()->findData(u"a"_qs));
        QCOMPARE(view->rowCount(), kReal);
        w.liveEndpointFilter()->setCurrentIndex(w.liveEndpointFilter()->findData(u"gh"_qs));
        QVERIFY(view->rowCount() > 1);
        int ghFolded = 0;
        for (int r = 0; r < view->rowCount(); ++r)
            ghFolded += view->index(r, 0).data(DeliveriesModel::FoldedCountRole).toLongLong() > 0;
        QCOMPARE(ghFolded, 1);
        w.liveEndpointFilter()->setCurrentIndex(0);
        // A folded row has no key to open: the Live page stays.
        w.pages()->setCurrentIndex(2);
        Q_EMIT w.liveView()->doubleClicked(view->index(foldedRow, DeliveriesModel::Key));
        QCOMPARE(w.pages()->currentIndex(), 2);
    }

    void trafficBarsFollowTheWindow()
    {
        Desk desk = open("[{\"name\": \"t\"}]");
        TrafficView *traffic = desk.window->traffic();
        QCOMPARE(deliver(desk.port, "t", "k1").status, 200);
        QCOMPARE(deliver(desk.port, "t", "k1").status, 200);
        QCOMPARE(deliver(desk.port, "t", "k2").status, 200);
        QTRY_COMPARE_WITH_TIMEOUT(traffic->total(Outcome::Processed), 2, 10000);
        for (int choice = 0; choice < TrafficView::windows().size(); ++choice) {
            traffic->windowChoice()->setCurrentIndex(choice);
            const auto &window = TrafficView::windows().at(choice);
            QCOMPARE(traffic->bucketCount(), window.seconds / window.bucketSeconds);
            QVERIFY(traffic->bucketCount() >= 60 && traffic->bucketCount() <= 96);
            QTRY_COMPARE_WITH_TIMEOUT(traffic->total(Outcome::Processed), 2, 10000);
            // The bars hold every delivery of the window; the newest bucket holds these.
            const auto barsHoldAll = [&] {
                qint64 processed = 0, replayed = 0;
                for (int b = 0; b < traffic->bucketCount(); ++b) {
                    processed += traffic->bucketCount(b, Outcome::Processed);
                    replayed += traffic->bucketCount(b, Outcome::Replayed);
                }
                return processed == 2 && replayed == 1;
            };
            QTRY_VERIFY_WITH_TIMEOUT(barsHoldAll(),
                                     5000); // every delivery of the window is in a bar
        }
        int last = traffic->bucketCount() - 1;
        while (last > 0 && !traffic->bucketCount(last, Outcome::Processed))
            --last;
        QVERIFY2(traffic->bucketSummary(last).contains(u"processed 2"_qs) &&
                     traffic->bucketSummary(last).contains(u"replayed 1"_qs),
                 qPrintable(traffic->bucketSummary(last)));
        // The duplicate ratio, with its bar: 1 of 3.
        QTRY_COMPARE(traffic->ratios()->rowCount(), 1);
        QCOMPARE(traffic->ratios()->item(0, 4)->data(Qt::UserRole).toDouble(), 1.0 / 3.0);
        QVERIFY(traffic->ratios()->itemDelegateForColumn(4));
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

    // The wall clock stepped back an hour (NTP, by hand) with the list at its cap and the budget
    // spent: the flood that follows is shown, folded at the top, every rejection counted. (On the
    // deliveries' wall times the folded row went in below every row from before the step, at the
    // cap, and was trimmed at once: none of 5000 shown.) The budget waits for the times to pass
    // the newest seen: no row of their own meanwhile.
    void aClockSteppedBackHidesNoRejection()
    {
        DeliveriesModel model(100);
        QAbstractItemModelTester tester(&model,
                                        QAbstractItemModelTester::FailureReportingMode::QtTest);
        const auto event = [](qint64 atMs, Outcome outcome, int i = 0) {
            DeliveryEvent e;
            e.atMs = atMs;
            e.endpoint = outcome == Outcome::Rejected ? u"stripe"_qs : u"orders"_qs;
            e.key = outcome == Outcome::Rejected ? QString() : u"orders:%1"_qs.arg(i);
            e.outcome = outcome;
            e.status = outcome == Outcome::Rejected ? 401 : 200;
            return e;
        };
        const auto rejectedShown = [&model] {
            qint64 n = 0;
            for (int r = 0; r < model.rowCount(); ++r)
                if (model.at(r).outcome == Outcome::Rejected)
                    n += model.isFolded(r) ? model.at(r).count : 1;
            return n;
        };
        const qint64 t = 1'700'000'000'000;
        for (int i = 0; i < 50; ++i) // the budget spent
            model.append(event(t + i, Outcome::Rejected));
        model.applyFolds();
        for (int i = 0; i < 100; ++i) // the list at its cap: the rejections pushed out
            model.append(event(t + 1000 + i, Outcome::Processed, i));
        const qint64 back = t + 2000 - 3'600'000;
        for (int i = 0; i < 5000; ++i)
            model.append(event(back + i / 10, Outcome::Rejected));
        model.applyFolds();
        QCOMPARE(rejectedShown(), 5000);
        QVERIFY(model.isFolded(0));
        model.append(event(back + 3000, Outcome::Processed, 100)); // a real one, at the top
        for (int i = 0; i < 100; ++i)
            model.append(event(back + 30'000 + i, Outcome::Rejected));
        model.applyFolds();
        QCOMPARE(rejectedShown(), 5100);
        QVERIFY(model.isFolded(0)); // the fold's last came after the real one
        QCOMPARE(model.at(1).key, u"orders:100"_qs);
    }

    // A flood of rejections after real deliveries (docs/dashboard.md#floods-of-rejections): every
    // real one stays in the capped list; the rejections past the budget fold into one row per
    // endpoint and status with their exact count, moved to the top as it grows; a summary folds
    // whole; a flood while paused drops no real one either. On the deliveries' own clock: nothing
    // timed.
    void liveListFoldsAFloodOfRejections()
    {
        DeliveriesModel model(100);
        QAbstractItemModelTester tester(&model,
                                        QAbstractItemModelTester::FailureReportingMode::QtTest);
        const auto real = [](int i) {
            DeliveryEvent e;
            e.atMs = 1'000'000 + i;
            e.endpoint = u"orders"_qs;
            e.key = u"orders:%1"_qs.arg(i);
            e.outcome = i % 3 ? Outcome::Replayed : Outcome::Processed;
            e.status = 200;
            e.latencyUs = 2000;
            return e;
        };
        const auto rejected = [](qint64 atMs, const QString &endpoint, int status) {
            DeliveryEvent e;
            e.atMs = atMs;
            e.endpoint = endpoint;
            e.outcome = Outcome::Rejected;
            e.status = status;
            e.latencyUs = 50;
            e.detail = u"reason %1"_qs.arg(atMs);
            return e;
        };
        constexpr int kReal = 40;
        const int burst = int(DeliveriesModel::kRejectionBurst);
        for (int i = 0; i < kReal; ++i)
            model.append(real(i));
        struct Kind
        {
            QString endpoint;
            int status;
            qint64 count;
        };
        const QList<Kind> kinds{
            {u"stripe"_qs, 401, 20'000}, {u"orders"_qs, 405, 7000}, {{}, 404, 3000}};
        // Within 200 ms of their clock: no budget refills meanwhile.
        constexpr qint64 kFloodMs = 2'000'000;
        for (int i = 0; i < 20'000; ++i)
            for (const Kind &k : kinds)
                if (i < k.count)
                    model.append(rejected(kFloodMs + i / 100, k.endpoint, k.status));
        model.applyFolds();
        // What the list shows: each real delivery, `burst` rejections of each kind one by one,
        // one folded row per kind counting the rest, exactly.
        const auto census = [&model] {
            struct Seen
            {
                QSet<QString> realKeys;
                QHash<QString, qint64> singles, foldedRows, folded; // by "endpoint/status"
            } seen;
            for (int r = 0; r < model.rowCount(); ++r) {
                const DeliveryEvent &e = model.at(r);
                const QString kind = e.endpoint + u'/' + QString::number(e.status);
                if (e.outcome != Outcome::Rejected)
                    seen.realKeys.insert(e.key);
                else if (!model.isFolded(r))
                    ++seen.singles[kind];
                else {
                    ++seen.foldedRows[kind];
                    seen.folded[kind] += e.count;
                    const QModelIndex i = model.index(r, DeliveriesModel::Key);
                    if (i.data(DeliveriesModel::FoldedCountRole).toLongLong() != e.count ||
                        !e.key.isEmpty())
                        seen.folded[kind] = -1;
                }
            }
            return seen;
        };
        auto seen = census();
        QCOMPARE(seen.realKeys.size(), kReal);
        for (const Kind &k : kinds) {
            const QString kind = k.endpoint + u'/' + QString::number(k.status);
            QCOMPARE(seen.singles.value(kind), burst);
            QCOMPARE(seen.foldedRows.value(kind), 1);
            QCOMPARE(seen.folded.value(kind), k.count - burst);
        }
        QCOMPARE(model.rowCount(), kReal + 3 * burst + 3);
        // The folded rows on top, newest first, saying how many and since when; no latency.
        for (int r = 0; r < 3; ++r)
            QVERIFY(model.isFolded(r));
        QCOMPARE(model.at(0).endpoint, u"stripe"_qs); // the last of the flood
        const QString since =
            QDateTime::fromMSecsSinceEpoch(kFloodMs + burst / 100).toString(u"hh:mm:ss"_qs);
        QCOMPARE(model.index(0, DeliveriesModel::Key).data().toString(),
                 u"19990 more rejected (401) since %1"_qs.arg(since));
        QCOMPARE(model.index(0, DeliveriesModel::Outcome).data().toString(), u"rejected"_qs);
        QCOMPARE(model.index(0, DeliveriesModel::Status).data().toInt(), 401);
        QCOMPARE(model.index(0, DeliveriesModel::Latency).data().toString(), QString());
        QVERIFY(shownText(model.index(0, DeliveriesModel::Key).data(Qt::ToolTipRole).toString())
                    .endsWith(u"reason %1"_qs.arg(kFloodMs + 199)));
        // One more kind's rejections after a real delivery: its row is brought up to date and
        // moved up by its time, above the real one, below one that came after them.
        model.append(real(100));
        for (int i = 0; i < 5; ++i)
            model.append(rejected(kFloodMs + 300, u"orders"_qs, 405));
        DeliveryEvent later = real(101);
        later.atMs = kFloodMs + 301;
        model.append(later);
        QCOMPARE(model.at(1).key, u"orders:100"_qs); // shown once the folds are applied
        model.applyFolds();
        QCOMPARE(model.at(0).key, u"orders:101"_qs);
        QVERIFY(model.isFolded(1));
        QCOMPARE(model.at(1).endpoint, u"orders"_qs);
        QCOMPARE(model.at(1).count, 7000 - burst + 5);
        QCOMPARE(model.at(2).key, u"orders:100"_qs);
        // A summary (an entry standing for many) is folded whole, whatever the budget.
        DeliveryEvent summary = rejected(kFloodMs + 400, u"stripe"_qs, 401);
        summary.count = 500;
        model.append(summary);
        model.applyFolds();
        QCOMPARE(model.at(0).endpoint, u"stripe"_qs);
        QCOMPARE(model.at(0).count, 20'000 - burst + 500);
        // Paused: a flood drops no real delivery; each is shown on resume.
        const int before = model.rowCount();
        model.setPaused(true);
        for (int i = 0; i < 5; ++i) {
            model.append(real(200 + i));
            for (int j = 0; j < 1000; ++j)
                model.append(rejected(kFloodMs + 500, u"stripe"_qs, 401));
        }
        model.applyFolds();
        QCOMPARE(model.heldCount(), 5005);
        QCOMPARE(model.rowCount(), before);
        model.setPaused(false);
        QCOMPARE(model.heldCount(), 0);
        QCOMPARE(model.at(0).count, 20'000 - burst + 500 + 5000);
        seen = census();
        QCOMPARE(seen.realKeys.size(), kReal + 2 + 5);
        QCOMPARE(seen.folded.value(u"stripe/401"_qs), 20'000 - burst + 500 + 5000);
        QCOMPARE(seen.foldedRows.value(u"stripe/401"_qs), 1);
        // Filtered: a folded row is a rejection of its endpoint.
        DeliveriesFilter filter;
        filter.setSourceModel(&model);
        filter.setOutcome(Outcome::Rejected);
        QCOMPARE(filter.rowCount(), 3 * burst + 3);
        filter.setEndpoint(u"stripe"_qs);
        QCOMPARE(filter.rowCount(), burst + 1);
        // A minute later on their clock the budget has refilled: a row of its own again.
        model.append(rejected(kFloodMs + 60'000, u"stripe"_qs, 401));
        QVERIFY(!model.isFolded(0));
        QCOMPARE(model.at(0).detail, u"reason %1"_qs.arg(kFloodMs + 60'000));
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

    void typeColumnsAndTheTypeAndSearchFilters()
    {
        Desk desk = open("[{\"name\": \"a\"}]");
        MainWindow &w = *desk.window;
        QCOMPARE(
            deliver(desk.port, "a", "o1", "{\"type\":\"order.paid\",\"customer\":\"ACME\"}").status,
            200);
        QCOMPARE(deliver(desk.port, "a", "o2", "{\"type\":\"order.shipped\",\"customer\":\"acme\"}")
                     .status,
                 200);
        QCOMPARE(deliver(desk.port, "a", "o3", "{\"type\":\"order.paid\",\"customer\":\"globex\"}")
                     .status,
                 200);
        QTRY_COMPARE(w.keys()->rowCount(), 3);
        // The Type column in Keys and Live.
        QTRY_COMPARE(
            w.keys()->index(w.keys()->rowOfKey(u"a:o2"_qs), KeysModel::Type).data().toString(),
            u"order.shipped"_qs);
        QTRY_COMPARE(w.deliveries()->rowCount(), 3);
        QCOMPARE(w.deliveries()->index(0, DeliveriesModel::Type).data().toString(),
                 u"order.paid"_qs);
        QCOMPARE(
            w.liveView()->model()->headerData(DeliveriesModel::Type, Qt::Horizontal).toString(),
            u"Type"_qs);
        // The key filter reads names: "acme" is not in one, and the window says where to look.
        QTest::keyClicks(w.textFilter(), u"acme"_qs);
        QTRY_COMPARE(w.keys()->rowCount(), 0);
        QTRY_VERIFY2(w.findStatus()->text().contains(u"No keys matching 'acme'") &&
                         w.findStatus()->text().contains(u"search box reads request bodies"),
                     qPrintable(w.findStatus()->text()));
        w.textFilter()->clear();
        // The search box reads the bodies.
        QTest::keyClicks(w.searchFilter(), u"ACME"_qs);
        QTRY_COMPARE(w.keys()->rowCount(), 2);
        QTRY_VERIFY2(w.findStatus()->text().startsWith(u"2 keys found"),
                     qPrintable(w.findStatus()->text()));
        QVERIFY(w.keys()->rowOfKey(u"a:o1"_qs) >= 0 && w.keys()->rowOfKey(u"a:o2"_qs) >= 0);
        // With the type.
        QTest::keyClicks(w.typeFilter(), u"order.paid"_qs);
        QTRY_COMPARE(w.keys()->rowCount(), 1);
        QTRY_COMPARE(w.keys()->index(0, KeysModel::Key).data().toString(), u"a:o1"_qs);
        // Nothing found: said, not an empty table alone.
        w.searchFilter()->clear();
        QTest::keyClicks(w.searchFilter(), u"initech"_qs);
        QTRY_VERIFY2(w.findStatus()->text() ==
                         u"No keys of type 'order.paid' and whose body contains 'initech'."_qs,
                     qPrintable(w.findStatus()->text()));
        QCOMPARE(w.keys()->rowCount(), 0);
        if (!qEnvironmentVariableIsEmpty("IDEM_UI_SHOT")) { // a screenshot of the Keys page
            w.searchFilter()->clear();
            QTest::keyClicks(w.searchFilter(), u"acme"_qs);
            w.typeFilter()->clear();
            QTRY_COMPARE(w.keys()->rowCount(), 2);
            QTest::qWait(int(qEnvironmentVariableIntValue("IDEM_UI_SHOT")));
        }
        QCOMPARE(m_calls.onGuiThread.load(), 0);
    }

    void aSearchGoesOnAcrossCallsUntilItsPageIsFull()
    {
        // Each find call stops on its budget (1 ms here): the model asks for the next one at
        // once, off the GUI thread, until the oldest key, the only match, is found.
        auto pool = recordedPool(u"sqlite:"_qs + m_dir.filePath(u"search.db"_qs), &m_calls);
        ClaimRequest c;
        c.endpoint = u"ep"_qs;
        c.provider = u"generic"_qs;
        c.fingerprint = "f";
        c.policy.leaseMs = 60'000;
        for (int i = 0; i < 3000; ++i) {
            c.key = u"ep:%1"_qs.arg(i, 4, 10, QLatin1Char('0'));
            c.request.body = i == 0 ? "{\"needle\":1}" : QByteArray(4000, 'x');
            QVERIFY(pool->run<ClaimResult>([&](IdempotencyStore &s) { return s.claim(c); }).ok());
        }
        KeysModel model(pool, 50);
        QAbstractItemModelTester tester(&model,
                                        QAbstractItemModelTester::FailureReportingMode::QtTest);
        model.setFindBudgetMs(1);
        QSignalSpy progress(&model, &KeysModel::findProgress);
        model.setFilter(std::nullopt, {}, {}, {}, u"needle"_qs);
        QTRY_VERIFY_WITH_TIMEOUT(model.foundAll(), 30000);
        QCOMPARE(model.rowCount(), 1);
        QCOMPARE(model.index(0, KeysModel::Key).data().toString(), u"ep:0000"_qs);
        QCOMPARE(model.scanned(), 3000);
        QVERIFY2(progress.count() > 1, qPrintable(QString::number(progress.count())));
        QCOMPARE(m_calls.onGuiThread.load(), 0);
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
        // The pool's one worker runs jobs in order: a delete submitted before this read ran before
        // it.
        QVERIFY(desk.pool
                    ->run<std::optional<KeyRecord>>(
                        [](IdempotencyStore &s) { return s.key(u"d:x1"_qs); })
                    ->has_value());
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
        // The delivery is held at the downstream past its forward timeout: no answer, so the key
        // stays processing until its lease ends. Force-fail is refused until then (a run may be
        // going), and taken after.
        idem::test::CountingDownstream down;
        down.closeGate();
        Desk desk = open("[{\"name\": \"slow\", \"forward_timeout_seconds\": 1, \"lease_seconds\": "
                         "3, \"forward_to\": \"" +
                         down.url().toString().toUtf8() + "\"}]");
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
        QSignalSpy finished(&w, &MainWindow::actionFinished);
        answerNextMessageBox(QMessageBox::Yes);
        w.forceFailAction()->trigger();
        QTRY_COMPARE(finished.count(), 1);
        QVERIFY2(finished.first().first().toString().contains(u"its lease has not ended"_qs),
                 qPrintable(finished.first().first().toString()));
        QCOMPARE(name(w.detail()->current().state), name(KeyState::Processing));
        t.join();
        QCOMPARE(slow.status, 504);
        QTRY_VERIFY_WITH_TIMEOUT(w.detail()->summaryText().contains(u"stuck"_qs), 10000);
        answerNextMessageBox(QMessageBox::Yes);
        w.forceFailAction()->trigger();
        QTRY_COMPARE(name(w.detail()->current().state), name(KeyState::Failed));
        down.openGate();
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
        const QString curl = desk.window->curlFor(r)->text;
        QVERIFY2(curl.contains(u"--data-raw '@/etc/passwd'"_qs) && !curl.contains(u"--data-binary"_qs), qPrintable(curl));
        QVERIFY2(curl.contains(u"--globoff"_qs), qPrintable(curl));
    }

    void copyAsCurlRunsCurlWithTheStoredBytesAndNothingElse_data()
    {
        QTest::addColumn<QString>("shell");
        QTest::newRow("bash") << u"bash"_qs;
        QTest::newRow("sh") << u"sh"_qs; // dash on Debian: POSIX alone
    }
    void copyAsCurlRunsCurlWithTheStoredBytesAndNothingElse()
    {
        // What a shared store may hold, or an import took: a method that is an RFC 9110 token
        // and shell syntax, values that run commands unquoted, an ESC that ends a terminal's
        // bracketed paste followed by Ctrl-U, bidi controls, bytes that are not UTF-8, a body
        // with NUL and final line breaks. The copied command, run by a shell with curl replaced
        // by a recorder, runs curl with exactly the stored bytes, and nothing else.
        QFETCH(QString, shell);
        Desk desk = open("[{\"name\": \"c\"}]");
        QTemporaryDir run;
        QVERIFY(QDir(run.path()).mkpath(u"bin"_qs) && QDir(run.path()).mkpath(u"work"_qs));
        QFile recorder(run.filePath(u"bin/curl"_qs));
        QVERIFY(recorder.open(QIODevice::WriteOnly));
        recorder.write("#!/bin/sh\n: > \"$CURL_ARGS\"\n"
                       "for a in \"$@\"; do printf '%s\\0' \"$a\" >> \"$CURL_ARGS\"; done\n"
                       "cat > \"$CURL_STDIN\"\n");
        recorder.close();
        QVERIFY(recorder.setPermissions(QFileDevice::ReadOwner | QFileDevice::WriteOwner |
                                        QFileDevice::ExeOwner));
        const HeaderList headers{{"X-Sub", "$(touch pwned) `touch pwned` ${IFS}"},
                                 {"X-Quote", "it's'; touch pwned; '"},
                                 {"X-Paste", "\x1b[201~\x15touch pwned"},
                                 {"X-Bidi", "\xe2\x80\xae"
                                            "desrever"},
                                 {"X-Latin1", "caf\xe9"},
                                 {"X-Empty", ""},
                                 {"Authorization", "Bearer hunter2"},
                                 {"Bad Name", "v"},
                                 {"@headers.txt", "v"},
                                 {"X-Split", "a\r\nInjected: 1"}};
        const QByteArray printableBody = "{\"it's\": \"$(touch pwned)\",\n \"a\": \"`id`\"}\n";
        static const char binary[] = "-\x00"
                                     "1\x1b[201~\ntouch pwned\n\n";
        const QByteArray binaryBody(binary, sizeof binary - 1);
        const auto put = [&](const QString &id, const QByteArray &method, const QByteArray &body) {
            KeyRecord r;
            r.key = u"c:"_qs + id;
            r.endpoint = u"c"_qs;
            r.provider = u"generic"_qs;
            r.state = KeyState::Completed;
            r.fingerprint = QCryptographicHash::hash(body, QCryptographicHash::Sha256).toHex();
            r.attempts = 1;
            r.createdMs = r.updatedMs = wallMs();
            r.request = {method, "/hooks/c?q=$(touch${IFS}pwned)&r='x'&s=\x1b", headers, body};
            r.result.status = 200;
            return desk.pool
                ->run<ImportVerdict>(
                    [&](IdempotencyStore &store) { return store.importRecord(r, 3'600'000, 0); })
                .ok();
        };
        QVERIFY(put(u"token-method"_qs, "`touch$IFS.pwned`", printableBody));
        QVERIFY(put(u"binary-body"_qs, "POST", binaryBody));
        QVERIFY(put(u"no-method"_qs, "POST $(touch pwned)", printableBody));
        MainWindow &w = *desk.window;
        const QByteArray url = "http://127.0.0.1:" + QByteArray::number(desk.port) +
                               "/hooks/c?q=$(touch${IFS}pwned)&r='x'&s=%1B";

        const auto copied = [&](const QString &key) {
            selectAndWait(w, key);
            QApplication::clipboard()->clear();
            w.copyCurlAction()->trigger();
            return QApplication::clipboard()->text();
        };
        // Runs the command; returns curl's arguments and standard input.
        const auto runIt = [&](const QString &command) -> std::pair<QList<QByteArray>, QByteArray> {
            QProcess p;
            QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
            env.insert(u"PATH"_qs, run.filePath(u"bin"_qs) + u':' + env.value(u"PATH"_qs));
            env.insert(u"CURL_ARGS"_qs, run.filePath(u"args"_qs));
            env.insert(u"CURL_STDIN"_qs, run.filePath(u"stdin"_qs));
            p.setProcessEnvironment(env);
            p.setWorkingDirectory(run.filePath(u"work"_qs));
            p.start(shell, {u"-c"_qs, command});
            p.closeWriteChannel();
            if (!p.waitForFinished(20000) || p.exitCode() != 0)
                qWarning("%s", p.readAllStandardError().constData());
            QFile args(run.filePath(u"args"_qs)), in(run.filePath(u"stdin"_qs));
            if (!args.open(QIODevice::ReadOnly) || !in.open(QIODevice::ReadOnly))
                return {};
            QList<QByteArray> list = args.readAll().split('\0');
            list.removeLast(); // after the last NUL
            return {list, in.readAll()};
        };
        const auto pasteSafe = [](const QString &command) {
            for (const char32_t c : command.toUcs4()) {
                const auto category = QChar::category(c);
                if ((c != u'\n' && category == QChar::Other_Control) ||
                    category == QChar::Other_Format || category == QChar::Separator_Line ||
                    category == QChar::Separator_Paragraph)
                    return false;
            }
            return true;
        };
        const QList<QByteArray> headerArgs{"-H",
                                           "X-Sub: $(touch pwned) `touch pwned` ${IFS}",
                                           "-H",
                                           "X-Quote: it's'; touch pwned; '",
                                           "-H",
                                           "X-Bidi: \xe2\x80\xae"
                                           "desrever",
                                           "-H",
                                           "X-Latin1: caf\xe9",
                                           "-H",
                                           "X-Empty;",
                                           "-H",
                                           "Authorization: \xe2\x80\xa2\xe2\x80\xa2\xe2\x80"
                                           "\xa2\xe2\x80\xa2 (masked)"};

        QSignalSpy finished(&w, &MainWindow::actionFinished);
        QString command = copied(u"c:token-method"_qs);
        QVERIFY2(pasteSafe(command), qPrintable(command));
        // The store read no field that is not valid HTTP (X-Paste's ESC, the two names, the
        // CR LF): nothing reaches the command to leave out.
        QVERIFY2(!finished.last().first().toString().contains(u"left out"_qs),
                 qPrintable(finished.last().first().toString()));
        auto [args, in] = runIt(command);
        QList<QByteArray> expected{"-i", "--globoff", "-X", "`touch$IFS.pwned`", url};
        const QList<QByteArray> inlineBody{"--data-raw", printableBody};
        QCOMPARE(args, expected + headerArgs + inlineBody);
        QCOMPARE(in, QByteArray());
        QCOMPARE(QDir(run.filePath(u"work"_qs))
                     .entryList(QDir::AllEntries | QDir::Hidden | QDir::NoDotAndDotDot),
                 QStringList());

        command = copied(u"c:binary-body"_qs);
        QVERIFY2(pasteSafe(command), qPrintable(command));
        std::tie(args, in) = runIt(command);
        expected[3] = "POST";
        const QList<QByteArray> pipedBody{"--data-binary", "@-"};
        QCOMPARE(args, expected + headerArgs + pipedBody);
        QCOMPARE(in, binaryBody);
        QCOMPARE(QDir(run.filePath(u"work"_qs))
                     .entryList(QDir::AllEntries | QDir::Hidden | QDir::NoDotAndDotDot),
                 QStringList());

        // The command itself, given such fields whatever their source: what curl cannot send
        // is left out and counted, a control in a value goes in as printf escapes.
        const auto direct =
            curlCommand(StoredRequest{"POST", "/hooks/c", headers, printableBody},
                        QString::fromLatin1(url.left(url.indexOf("/hooks"))));
        QVERIFY(direct.ok());
        QCOMPARE(direct->headersLeftOut, 3);
        QVERIFY2(pasteSafe(direct->text), qPrintable(direct->text));
        std::tie(args, in) = runIt(direct->text);
        QVERIFY2(args.contains("X-Paste: \x1b[201~\x15touch pwned"),
                 qPrintable(QString::fromLatin1(args.join(' '))));
        QVERIFY(!args.contains("X-Split: a\r\nInjected: 1"));

        // A method that is not a token is never put into a command.
        QCOMPARE(copied(u"c:no-method"_qs), QString());
        QVERIFY2(finished.last().first().toString().startsWith(u"Not copied"_qs) &&
                     !finished.last().at(1).toBool(),
                 qPrintable(finished.last().first().toString()));
    }

    void aLongBodyIsPipedNotPassedAsOneArgument()
    {
        // Linux refuses one argument over 128 KiB at exec: a 1 MiB body is piped in by printf.
        KeyRecord r;
        r.request = {"POST", "/hooks/c", {}, QByteArray(1 << 20, 'a')};
        const auto curl = curlCommand(r.request, u"http://127.0.0.1:1"_qs);
        QVERIFY(curl.ok());
        QVERIFY2(curl->text.startsWith(u"printf '"_qs) &&
                     curl->text.endsWith(u"--data-binary @-"_qs),
                 qPrintable(curl->text.right(200)));
    }

    void whatASenderOrAStoreWroteIsShownAsText()
    {
        // A key is any printable ASCII a sender chooses, and a shared store holds any endpoint,
        // provider and error: rich text shows them as the characters they are (a link in a key
        // is no link), with their controls escaped, in the detail, the tooltips, the action
        // results, the confirmations and the desktop notifications.
        const QString link = u"<a href='http://evil.example/'>click</a>"_qs;
        const QString key = u"<b>ep</b>:"_qs + link;
        TrayMonitor tray(0);
        QSignalSpy notes(&tray, &TrayMonitor::notify);
        tray.setCounts(0, 0);
        DeliveryEvent failed;
        failed.key = key + u"\u202e\x1b[2J"_qs;
        failed.outcome = Outcome::Processed;
        failed.status = 500;
        tray.delivered(failed);
        QCOMPARE(notes.count(), 1);
        QCOMPARE(shownText(notes.last().at(1).toString()),
                 key + u"\\u202e\\u001b[2J failed (500)"_qs);

        Desk desk = open("[{\"name\": \"c\"}]");
        const auto put = [&](const QString &k, KeyState state) {
            KeyRecord r;
            r.key = k;
            r.endpoint = u"<b>ep</b>"_qs;
            r.provider = u"<img src='x'>gen"_qs;
            r.state = state;
            r.fingerprint = QCryptographicHash::hash("{}", QCryptographicHash::Sha256).toHex();
            r.attempts = 1;
            r.createdMs = r.updatedMs = wallMs();
            r.request = {"POST", "/hooks/c", {}, "{}"};
            r.result.status = 500;
            r.error = link + u"\nforged line"_qs;
            return desk.pool
                ->run<ImportVerdict>(
                    [&](IdempotencyStore &store) { return store.importRecord(r, 3'600'000, 0); })
                .ok();
        };
        QVERIFY(put(key, KeyState::Failed));
        QVERIFY(put(key + u"2"_qs, KeyState::Completed));
        MainWindow &w = *desk.window;
        selectAndWait(w, key);
        const QString summary = shownText(w.detail()->summaryText(), Qt::RichText);
        QVERIFY2(summary.contains(u"endpoint <b>ep</b> (<img src='x'>gen)"_qs) &&
                     summary.contains(u"error: "_qs + link + u"\\u000aforged line"_qs),
                 qPrintable(summary));
        const auto labelShowing = [&](const QString &text) {
            for (const QLabel *label : w.detail()->findChildren<QLabel *>())
                if (shownText(label->text(), label->textFormat()).contains(text))
                    return true;
            return false;
        };
        QVERIFY(labelShowing(key)); // the title
        const int row = w.keys()->rowOfKey(key);
        QCOMPARE(shownText(w.keys()->index(row, KeysModel::Key).data(Qt::ToolTipRole).toString()),
                 key);
        QCOMPARE(shownText(w.keys()->index(row, KeysModel::State).data(Qt::ToolTipRole).toString()),
                 link + u"\nforged line"_qs);
        // An action's result names the key: the banner above the tabs.
        w.copyCurlAction()->trigger();
        QVERIFY(labelShowing(u"Copied a curl command for "_qs + key));
        // A confirmation names it too.
        selectAndWait(w, key + u"2"_qs);
        QString asked;
        Qt::TextFormat askedFormat = Qt::AutoText;
        auto *timer = new QTimer(this);
        timer->setInterval(20);
        connect(timer, &QTimer::timeout, timer, [&, timer] {
            if (auto *box = qobject_cast<QMessageBox *>(QApplication::activeModalWidget())) {
                asked = box->text();
                askedFormat = box->textFormat();
                box->button(QMessageBox::Cancel)->click();
                timer->deleteLater();
            }
        });
        timer->start();
        w.retryAction()->trigger();
        QTRY_VERIFY(!asked.isEmpty());
        QVERIFY2(shownText(asked, askedFormat).startsWith(key + u"2 is completed."_qs),
                 qPrintable(asked));
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

    void settingsKeepARedisClusterUrl()
    {
        // redis-cluster:// names several hosts (QUrl holds one): Settings, opened from the
        // window of a desk configured with one, never shows its password, and Save without an
        // edit writes the URL exactly as it was.
        const QString withUser =
            u"redis-cluster://desk:s3cret@127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002?prefix=app:&wait_replicas=1"_qs;
        for (const QString &url :
             {u"redis-cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002"_qs,
              u"redis-cluster://:s3cret@127.0.0.1:7000,127.0.0.1:7001"_qs, withUser}) {
            Desk desk = open("[{\"name\": \"c\"}]", url);
            const QString path =
                m_dir.filePath(u"cfg%1.json"_qs.arg(m_seq)); // the desk's config file
            desk.window->settingsAction()->trigger();
            SettingsDialog *dialog = nullptr;
            QTRY_VERIFY((dialog = desk.window->findChild<SettingsDialog *>()) &&
                        dialog->isVisible());
            const QString shown = dialog->storeEdit()->text();
            QVERIFY2(!shown.contains(u"s3cret"_qs), qPrintable(shown));
            QVERIFY2(shown.contains(u"127.0.0.1:7000,127.0.0.1:7001"_qs), qPrintable(shown));
            if (url.contains(u"s3cret"_qs))
                QVERIFY2(shown.contains(u":***@"_qs), qPrintable(shown));
            else
                QCOMPARE(shown, url);
            dialog->findChild<QDialogButtonBox *>()->button(QDialogButtonBox::Save)->click();
            QTRY_VERIFY(!desk.window->findChild<SettingsDialog *>()); // saved, closed, deleted
            auto saved = Config::load(path);
            QVERIFY2(saved.ok(), saved.ok() ? "" : qPrintable(saved.error().message));
            QCOMPARE(saved->store, url);
        }

        // An edit of one host keeps the others, the options and the password; a password typed
        // over the *** replaces it.
        auto config = Config::parse("{\"endpoints\": [{\"name\": \"c\"}]}", u"ui"_qs);
        QVERIFY(config.ok());
        SettingsDialog dialog(*config, withUser, m_dir.filePath(u"cluster-edit.json"_qs));
        QLineEdit *store = dialog.storeEdit();
        store->setText(store->text().replace(u"127.0.0.1:7001"_qs, u"127.0.0.1:7005"_qs));
        QVERIFY2(!store->text().contains(u"s3cret"_qs), qPrintable(store->text()));
        QCOMPARE(dialog.storeUrl(),
                 QString(withUser).replace(u"127.0.0.1:7001"_qs, u"127.0.0.1:7005"_qs));
        store->setText(store->text().replace(u"***"_qs, u"n3w"_qs));
        QCOMPARE(
            dialog.storeUrl(),
            u"redis-cluster://desk:n3w@127.0.0.1:7000,127.0.0.1:7005,127.0.0.1:7002?prefix=app:&wait_replicas=1"_qs);
        QVERIFY(dialog.save());
        auto saved = Config::load(m_dir.filePath(u"cluster-edit.json"_qs));
        QVERIFY(saved.ok());
        QCOMPARE(saved->store, dialog.storeUrl());
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

    void closingTheStormDialogNeverWaitsForTheStorm()
    {
        // The storm's deliveries take 3 s each; closing the dialog at once returns at once: the
        // key is still being processed when the dialog is gone (a wait would have seen it done).
        Desk desk = open("[{\"name\": \"slow\", \"simulate\": {\"delay_ms\": 3000}}]");
        auto *dialog = new StormDialog(desk.receiver->engine()->config(),
                                       u"http://"_qs + desk.receiver->address().toString());
        dialog->copies()->setValue(1);
        dialog->keys()->setValue(1);
        dialog->start();
        QTRY_COMPARE(desk.window->keys()->rowCount(), 1); // claimed: the processor is at work
        QTRY_COMPARE(desk.receiver->engine()->counters().inFlight, 1);
        delete dialog;
        QCOMPARE(desk.receiver->engine()->counters().inFlight, 1); // still answering it
        QTRY_COMPARE_WITH_TIMEOUT(
            desk.receiver->engine()->counters().byOutcome[size_t(Outcome::Processed)], 1, 15000);
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

    // A store that cannot be reached at start: the box says why and offers to try again, the
    // settings (another store, saved for the next start) or to quit, never just exits
    // (docs/configuration.md#the-windows-settings).
    void anUnreachableStoreAtStartOffersTheSettings()
    {
        Config config = Config::builtin();
        QString storeUrl = u"redis://127.0.0.1:1/0"_qs;
        QString configPath = m_dir.filePath(u"start.json"_qs);
        const QString other = u"sqlite:"_qs + m_dir.filePath(u"start.db"_qs);
        QStringList boxes;
        QStringList clicks{u"Try Again"_qs, u"Settings…"_qs};
        QTimer driver;
        driver.setInterval(20);
        connect(&driver, &QTimer::timeout, this, [&] {
            QWidget *modal = QApplication::activeModalWidget();
            if (auto *box = qobject_cast<QMessageBox *>(modal)) {
                boxes << box->text();
                const QString click = clicks.isEmpty() ? u"Quit"_qs : clicks.takeFirst();
                for (QAbstractButton *b : box->buttons())
                    if (b->text() == click)
                        return b->click();
                box->reject();
            } else if (auto *settings = qobject_cast<SettingsDialog *>(modal)) {
                settings->storeEdit()->setText(other);
                settings->findChild<QDialogButtonBox *>(QString(), Qt::FindDirectChildrenOnly)
                    ->button(QDialogButtonBox::Save)
                    ->click();
            }
        });
        driver.start();
        const std::shared_ptr<StorePool> pool = openStoreOrAsk(config, storeUrl, configPath);
        QVERIFY(pool);
        QCOMPARE(boxes.size(), 2); // tried again (still unreachable), then the settings
        QVERIFY2(boxes.first().contains(u"cannot connect to Redis"_qs), qPrintable(boxes.first()));
        QCOMPARE(storeUrl, other);
        QCOMPARE(Config::load(configPath)->store, other);
        QVERIFY(pool->run<Ok>([](IdempotencyStore &s) -> Result<Ok> {
            if (auto ping = s.ping(); !ping)
                return ping.error();
            return Ok{};
        }));

        storeUrl = u"redis://127.0.0.1:1/0"_qs; // and Quit: nothing opened
        boxes.clear();
        QVERIFY(!openStoreOrAsk(config, storeUrl, configPath));
        QCOMPARE(boxes.size(), 1);
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

        // Watching without the desk's config file, the window does not know the endpoint's
        // processor: Retry refuses (the built-in config's would simulate a completion) and the
        // key stays failed.
        const QString failedKey = u"shared:fails"_qs;
        auto config2 = *Config::parse("{\"endpoints\": [{\"name\": \"shared\", \"simulate\": {\"fail_rate\": 1}}]}", u"c"_qs);
        Receiver failing(config2, otherPool);
        const quint16 failingPort = failing.start(any)->port;
        QCOMPARE(deliver(failingPort, "shared", "fails").status, 500);
        window.refreshAction()->trigger();
        QTRY_VERIFY_WITH_TIMEOUT(window.keys()->rowOfKey(failedKey) >= 0, 5000);
        window.selectKey(failedKey);
        QTRY_COMPARE(window.detail()->current().key, failedKey);
        QSignalSpy done(&window, &MainWindow::actionFinished);
        window.retryAction()->trigger();
        QTRY_VERIFY(done.count() >= 2);
        QVERIFY2(done.last().at(0).toString().contains(u"--config FILE"), qPrintable(done.last().at(0).toString()));
        QVERIFY(!done.last().at(1).toBool());
        QCOMPARE(name((*otherPool->run<std::optional<KeyRecord>>([&](IdempotencyStore &s) { return s.key(failedKey); }))->state),
                 name(KeyState::Failed));
    }

    // A page the store refused is asked for again (the next scroll, a second later): it was
    // taken for the end of the list, and no page more was read until the filter changed.
    void aRefusedPageIsAskedForAgain()
    {
        const Generated g = generated(u"pages"_qs, 1000);
        MainWindow &window = *g.window;
        KeysModel *keys = window.keys();
        QTRY_COMPARE(keys->rowCount(), 200);
        m_calls.failPages = 1;
        QTRY_VERIFY(keys->canFetchMore({}));
        keys->fetchMore({});
        QTRY_VERIFY(m_calls.failPages.load() <= 0); // refused
        QCOMPARE(keys->rowCount(), 200);
        QTRY_VERIFY_WITH_TIMEOUT(keys->canFetchMore({}), 5000);
        keys->fetchMore({});
        QTRY_COMPARE(keys->rowCount(), 400);
    }

    // One refused call among good ones: the status bar says degraded, with how many failed and
    // why, through the refreshes that follow (it said unavailable, then healthy at the next
    // refresh: it flapped with a part of the store failing).
    void theStatusBarSaysAPartlyFailingStoreIsDegraded()
    {
        const Generated g = generated(u"degraded"_qs, 1000);
        MainWindow &window = *g.window;
        KeysModel *keys = window.keys();
        QTRY_COMPARE(keys->rowCount(), 200);
        QTRY_VERIFY(window.statusText().contains(u"● healthy"_qs));
        m_calls.failPages = 1;
        QTRY_VERIFY(keys->canFetchMore({}));
        keys->fetchMore({});
        QTRY_VERIFY(m_calls.failPages.load() <= 0); // refused
        QSignalSpy loaded(keys, &KeysModel::loaded);
        QTRY_VERIFY_WITH_TIMEOUT(loaded.count() >= 2, 10000); // two refreshes went through since
        QVERIFY2(window.statusText().contains(u"● degraded"_qs), qPrintable(window.statusText()));
        const QString why = window.findChild<QLabel *>(u"storeHealth"_qs)->toolTip();
        QVERIFY2(why.contains(u"1 of the last"_qs) && why.contains(u"(injected)"_qs),
                 qPrintable(why));
    }

    // Rows loaded past the 5000 a refresh reads again stay, and so does the selection among
    // them: the model was reset every second, back to 5000 rows and no selection.
    void rowsPastTheRefreshStayLoaded()
    {
        const Generated g = generated(u"deep"_qs, 5400);
        MainWindow &window = *g.window;
        KeysModel *keys = window.keys();
        QSignalSpy loaded(keys, &KeysModel::loaded);
        loadRows(keys, 5400);
        QCOMPARE(keys->rowCount(), 5400);
        const QString deep = keys->index(5399, KeysModel::Key).data().toString();
        selectAndWait(window, deep);
        QSignalSpy resets(keys, &QAbstractItemModel::modelReset);
        loaded.clear();
        QTRY_VERIFY_WITH_TIMEOUT(loaded.count() >= 2, 10000); // two refreshes
        QCOMPARE(resets.count(), 0);
        QCOMPARE(keys->rowCount(), 5400);
        QCOMPARE(window.detail()->currentKey(), deep);
        QCOMPARE(window.keysTable()->selectionModel()->selectedRows().size(), 1);
    }

    // New keys under traffic join the top of the table as a change of its layout, not a reset:
    // the rows loaded past the 5000 a refresh reads stay, the selection and the view's place
    // stay, and a page read after the list moved down shows no key twice. (A reset every second:
    // back to the top and to 5000 rows, then the same rows loaded again.)
    void newKeysKeepTheTablesPlace()
    {
        const Generated g = generated(u"traffic"_qs, 5400);
        MainWindow &window = *g.window;
        KeysModel *keys = window.keys();
        QAbstractItemModelTester tester(keys,
                                        QAbstractItemModelTester::FailureReportingMode::QtTest);
        QSignalSpy loaded(keys, &KeysModel::loaded);
        loadRows(keys, 5000);
        QCOMPARE(keys->rowCount(), 5000);
        // The list moves down by 30 before the next page: it starts with rows loaded already.
        for (int i = 0; i < 30; ++i)
            QVERIFY(claim(*g.pool, u"early_%1"_qs.arg(i)));
        const auto whole = [keys] {
            return keys->rowCount() >= 5430 &&
                   keys->index(0, KeysModel::Key).data().toString().contains(u"early"_qs);
        };
        const auto shownOnce = [keys] {
            QSet<QString> shown;
            for (int row = 0; row < keys->rowCount(); ++row)
                shown.insert(keys->index(row, KeysModel::Key).data().toString());
            return shown.size() == keys->rowCount();
        };
        for (int page = 0; page < 100 && !whole(); ++page) {
            if (keys->canFetchMore({}))
                keys->fetchMore({});
            loaded.wait(2000);
            QVERIFY(shownOnce()); // a page that arrived before the refresh, too
        }
        QCOMPARE(keys->rowCount(), 5430);
        const QString deep = keys->index(5429, KeysModel::Key).data().toString();
        selectAndWait(window, deep);
        QTableView *table = window.keysTable();
        table->scrollToBottom();
        QTRY_VERIFY(table->verticalScrollBar()->value() > 0);
        const int at = table->verticalScrollBar()->value();
        QSignalSpy resets(keys, &QAbstractItemModel::modelReset);
        QVERIFY(claim(*g.pool, u"new_1"_qs));
        QTRY_COMPARE_WITH_TIMEOUT(keys->index(0, KeysModel::Key).data().toString(), u"big:new_1"_qs,
                                  10000);
        QCOMPARE(resets.count(), 0);
        QCOMPARE(keys->rowCount(), 5431);
        QVERIFY(shownOnce());
        QCOMPARE(window.detail()->currentKey(), deep);
        const QModelIndexList selected = table->selectionModel()->selectedRows();
        QCOMPARE(selected.size(), 1);
        QCOMPARE(selected.first().data().toString(), deep);
        QVERIFY2(table->verticalScrollBar()->value() >= at,
                 qPrintable(u"%1 < %2"_qs.arg(table->verticalScrollBar()->value()).arg(at)));
    }

    // A key deleted from a list longer than the rows loaded leaves the table at the next refresh
    // (it was kept as if pushed past the window: the window's last row was then one never
    // loaded, and every loaded row missing from it passed for pushed; the rows grew by one a
    // refresh each).
    void deletedKeysLeaveTheTable()
    {
        const QString url = u"sqlite:"_qs + m_dir.filePath(u"deleted.db"_qs);
        generateSqliteKeys(url.mid(7), 3000);
        auto pool = recordedPool(url, &m_calls);
        // No view, no model tester (it asks for pages): no page is read but the first.
        KeysModel keys(pool, 200);
        QSignalSpy loaded(&keys, &KeysModel::loaded);
        keys.setFilter(std::nullopt, {}, {});
        QTRY_COMPARE(keys.rowCount(), 200); // of 3000
        for (int round = 0; round < 3; ++round) {
            // The first round only deletes: the refreshed window then ends on a row never loaded.
            for (int i = 0; round > 0 && i < 7; ++i)
                QVERIFY(claim(*pool, u"new%1_%2"_qs.arg(round).arg(i)));
            QStringList deleted;
            for (int i = 0; i < 3; ++i) {
                deleted << keys.index(20 + 13 * i + round, KeysModel::Key).data().toString();
                QVERIFY(pool->run<OperatorVerdict>([&](IdempotencyStore &s) {
                                return s.applyOperator(deleted.last(), OperatorAction::Delete,
                                                       false, {});
                            })
                            .ok());
            }
            loaded.clear();
            keys.refresh();
            QTRY_COMPARE(loaded.count(), 1);
            for (const QString &key : std::as_const(deleted))
                QVERIFY2(keys.rowOfKey(key) < 0, qPrintable(key));
            QCOMPARE(keys.rowCount(), 200);
            if (round > 0)
                QCOMPARE(keys.index(0, KeysModel::Key).data().toString(),
                         u"big:new%1_6"_qs.arg(round));
        }
    }

    // A page is not asked for while a refresh is out: asked before the refresh's rows came in,
    // the keys they bring were counted as moved down twice, and past the 5000 a refresh reads
    // the next page skipped as many rows for good (30 of 6030 never shown).
    void noPageIsSkippedWhileARefreshIsOut()
    {
        const Generated g = generated(u"race"_qs, 6000);
        KeysModel *keys = g.window->keys();
        loadRows(keys, 5400);
        QTRY_VERIFY(!keys->isLoading());
        for (int i = 0; i < 30; ++i)
            QVERIFY(claim(*g.pool, u"early_%1"_qs.arg(i)));
        QSignalSpy loaded(keys, &KeysModel::loaded);
        keys->refresh();
        if (keys->canFetchMore({})) // as the view does when scrolled to the end
            keys->fetchMore({});
        QTRY_VERIFY_WITH_TIMEOUT(loaded.count() >= 1 && !keys->isLoading(), 10000);
        loadRows(keys, 6030); // the rest, as the view asks (never while a refresh is out)
        QSet<QString> shown;
        for (int row = 0; row < keys->rowCount(); ++row)
            shown.insert(keys->index(row, KeysModel::Key).data().toString());
        QCOMPARE(shown.size(), keys->rowCount());
        QCOMPARE(keys->rowCount(), 6030);
    }

    // The detail is shown again every second, but what did not change is not drawn again: the
    // body stays scrolled where the user left it (it went back to the top, its selection lost,
    // and a megabyte body held the window over a second each time). A body is shown up to 256K
    // characters, saying what is left out.
    void detailIsNotDrawnAgainUnchanged()
    {
        QByteArray body = "{";
        for (int i = 0; i < 400; ++i)
            body += (i ? ",\"f" : "\"f") + QByteArray::number(i) + "\": \"" + QByteArray(700, 'x') +
                    "\"";
        body += "}";
        const Generated g = generated(u"bodies"_qs, 3, body);
        MainWindow &window = *g.window;
        selectAndWait(window, u"big:evt_1"_qs);
        QPlainTextEdit *shown = window.detail()->requestBodyView();
        const QString text = shown->toPlainText();
        QVERIFY2(text.size() < 270'000 && text.contains(u"more characters not shown"_qs),
                 qPrintable(text.right(200)));
        QScrollBar *scroll = shown->verticalScrollBar();
        QTRY_VERIFY(scroll->maximum() > 100);
        scroll->setValue(scroll->maximum() - 3);
        const int at = scroll->value();
        QSignalSpy shownAgain(&window, &MainWindow::detailLoaded);
        QTRY_VERIFY_WITH_TIMEOUT(shownAgain.count() >= 2, 10000);
        QCOMPARE(scroll->value(), at);
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

    // The reviewer's store: 10,000 processed deliveries 20 to 40 minutes ago, then 60,000
    // replayed in a 30 s burst (two minutes ago). "Last hour" counts them all (a read of the newest
    // 50,000 showed processed 0); one read past its cap says where its counts start.
    void trafficCountsTheWholeWindow()
    {
        const QString url = u"sqlite:"_qs + m_dir.filePath(u"traffic-window.db"_qs);
        auto pool = recordedPool(url, &m_calls);
        const qint64 now = wallMs();
        QList<DeliveryEvent> log;
        for (int i = 0; i < 70'000; ++i) {
            DeliveryEvent e;
            const bool old = i < 10'000;
            e.atMs =
                old ? now - 40 * 60'000 + qint64(i) * 120 : now - 150'000 + qint64(i - 10'000) / 2;
            e.endpoint = u"t"_qs;
            e.key = u"t:%1"_qs.arg(old ? i : i % 100);
            e.outcome = old ? Outcome::Processed : Outcome::Replayed;
            e.status = 200;
            log << e;
        }
        QVERIFY(pool->run<void>([&](IdempotencyStore &s) { return s.appendDeliveries(log); }).ok());

        // Every store call waits for two turns of the GUI thread (see aMillionKeysStayResponsive).
        QTimer heartbeat;
        connect(&heartbeat, &QTimer::timeout, this, [this] { ++m_calls.heartbeat; });
        heartbeat.start(5);
        m_calls.watchGui = true;
        TrafficView view(pool);
        const auto unwatch = qScopeGuard([this] { m_calls.watchGui = false; });
        view.resize(1000, 700);
        view.show();
        view.windowChoice()->setCurrentIndex(2); // last hour
        QTRY_COMPARE_WITH_TIMEOUT(view.total(Outcome::Replayed), 60'000, 30000);
        QTRY_COMPARE_WITH_TIMEOUT(view.total(Outcome::Processed), 10'000, 30000);
        QCOMPARE(view.partialNotice(), QString());
        qint64 inBars = 0;
        for (int b = 0; b < view.bucketCount(); ++b)
            inBars +=
                view.bucketCount(b, Outcome::Processed) + view.bucketCount(b, Outcome::Replayed);
        QCOMPARE(inBars, 70'000);
        QTRY_COMPARE(view.ratios()->rowCount(), 1);
        QCOMPARE(view.ratios()->item(0, 1)->text(), u"70000"_qs);
        QCOMPARE(view.ratios()->item(0, 4)->data(Qt::UserRole).toDouble(), 60'000.0 / 70'000.0);
        QCOMPARE(m_calls.guiWaited.load(), 0);
        QCOMPARE(m_calls.onGuiThread.load(), 0);

        // A read capped below the window's deliveries: the newest are counted, and the view says
        // from when.
        view.setReadCap(25'000);
        view.windowChoice()->setCurrentIndex(3); // last 24 hours
        QTRY_VERIFY_WITH_TIMEOUT(!view.partialNotice().isEmpty(), 30000);
        QVERIFY2(view.partialNotice().contains(u"Counts start at"_qs),
                 qPrintable(view.partialNotice()));
        QCOMPARE(view.total(Outcome::Processed), 0);
        QVERIFY2(view.total(Outcome::Replayed) >= 25'000 && view.total(Outcome::Replayed) < 60'000,
                 qPrintable(QString::number(view.total(Outcome::Replayed))));
        // Its time is the oldest counted delivery's second.
        const qint64 counted = view.total(Outcome::Replayed);
        const qint64 fromMs = now - 120'000 - counted / 2; // the burst has two a millisecond
        const QString from = QDateTime::fromMSecsSinceEpoch(fromMs).toString(u"hh:mm:ss"_qs);
        QVERIFY2(view.partialNotice().contains(from),
                 qPrintable(view.partialNotice() + u" / "_qs + from));
        // Back under the cap (the last minute holds none of these): no notice.
        view.setReadCap(TrafficView::kReadCap);
        view.windowChoice()->setCurrentIndex(0);
        QTRY_COMPARE_WITH_TIMEOUT(view.total(Outcome::Replayed), 0, 10000);
        QCOMPARE(view.partialNotice(), QString());
    }

    // A flood of rejected deliveries is logged as a few entries one by one and summaries that
    // carry their count (IdempotencyEngine): the bars and totals count every delivery.
    void trafficCountsASummarysDeliveries()
    {
        const QString url = u"sqlite:"_qs + m_dir.filePath(u"traffic-summary.db"_qs);
        auto pool = recordedPool(url, &m_calls);
        const qint64 now = wallMs();
        QList<DeliveryEvent> log;
        for (int i = 0; i < 3; ++i) {
            DeliveryEvent e;
            e.atMs = now - 20'000 + i * 5000;
            e.endpoint = u"s"_qs;
            e.outcome = Outcome::Rejected;
            e.status = 401;
            e.count = i == 1 ? 1 : 2000 + i; // 2000, 1, 2002
            log << e;
        }
        QVERIFY(pool->run<void>([&](IdempotencyStore &s) { return s.appendDeliveries(log); }).ok());
        TrafficView view(pool);
        view.windowChoice()->setCurrentIndex(0); // last minute
        QTRY_COMPARE_WITH_TIMEOUT(view.total(Outcome::Rejected), 4003, 10000);
        qint64 inBars = 0;
        for (int b = 0; b < view.bucketCount(); ++b)
            inBars += view.bucketCount(b, Outcome::Rejected);
        QCOMPARE(inBars, 4003);
        QTRY_COMPARE(view.ratios()->rowCount(), 1);
        QCOMPARE(view.ratios()->item(0, 1)->text(), u"4003"_qs);
    }

    // The window changed while a poll was in flight (Redis stopped meanwhile): the old poll's
    // answer, for the old window's last seconds, is dropped and the new window read whole, not
    // left empty for good.
    void trafficWindowChangedDuringAPollIsReadWhole()
    {
        QTemporaryDir dir;
        test::RedisServer redis(dir.path());
        QVERIFY(redis.start());
        auto pool = recordedPool(redis.url(), &m_calls);
        QList<DeliveryEvent> log;
        for (int i = 0; i < 200; ++i) {
            DeliveryEvent e;
            e.atMs = wallMs() - 10 * 60'000 + i; // in the last hour, not the last 5 minutes
            e.endpoint = u"t"_qs;
            e.key = u"t:%1"_qs.arg(i);
            e.outcome = Outcome::Processed;
            e.status = 200;
            log << e;
        }
        QVERIFY(pool->run<void>([&](IdempotencyStore &s) { return s.appendDeliveries(log); }).ok());
        TrafficView view(pool);
        view.show();
        QSignalSpy updated(&view, &TrafficView::updated);
        QVERIFY(updated.wait(10000)); // the 5 minutes read: none of them
        QCOMPARE(view.total(Outcome::Processed), 0);

        ::kill(pid_t(redis.pid()), SIGSTOP);
        {
            const auto resume = qScopeGuard([&] { ::kill(pid_t(redis.pid()), SIGCONT); });
            view.poll(); // a poll in flight (this one, or the timer's), held by the stopped Redis
            view.windowChoice()->setCurrentIndex(2); // last hour
            QCOMPARE(view.bucketCount(), 60);        // the GUI thread goes on meanwhile
        }
        QTRY_COMPARE_WITH_TIMEOUT(view.total(Outcome::Processed), 200, 10000);
        QCOMPARE(m_calls.onGuiThread.load(), 0);
    }
};

QTEST_MAIN(TestUi)
#include "tst_ui.moc"
