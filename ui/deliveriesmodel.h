#pragma once

#include "model/keyrecord.h"
#include "util/tokenbucket.h"

#include <QAbstractTableModel>
#include <QSortFilterProxyModel>
#include <QTimer>

#include <QList>
#include <map>
#include <optional>
#include <utility>

namespace idem {

// The live list of deliveries, newest first, capped. Fed by signals from the receiver thread;
// never reads a store. GUI thread only.
//
// A flood of rejected deliveries (bad signatures, unknown endpoints, wrong methods, oversized
// bodies: thousands a second from anyone who reaches the port) would push every real delivery
// out of the cap within seconds. So rejections have a row each only within a budget per endpoint
// and status — kRejectionBurst at once, then kRejectionsPerMinute, on the list's clock (the
// newest delivery time seen) —; past it they are folded into one row per endpoint and status that
// counts them ("1234 more rejected (401) since 12:00:03"), brought up to date and moved up to its
// place by when its last rejection came (the top while the flood lasts) at most every
// kFoldIntervalMs: one move and one dataChanged a row, however many came. An entry that stands
// for several (a summary, DeliveryEvent::count) is folded whole. Every other outcome has a row of
// its own; nothing is dropped from a count.
class DeliveriesModel final : public QAbstractTableModel
{
    Q_OBJECT
public:
    enum Column { Time, Endpoint, Key, Type, Outcome, Status, Latency, ColumnCount };
    enum Role {
        RawValueRole = Qt::UserRole + 1,
        FoldedCountRole, // a folded row's count of rejected deliveries; 0 for a delivery's own row
    };
    static constexpr double kRejectionBurst = 10;
    static constexpr double kRejectionsPerMinute = 6;
    static constexpr int kFoldIntervalMs = 100;

    explicit DeliveriesModel(int capacity = 5000, QObject *parent = nullptr);

    int rowCount(const QModelIndex &parent = {}) const override;
    int columnCount(const QModelIndex &parent = {}) const override;
    QVariant data(const QModelIndex &index, int role = Qt::DisplayRole) const override;
    QVariant headerData(int section, Qt::Orientation orientation, int role) const override;

    void append(const DeliveryEvent &event);
    // The rejections folded since the last update, shown now (otherwise the timer's job).
    void applyFolds();
    // Paused, new deliveries are held — rows of their own up to the capacity (the oldest
    // dropped), folded rejections counted whole — and shown when it resumes.
    void setPaused(bool paused);
    bool isPaused() const { return m_paused; }
    qint64 heldCount() const; // deliveries waiting while paused

    // A row's delivery; for a folded row the last rejection folded (no key, no latency), with
    // count = how many the row stands for.
    const DeliveryEvent &at(int row) const { return m_rows.at(row).event; }
    bool isFolded(int row) const { return m_rows.at(row).folded; }

private:
    struct Row
    {
        DeliveryEvent event;
        bool folded = false;
        qint64 foldedSinceMs = 0; // a folded row: when the first of its rejections came
        qint64 arrivedMs = 0;     // on the list's clock (arrival()); a folded row: its last's
    };
    struct Fold
    {
        qint64 count = 0;
        qint64 sinceMs = 0;
        DeliveryEvent last;
        qint64 lastArrivedMs = 0;
    };
    using FoldKey = std::pair<QString, int>; // endpoint, status

    qint64 arrival(const DeliveryEvent &event);
    bool folds(const DeliveryEvent &event, qint64 arrivedMs);
    void insert(const QList<Row> &newestLast);
    void trim();

    QList<Row> m_rows; // newest first
    int m_capacity;
    bool m_paused = false;
    QList<Row> m_held; // while paused, oldest first
    // The list's clock: the newest delivery time seen, never back (a wall clock stepped back, by
    // NTP or by hand, sank new folded rows below every row from before, at the cap trimmed at
    // once: a flood of 5000 not shown).
    qint64 m_clockMs = 0;
    std::map<FoldKey, TokenBucket> m_budgets; // the few an endpoint's rejections have
    std::map<FoldKey, Fold> m_pendingFolds;   // not shown yet
    QTimer m_foldTimer;
};

// The live list filtered by outcome and endpoint (Live deliveries page).
// A delivery that failed, whatever its outcome: answered 5xx (the processor failed, the store
// was unavailable, a replay of a stored failure).
bool deliveryFailed(const DeliveryEvent &event);

class DeliveriesFilter final : public QSortFilterProxyModel
{
    Q_OBJECT
public:
    using QSortFilterProxyModel::QSortFilterProxyModel;
    void setOutcome(std::optional<idem::Outcome> outcome);
    void setEndpoint(const QString &endpoint); // empty: every endpoint
    void setFailuresOnly(bool only);           // only deliveryFailed() ones

protected:
    bool filterAcceptsRow(int sourceRow, const QModelIndex &sourceParent) const override;

private:
    std::optional<idem::Outcome> m_outcome;
    QString m_endpoint;
    bool m_failuresOnly = false;
};

} // namespace idem
