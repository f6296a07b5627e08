#pragma once

#include "model/keyrecord.h"

#include <QObject>

#include <functional>

namespace idem {

// What the tray icon says while the window is minimized: the counts of failed and stuck keys
// (tooltip), and a desktop notification when a key fails or a lease runs out — at most one per
// `minIntervalMs` (what happens in between is summed into the next), and none when turned off.
// Pure logic, fed by the window; the window shows it with QSystemTrayIcon where the desktop has
// a tray.
class TrayMonitor final : public QObject
{
    Q_OBJECT
public:
    explicit TrayMonitor(qint64 minIntervalMs = 30'000, std::function<qint64()> clockMs = {},
                         QObject *parent = nullptr);

    void setEnabled(bool enabled) { m_enabled = enabled; }
    bool isEnabled() const { return m_enabled; }
    // The store's counts (failed keys, processing keys whose lease ran out).
    void setCounts(qint64 failed, qint64 stuck);
    // A delivery the receiver answered: a processing that failed counts as a failed key.
    void delivered(const DeliveryEvent &event);
    QString toolTip() const;

Q_SIGNALS:
    void notify(const QString &title, const QString &text);
    void countsChanged();

private:
    void note(const QString &what);
    void flush();

    qint64 m_minIntervalMs;
    std::function<qint64()> m_clockMs;
    bool m_enabled = true;
    qint64 m_failed = -1;
    qint64 m_stuck = -1;
    qint64 m_lastNotifiedMs = -1;
    QStringList m_pending; // what happened since the last notification
    bool m_flushScheduled = false;
};

} // namespace idem
