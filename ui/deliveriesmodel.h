#pragma once

#include "model/keyrecord.h"

#include <QAbstractTableModel>
#include <QSortFilterProxyModel>

#include <QList>
#include <optional>

namespace idem {

// The live list of deliveries, newest first, capped. Fed by signals from the receiver thread;
// never reads a store.
class DeliveriesModel final : public QAbstractTableModel
{
    Q_OBJECT
public:
    enum Column { Time, Endpoint, Key, Outcome, Status, Latency, ColumnCount };
    enum Role { RawValueRole = Qt::UserRole + 1 };

    explicit DeliveriesModel(int capacity = 5000, QObject *parent = nullptr);

    int rowCount(const QModelIndex &parent = {}) const override;
    int columnCount(const QModelIndex &parent = {}) const override;
    QVariant data(const QModelIndex &index, int role = Qt::DisplayRole) const override;
    QVariant headerData(int section, Qt::Orientation orientation, int role) const override;

    void append(const DeliveryEvent &event);
    const DeliveryEvent &at(int row) const { return m_rows.at(row); }

private:
    QList<DeliveryEvent> m_rows; // newest first
    int m_capacity;
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
