#include "deliveriesmodel.h"

#include <QBrush>
#include <QColor>
#include <QDateTime>

namespace idem {

DeliveriesModel::DeliveriesModel(int capacity, QObject *parent)
    : QAbstractTableModel(parent), m_capacity(capacity)
{}

int DeliveriesModel::rowCount(const QModelIndex &parent) const
{
    return parent.isValid() ? 0 : int(m_rows.size());
}

int DeliveriesModel::columnCount(const QModelIndex &parent) const
{
    return parent.isValid() ? 0 : ColumnCount;
}

QVariant DeliveriesModel::headerData(int section, Qt::Orientation orientation, int role) const
{
    if (orientation != Qt::Horizontal || role != Qt::DisplayRole)
        return {};
    switch (section) {
    case Time: return tr("Time");
    case Endpoint: return tr("Endpoint");
    case Key: return tr("Key");
    case Outcome: return tr("Outcome");
    case Status: return tr("Status");
    case Latency: return tr("Latency");
    }
    return {};
}

QVariant DeliveriesModel::data(const QModelIndex &index, int role) const
{
    if (!checkIndex(index, CheckIndexOption::IndexIsValid | CheckIndexOption::ParentIsInvalid))
        return {};
    const DeliveryEvent &e = m_rows.at(index.row());
    if (role == RawValueRole) {
        switch (index.column()) {
        case Time: return e.atMs;
        case Endpoint: return e.endpoint;
        case Key: return e.key;
        case Outcome: return toString(e.outcome);
        case Status: return e.status;
        case Latency: return e.latencyUs;
        }
    }
    if (role == Qt::DisplayRole) {
        switch (index.column()) {
        case Time: return QDateTime::fromMSecsSinceEpoch(e.atMs).toString(u"hh:mm:ss.zzz"_qs);
        case Endpoint: return e.endpoint;
        case Key: return e.key.isEmpty() ? tr("(none)") : e.key;
        case Outcome: return toString(e.outcome);
        case Status: return e.status;
        case Latency: return u"%1 ms"_qs.arg(double(e.latencyUs) / 1000.0, 0, 'f', 1);
        }
    }
    if (role == Qt::ToolTipRole && !e.detail.isEmpty())
        return e.detail;
    if (role == Qt::ForegroundRole && index.column() == Outcome) {
        switch (e.outcome) {
        case Outcome::Processed:
        case Outcome::Reprocessed:
        case Outcome::Recovered: return QBrush(QColor(0x1b, 0x7f, 0x3b));
        case Outcome::Replayed: return QBrush(QColor(0x1f, 0x5f, 0xb0));
        case Outcome::InProgress: return QBrush(QColor(0xb0, 0x6a, 0x00));
        default: return QBrush(QColor(0xb0, 0x20, 0x20));
        }
    }
    return {};
}

void DeliveriesModel::append(const DeliveryEvent &event)
{
    beginInsertRows({}, 0, 0);
    m_rows.prepend(event);
    endInsertRows();
    if (m_rows.size() > m_capacity) {
        beginRemoveRows({}, m_capacity, int(m_rows.size()) - 1);
        m_rows.resize(m_capacity);
        endRemoveRows();
    }
}

} // namespace idem
