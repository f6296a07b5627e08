#include "deliveriesmodel.h"

#include "colours.h"
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
    if (role == Qt::ToolTipRole && deliveryFailed(e))
        return e.detail.isEmpty() ? tr("failed: %1").arg(e.status) : e.detail;
    if (role == Qt::ToolTipRole && !e.detail.isEmpty())
        return e.detail;
    // A processed delivery whose processor failed (5xx) is a failure, whatever its outcome.
    if (role == Qt::ForegroundRole && deliveryFailed(e) &&
        (index.column() == Outcome || index.column() == Status))
        return QBrush(stateColour(KeyState::Failed));
    if (role == Qt::ForegroundRole && index.column() == Outcome) {
        return QBrush(outcomeColour(e.outcome));
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

bool deliveryFailed(const DeliveryEvent &e)
{
    return e.status >= 500;
}

void DeliveriesFilter::setOutcome(std::optional<idem::Outcome> outcome)
{
    m_outcome = outcome;
    invalidateRowsFilter();
}

void DeliveriesFilter::setFailuresOnly(bool only)
{
    m_failuresOnly = only;
    invalidateRowsFilter();
}

void DeliveriesFilter::setEndpoint(const QString &endpoint)
{
    m_endpoint = endpoint;
    invalidateRowsFilter();
}

bool DeliveriesFilter::filterAcceptsRow(int sourceRow, const QModelIndex &) const
{
    const auto *model = static_cast<const DeliveriesModel *>(sourceModel());
    const DeliveryEvent &e = model->at(sourceRow);
    return (!m_outcome || e.outcome == *m_outcome) && (!m_failuresOnly || deliveryFailed(e)) &&
           (m_endpoint.isEmpty() || e.endpoint == m_endpoint);
}

} // namespace idem
