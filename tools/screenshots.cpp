// Renders the screenshots of docs/: a desk with real traffic (a storm, a failure, a mismatch),
// driven through its widgets, each view saved as PNG. Run by `./dev screenshots` under Xvfb.
#include "colours.h"
#include "http/blockingclient.h"
#include "keydetailview.h"
#include "keysmodel.h"
#include "mainwindow.h"
#include "receiver/receiver.h"
#include "senddialog.h"
#include "store/storefactory.h"
#include "stormdialog.h"
#include "trafficview.h"

#include <QApplication>
#include <QComboBox>
#include <QDir>
#include <QPlainTextEdit>
#include <QScreen>
#include <QSettings>
#include <QSpinBox>
#include <QTabBar>
#include <QTabWidget>
#include <QTableView>
#include <QTemporaryDir>
#include <QTest>

#include <thread>

using namespace idem;

namespace {
void wait(int ms)
{
    QTest::qWait(ms);
}
void deliverInBackground(quint16 port, const QByteArray &endpoint, const QByteArray &key, const QByteArray &body)
{
    std::thread([=] { post(port, "/hooks/" + endpoint, body, {{"Idempotency-Key", key}}); }).detach();
}
bool save(QWidget *w, const QString &path)
{
    const bool ok = w->grab().save(path);
    std::printf("%s %s\n", ok ? "wrote" : "FAILED", qPrintable(path));
    return ok;
}
} // namespace

int main(int argc, char **argv)
{
    QApplication app(argc, argv);
    const QString out = argc > 1 ? QString::fromLocal8Bit(argv[1]) : u"docs/screenshots"_qs;
    QDir().mkpath(out);
    QTemporaryDir dir;
    // The window remembers its geometry: in a throwaway place, not the user's settings.
    QSettings::setPath(QSettings::NativeFormat, QSettings::UserScope, dir.filePath(u"settings"_qs));
    const QString url = u"sqlite:"_qs + dir.filePath(u"demo.db"_qs);
    auto config = *Config::parse(R"({"endpoints": [
        {"name": "orders", "simulate": {"delay_ms": 120}},
        {"name": "payments", "on_failed": "reject", "simulate": {"delay_ms": 20, "fail_rate": 1}},
        {"name": "stripe", "provider": "stripe", "secret": "whsec_demo_0123456789abcdef", "ttl_seconds": 3600},
        {"name": "generic"},
        {"name": "gh", "key": {"header": "X-Delivery"}}]})",
                                 u"demo"_qs);
    auto pool = *openStorePool(url);
    Receiver receiver(config, pool);
    ListenAddress any;
    any.port = 0;
    const quint16 port = receiver.start(any)->port;
    MainWindow window(DeskSession{config, url, {}, pool, &receiver});
    window.resize(1400, 820);
    window.show();

    for (int i = 0; i < 6; ++i)
        deliverInBackground(port, "orders", "ord_" + QByteArray::number(1000 + i), "{\"order\":" + QByteArray::number(1000 + i) + ",\"amount\":4200}");
    deliverInBackground(port, "payments", "pay_77", "{\"payment\":77,\"amount\":1999,\"currency\":\"eur\"}");
    deliverInBackground(port, "generic", "inv_5", "{\"invoice\":5,\"amount\":10}");
    // Long keys that differ only at the end: the column keeps their tails.
    for (int i = 0; i < 3; ++i)
        std::thread([=] {
            post(port, "/hooks/gh", "{\"ref\":\"main\"}",
                 {{"X-Delivery",
                   "hook-4242/storage-replication-worker-" + QByteArray::number(7301 + i)}});
        }).detach();
    wait(600);
    deliverInBackground(port, "generic", "inv_5", "{\"invoice\":5,\"amount\":99}"); // a 422
    deliverInBackground(port, "payments", "pay_77", "{\"payment\":77,\"amount\":1999,\"currency\":\"eur\"}");
    StormDialog storm(config, u"http://"_qs + receiver.address().toString());
    storm.keys()->setValue(3);
    storm.show();
    storm.start();
    (void)QTest::qWaitFor([&] { return !storm.running(); }, 20000);
    wait(1500);
    save(&storm, out + u"/storm.png"_qs);
    storm.hide();

    auto select = [&](const QString &key, int tab) {
        (void)QTest::qWaitFor([&] { return window.keys()->rowOfKey(key) >= 0; }, 5000);
        window.selectKey(key);
        (void)QTest::qWaitFor([&] { return window.detail()->currentKey() == key; }, 5000);
        window.detail()->tabs()->setCurrentIndex(tab);
        wait(300);
    };
    select(u"payments:pay_77"_qs, 0);
    save(&window, out + u"/keys.png"_qs);
    select(window.keys()->index(0, KeysModel::Key).data().toString(), 2); // a storm key: its 64 arrivals
    save(&window, out + u"/timeline.png"_qs);
    select(u"generic:inv_5"_qs, 4);
    save(&window, out + u"/mismatch.png"_qs);
    window.pages()->setCurrentIndex(1);
    wait(2500);
    save(&window, out + u"/traffic.png"_qs);
    window.pages()->setCurrentIndex(2);
    // A processing that fails, on top: drawn as a failure though its outcome is 'processed'.
    deliverInBackground(port, "payments", "pay_78", "{\"payment\":78,\"amount\":500,\"currency\":\"eur\"}");
    wait(800);
    save(&window, out + u"/live.png"_qs);
    window.pages()->setCurrentIndex(0);

    // Send test event: a Stripe payment_intent.succeeded, signed with the endpoint's secret, twice.
    SendTarget target;
    target.port = port;
    SendDialog send(config, target);
    send.endpoint()->setCurrentIndex(2);
    send.copies()->setValue(2);
    send.show();
    bool sent = false;
    QObject::connect(&send, &SendDialog::sent, &send, [&] { sent = true; });
    send.send();
    (void)QTest::qWaitFor([&] { return sent; }, 10000);
    wait(300);
    save(&send, out + u"/send.png"_qs);
    send.hide();

    // The same window on a dark desktop.
    useDarkPalette(app);
    select(u"payments:pay_77"_qs, 0);
    wait(300);
    save(&window, out + u"/keys-dark.png"_qs);
    // Reset on the failed tab: the key leaves the list, the detail and the actions stay on it.
    window.stateTabs()->setCurrentIndex(2);
    select(u"payments:pay_77"_qs, 3);
    bool reset = false;
    QObject::connect(&window, &MainWindow::actionFinished, &window, [&] { reset = true; });
    window.resetAction()->trigger();
    (void)QTest::qWaitFor([&] { return reset && window.keys()->rowOfKey(u"payments:pay_77"_qs) < 0; }, 5000);
    window.refreshAction()->trigger();
    wait(1500);
    save(&window, out + u"/failed-reset-dark.png"_qs);
    DeliveryQuery all;
    all.limit = 100000;
    std::printf("log %lld, traffic processed %lld in-progress %lld\n",
                (long long)pool->run<QList<DeliveryEvent>>([&](IdempotencyStore &s) { return s.deliveries(all); })->size(),
                (long long)window.traffic()->total(Outcome::Processed), (long long)window.traffic()->total(Outcome::InProgress));
    return 0;
}
