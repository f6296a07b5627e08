#include "mainwindow.h"

#include "deliveriesmodel.h"
#include "receiver/receiver.h"

#include <QHeaderView>
#include <QLabel>
#include <QStatusBar>
#include <QTableView>
#include <QTimer>
#include <QVBoxLayout>

namespace idem {

MainWindow::MainWindow(Receiver *receiver, QString storeDisplay, QWidget *parent)
    : QMainWindow(parent), m_receiver(receiver), m_storeDisplay(std::move(storeDisplay)),
      m_model(new DeliveriesModel(5000, this)), m_table(new QTableView(this)),
      m_address(new QLabel(this)), m_counts(new QLabel(this))
{
    setWindowTitle(tr("Idempotency Desk"));
    auto *central = new QWidget(this);
    auto *layout = new QVBoxLayout(central);
    const QString base = u"http://%1"_qs.arg(receiver->address().toString());
    QStringList endpoints;
    for (const auto &e : receiver->engine()->config().endpoints)
        endpoints << u"%1/hooks/%2"_qs.arg(base, e.name);
    m_address->setText(tr("<b>Receiving webhooks at</b> %1").arg(endpoints.join(u", "_qs)));
    m_address->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_address->setWordWrap(true);
    layout->addWidget(m_address);
    auto *hint = new QLabel(tr("Send the same event twice and watch the second one replayed: "
                               "<code>curl -i -XPOST -H 'Idempotency-Key: k1' -d '{\"a\":1}' %1/hooks/generic</code>")
                                .arg(base),
                            this);
    hint->setTextInteractionFlags(Qt::TextSelectableByMouse);
    hint->setWordWrap(true);
    layout->addWidget(hint);
    m_table->setModel(m_model);
    m_table->setAlternatingRowColors(true);
    m_table->setSelectionBehavior(QAbstractItemView::SelectRows);
    m_table->verticalHeader()->hide();
    m_table->horizontalHeader()->setSectionResizeMode(DeliveriesModel::Key, QHeaderView::Stretch);
    layout->addWidget(m_table);
    setCentralWidget(central);
    statusBar()->addWidget(m_counts, 1);
    statusBar()->addPermanentWidget(new QLabel(tr("Store: %1").arg(m_storeDisplay), this));

    connect(receiver->engine(), &IdempotencyEngine::delivered, this,
            [this](const DeliveryEvent &event) { m_model->append(event); });
    auto *timer = new QTimer(this);
    connect(timer, &QTimer::timeout, this, &MainWindow::refreshStatus);
    timer->start(500);
    refreshStatus();
    resize(1000, 600);
}

void MainWindow::refreshStatus()
{
    // Counters are atomics and the pool's health is a mutex-guarded copy: nothing here waits.
    const EngineCounters c = m_receiver->engine()->counters();
    const StoreHealth health = m_receiver->pool()->health();
    auto n = [&](Outcome o) { return c.byOutcome[size_t(o)]; };
    m_counts->setText(tr("processed %1 · replayed %2 · in-progress %3 · reprocessed %4 · "
                         "recovered %5 · mismatch %6 · rejected %7 · unavailable %8 · store %9")
                          .arg(n(Outcome::Processed)).arg(n(Outcome::Replayed))
                          .arg(n(Outcome::InProgress)).arg(n(Outcome::Reprocessed))
                          .arg(n(Outcome::Recovered)).arg(n(Outcome::Mismatch))
                          .arg(n(Outcome::Rejected)).arg(n(Outcome::Unavailable))
                          .arg(health.healthy ? tr("healthy") : tr("UNAVAILABLE: %1").arg(health.lastError)));
}

} // namespace idem
