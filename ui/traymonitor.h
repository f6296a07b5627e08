#pragma once

#include "model/keyrecord.h"

#include <QObject>

#include <functional>

class QTimer;

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
    // Whether delivered() is fed (the embedded receiver). Without it (attach mode) a rise of
    // the failed count is the news.
    void setSeesDeliveries(bool sees) { m_seesDeliveries = sees; }
    // The catch-up flush waiting for the end of the interval (for tests).
    const QTimer *catchUp() const { return m_catchUp; }
    QString toolTip() const;

Q_SIGNALS:
    // `text` is markup, as notification servers read a notification's body (and Qt's own
    // balloon): what a sender wrote in it (a key) is escaped.
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
    static constexpr int kShown = 5;
    QStringList m_pending; // what happened since the last notification (the first kShown)
    qint64 m_more = 0;     // and how many more
    bool m_seesDeliveries = true;
    QTimer *m_catchUp; // the one catch-up flush after a rate-limited note
};

} // namespace idem
