// The window on the offscreen platform: the address is shown, deliveries appear live.
#include "deliveriesmodel.h"
#include "mainwindow.h"
#include "receiver/receiver.h"
#include "store/storefactory.h"
#include "http/blockingclient.h"

#include <QAbstractItemModelTester>
#include <QLabel>
#include <QTableView>
#include <QTemporaryDir>
#include <QTest>

#include <thread>

using namespace idem;

class TestUi : public QObject
{
    Q_OBJECT
private Q_SLOTS:
    void modelContract()
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
        QCOMPARE(model.index(1, DeliveriesModel::Outcome).data().toString(), u"replayed"_qs);
    }

    void windowShowsAddressAndLiveDeliveries()
    {
        QTemporaryDir dir;
        auto pool = openStorePool(u"sqlite:"_qs + dir.filePath(u"ui.db"_qs));
        QVERIFY(pool.ok());
        Receiver receiver(Config::builtin(), *pool);
        ListenAddress any;
        any.port = 0;
        const quint16 port = receiver.start(any)->port;
        MainWindow window(&receiver, u"sqlite:test"_qs);
        window.show();
        QVERIFY(QTest::qWaitForWindowExposed(&window));

        bool addressShown = false;
        for (QLabel *label : window.findChildren<QLabel *>())
            addressShown |= label->text().contains(u"127.0.0.1:%1/hooks/generic"_qs.arg(port));
        QVERIFY(addressShown);

        // The GUI thread keeps running while the deliveries are sent from another thread.
        std::thread sender([port] {
            post(port, "/hooks/generic", "{\"a\":1}", {{"Idempotency-Key", "ui-1"}});
            post(port, "/hooks/generic", "{\"a\":1}", {{"Idempotency-Key", "ui-1"}});
        });
        QTRY_COMPARE(window.deliveries()->rowCount(), 2);
        sender.join();
        QCOMPARE(window.deliveries()->index(0, DeliveriesModel::Outcome).data().toString(), u"replayed"_qs);
        QCOMPARE(window.deliveries()->index(1, DeliveriesModel::Outcome).data().toString(), u"processed"_qs);
        QCOMPARE(window.deliveries()->index(1, DeliveriesModel::Key).data().toString(), u"generic:ui-1"_qs);
        auto *table = window.findChild<QTableView *>();
        QVERIFY(table);
        QCOMPARE(table->model()->rowCount(), 2);
    }
};

QTEST_MAIN(TestUi)
#include "tst_ui.moc"
