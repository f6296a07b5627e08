#include "traymonitor.h"

#include "richtext.h"
#include "util/clock.h"
#include "util/format.h"

#include <QTimer>

namespace idem {

TrayMonitor::TrayMonitor(qint64 minIntervalMs, std::function<qint64()> clockMs, QObject *parent)
    : QObject(parent), m_minIntervalMs(minIntervalMs),
      m_clockMs(clockMs ? std::move(clockMs) : [] { return wallMs(); }), m_catchUp(new QTimer(this))
{
    m_catchUp->setSingleShot(true);
    connect(m_catchUp, &QTimer::timeout, this, &TrayMonitor::flush);
}

void TrayMonitor::setCounts(qint64 failed, qint64 stuck)
{
    // Only a rise is news; the first counts are where we start from. Without the receiver's
    // deliveries (attach mode) a failure is known from the count alone.
    if (!m_seesDeliveries && m_failed >= 0 && failed > m_failed)
        note(tr("%1 failed: %2")
                 .arg(countOf(failed - m_failed, u"key", u"keys"),
                      countOf(failed, u"failed key", u"failed keys")));
    if (m_stuck >= 0 && stuck > m_stuck)
        note(tr("%1 ran out: %2")
                 .arg(countOf(stuck - m_stuck, u"lease", u"leases"),
                      countOf(stuck, u"key is stuck", u"keys are stuck")));
    const bool changed = failed != m_failed || stuck != m_stuck;
    m_failed = failed;
    m_stuck = stuck;
    if (changed)
        Q_EMIT countsChanged();
    flush();
}

void TrayMonitor::delivered(const DeliveryEvent &event)
{
    const bool ran = event.outcome == Outcome::Processed || event.outcome == Outcome::Reprocessed ||
                     event.outcome == Outcome::Recovered;
    if (ran && (event.status < 200 || event.status > 299))
        note(tr("%1 failed (%2)").arg(richTextEscaped(event.key)).arg(event.status));
}

QString TrayMonitor::toolTip() const
{
    return tr("Idempotency Desk — %1 · %2")
        .arg(countOf(std::max<qint64>(0, m_failed), u"failed key", u"failed keys"),
             countOf(std::max<qint64>(0, m_stuck), u"stuck key", u"stuck keys"));
}

void TrayMonitor::note(const QString &what)
{
    if (!m_enabled)
        return;
    // Bounded: the first few, then how many more.
    if (m_pending.size() < kShown)
        m_pending << what;
    else
        ++m_more;
    flush();
}

void TrayMonitor::flush()
{
    if (m_pending.isEmpty() || !m_enabled)
        return;
    const qint64 now = m_clockMs();
    if (m_lastNotifiedMs >= 0 && now - m_lastNotifiedMs < m_minIntervalMs) {
        // Rate limited: sent with the next notification, or by one catch-up when the interval
        // is over (one timer, however many notes wait).
        if (!m_catchUp->isActive())
            m_catchUp->start(int(m_minIntervalMs - (now - m_lastNotifiedMs)) + 1);
        return;
    }
    m_catchUp->stop();
    m_lastNotifiedMs = now;
    QStringList lines = m_pending;
    if (m_more)
        lines << tr("and %1 more").arg(m_more);
    m_pending.clear();
    m_more = 0;
    Q_EMIT notify(tr("Idempotency Desk"), lines.join(u'\n'));
}

} // namespace idem
