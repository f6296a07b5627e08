#include "traymonitor.h"

#include "util/clock.h"
#include "util/format.h"

#include <QTimer>

namespace idem {

TrayMonitor::TrayMonitor(qint64 minIntervalMs, std::function<qint64()> clockMs, QObject *parent)
    : QObject(parent), m_minIntervalMs(minIntervalMs),
      m_clockMs(clockMs ? std::move(clockMs) : [] { return wallMs(); })
{}

void TrayMonitor::setCounts(qint64 failed, qint64 stuck)
{
    // Only a rise is news; the first counts are where we start from.
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
        note(tr("%1 failed (%2)").arg(event.key).arg(event.status));
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
    m_pending << what;
    flush();
}

void TrayMonitor::flush()
{
    if (m_pending.isEmpty() || !m_enabled)
        return;
    const qint64 now = m_clockMs();
    if (m_lastNotifiedMs >= 0 && now - m_lastNotifiedMs < m_minIntervalMs) {
        // Rate limited: sent with the next notification, or when the interval is over.
        QTimer::singleShot(int(m_minIntervalMs - (now - m_lastNotifiedMs)) + 1, this,
                           &TrayMonitor::flush);
        return;
    }
    m_lastNotifiedMs = now;
    QStringList lines = m_pending.mid(0, 5);
    if (m_pending.size() > 5)
        lines << tr("and %1 more").arg(m_pending.size() - 5);
    m_pending.clear();
    Q_EMIT notify(tr("Idempotency Desk"), lines.join(u'\n'));
}

} // namespace idem
