#pragma once

#include "model/keyrecord.h"

#include <QAbstractTableModel>

namespace idem {

// Every arrival of one key, oldest first: its offset from the first, its outcome, who won the
// claim and what each duplicate got.
class TimelineModel final : public QAbstractTableModel
{
    Q_OBJECT
public:
    enum Column { Offset, Outcome, Status, Meaning, Latency, Instance, Detail, ColumnCount };
    enum Role { RawValueRole = Qt::UserRole + 1 };

    using QAbstractTableModel::QAbstractTableModel;
    int rowCount(const QModelIndex &parent = {}) const override;
    int columnCount(const QModelIndex &parent = {}) const override;
    QVariant data(const QModelIndex &index, int role = Qt::DisplayRole) const override;
    QVariant headerData(int section, Qt::Orientation orientation, int role) const override;

    void setEvents(QList<DeliveryEvent> newestFirst);
    const QList<DeliveryEvent> &events() const { return m_events; }

    static QString meaning(idem::Outcome outcome);

private:
    QList<DeliveryEvent> m_events; // oldest first
};

} // namespace idem
