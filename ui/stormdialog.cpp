#include "stormdialog.h"

#include "colours.h"
#include "util/format.h"

#include <QApplication>
#include <QComboBox>
#include <QDialogButtonBox>
#include <QFormLayout>
#include <QHostAddress>
#include <QLabel>
#include <QLineEdit>
#include <QPointer>
#include <QProgressBar>
#include <QPushButton>
#include <QSpinBox>
#include <QThread>
#include <QUrl>
#include <QVBoxLayout>

namespace idem {

StormDialog::StormDialog(const Config &config, const QString &receiverUrl, QWidget *parent)
    : QDialog(parent), m_config(config), m_endpoint(new QComboBox(this)), m_copies(new QSpinBox(this)),
      m_concurrency(new QSpinBox(this)), m_keys(new QSpinBox(this)), m_url(new QLineEdit(receiverUrl, this)),
      m_run(new QPushButton(tr("Fire storm"), this)), m_progress(new QProgressBar(this)), m_result(new QLabel(this))
{
    setWindowTitle(tr("Storm: identical deliveries"));
    for (const auto &e : config.endpoints)
        m_endpoint->addItem(u"%1 (%2)"_qs.arg(e.name, e.provider), e.name);
    m_copies->setRange(1, 10000);
    m_copies->setValue(64);
    m_concurrency->setRange(1, 512);
    m_concurrency->setValue(64);
    m_keys->setRange(1, 100000);
    m_keys->setValue(1);
    auto *form = new QFormLayout;
    form->addRow(tr("Endpoint"), m_endpoint);
    form->addRow(tr("Copies per key"), m_copies);
    form->addRow(tr("Concurrency"), m_concurrency);
    form->addRow(tr("Keys"), m_keys);
    form->addRow(tr("Receiver"), m_url);
    auto *layout = new QVBoxLayout(this);
    auto *intro = new QLabel(tr("Each key is delivered <i>copies</i> times at once, signed the way its provider signs. "
                                "Watch exactly one of them reach the processor."), this);
    intro->setWordWrap(true);
    layout->addWidget(intro);
    layout->addLayout(form);
    layout->addWidget(m_run);
    layout->addWidget(m_progress);
    m_result->setWordWrap(true);
    m_result->setTextInteractionFlags(Qt::TextSelectableByMouse);
    layout->addWidget(m_result, 1);
    auto *buttons = new QDialogButtonBox(QDialogButtonBox::Close, this);
    connect(buttons, &QDialogButtonBox::rejected, this, &QDialog::reject);
    layout->addWidget(buttons);
    connect(m_run, &QPushButton::clicked, this, &StormDialog::start);
    resize(520, 460);
}

StormDialog::~StormDialog() = default; // a running storm's thread outlives the dialog (start())

void StormDialog::start()
{
    if (m_thread)
        return;
    const EndpointConfig *endpoint = m_config.endpoint(m_endpoint->currentData().toString());
    const QUrl url(m_url->text().trimmed());
    const QHostAddress host(url.host() == u"localhost"_qs ? u"127.0.0.1"_qs : url.host());
    if (!endpoint || host.protocol() != QAbstractSocket::IPv4Protocol || url.port() <= 0) {
        m_result->setText(tr("<span style='color:%1'>The receiver must be http://IPv4:PORT.</span>")
                              .arg(stateColour(KeyState::Failed).name()));
        return;
    }
    StormPlan plan;
    plan.copies = m_copies->value();
    plan.concurrency = m_concurrency->value();
    plan.keys = m_keys->value();
    plan.host = host.toString().toLatin1();
    plan.port = quint16(url.port());
    m_progress->setRange(0, int(std::min<qint64>(qint64(plan.copies) * plan.keys, INT_MAX)));
    m_progress->setValue(0);
    m_run->setEnabled(false);
    m_result->setText(tr("Storming…"));
    const EndpointConfig e = *endpoint;
    QPointer<StormDialog> self(this);
    m_thread = QThread::create([plan, e, self] {
        // Answers go through qApp: the dialog may be gone, `self` says so on the GUI thread.
        StormReport report = runStorm(plan, e, [self](qint64 done, qint64) {
            QMetaObject::invokeMethod(
                qApp,
                [self, done] {
                    if (self)
                        self->m_progress->setValue(int(done));
                },
                Qt::QueuedConnection);
        });
        QMetaObject::invokeMethod(
            qApp,
            [self, report] {
                if (!self)
                    return;
                self->m_report = report;
                self->m_thread = nullptr; // it deletes itself when it has finished
                self->m_run->setEnabled(true);
                self->showReport();
                Q_EMIT self->finished();
            },
            Qt::QueuedConnection);
    });
    // Closing the dialog never waits for the storm: the thread outlives it if need be.
    connect(m_thread, &QThread::finished, m_thread, &QObject::deleteLater);
    m_thread->start();
}

void StormDialog::showReport()
{
    m_result->setText(resultText());
}

QString StormDialog::resultText() const
{
    const StormReport &r = m_report;
    QStringList outcomes;
    for (size_t i = 0; i < r.outcomes.size(); ++i)
        if (r.outcomes[i])
            outcomes << u"%1 <b>%2</b>"_qs.arg(toString(Outcome(i))).arg(r.outcomes[i]);
    QString text = tr("%1 in %2 ms · p50 %3 ms · p99 %4 ms<br>%5<br>")
                       .arg(countOf(r.sent, u"delivery", u"deliveries"))
                       .arg(r.elapsedMs)
                       .arg(r.p50Ms, 0, 'f', 1)
                       .arg(r.p99Ms, 0, 'f', 1)
                       .arg(outcomes.join(u" · "_qs));
    if (r.exactlyOnce())
        text += tr("<span style='color:%1'><b>Reached the processor: one per key</b> (%2 of %3 "
                   "exactly once).</span>")
                    .arg(stateColour(KeyState::Completed).name())
                    .arg(r.keysProcessedOnce())
                    .arg(countOf(r.keys, u"key", u"keys"));
    else if (!r.keysProcessedTwice())
        text += tr("<span style='color:%1'><b>Not all processed</b>: %2.</span>")
                    .arg(stateColour(KeyState::Failed).name(), r.shortOfOnce().toHtmlEscaped());
    else
        text += tr("<span style='color:%1'><b>Not exactly once</b>: %2 of %3 processed once; %4 "
                   "got no answer.</span>")
                    .arg(stateColour(KeyState::Failed).name())
                    .arg(r.keysProcessedOnce())
                    .arg(countOf(r.keys, u"key", u"keys"))
                    .arg(countOf(r.statuses.value(0), u"delivery", u"deliveries"));
    return text;
}

} // namespace idem
