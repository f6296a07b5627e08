#include "timelinemodel.h"

#include "colours.h"
#include <QBrush>
#include <QColor>

namespace idem {

int TimelineModel::rowCount(const QModelIndex &parent) const
{
    return parent.isValid() ? 0 : int(m_events.size());
}

int TimelineModel::columnCount(const QModelIndex &parent) const
{
    return parent.isValid() ? 0 : ColumnCount;
}

QVariant TimelineModel::headerData(int section, Qt::Orientation orientation, int role) const
{
    if (orientation != Qt::Horizontal || role != Qt::DisplayRole)
        return {};
    switch (section) {
    case Offset: return tr("Arrival");
    case Outcome: return tr("Outcome");
    case Status: return tr("Status");
    case Meaning: return tr("What it got");
    case Latency: return tr("Latency");
    case Instance: return tr("Instance");
    case Detail: return tr("Detail");
    }
    return {};
}

QString TimelineModel::meaning(idem::Outcome outcome)
{
    switch (outcome) {
    case idem::Outcome::Processed: return tr("won the claim: processed");
    case idem::Outcome::Reprocessed: return tr("won the claim: processed again after a failure or reset");
    case idem::Outcome::Recovered: return tr("won the claim: took over an expired lease");
    case idem::Outcome::Replayed: return tr("duplicate: got the stored answer");
    case idem::Outcome::InProgress: return tr("duplicate: told to retry (still processing)");
    case idem::Outcome::Mismatch: return tr("refused: same key, different payload");
    case idem::Outcome::Rejected: return tr("refused before the claim");
    case idem::Outcome::Unavailable: return tr("refused: store unavailable");
    }
    return {};
}

QVariant TimelineModel::data(const QModelIndex &index, int role) const
{
    if (!checkIndex(index, CheckIndexOption::IndexIsValid | CheckIndexOption::ParentIsInvalid))
        return {};
    const DeliveryEvent &e = m_events.at(index.row());
    const qint64 offset = e.atMs - m_events.first().atMs;
    if (role == RawValueRole) {
        switch (index.column()) {
        case Offset: return offset;
        case Outcome: return toString(e.outcome);
        case Status: return e.status;
        case Latency: return e.latencyUs;
        default: break;
        }
    }
    if (role == Qt::BackgroundRole &&
        (e.outcome == idem::Outcome::Processed || e.outcome == idem::Outcome::Reprocessed ||
         e.outcome == idem::Outcome::Recovered))
        return QBrush(winnerBackground()); // the delivery that won the claim
    if (role == Qt::DisplayRole || role == RawValueRole) {
        switch (index.column()) {
        case Offset: return u"+%1 s"_qs.arg(double(offset) / 1000.0, 0, 'f', 3);
        case Outcome: return toString(e.outcome);
        case Status: return e.status;
        case Meaning: return meaning(e.outcome);
        case Latency: return u"%1 ms"_qs.arg(double(e.latencyUs) / 1000.0, 0, 'f', 1);
        case Instance: return e.instance;
        case Detail: return e.detail;
        }
    }
    return {};
}

void TimelineModel::setEvents(QList<DeliveryEvent> newestFirst)
{
    std::reverse(newestFirst.begin(), newestFirst.end());
    beginResetModel();
    m_events = std::move(newestFirst);
    endResetModel();
}

} // namespace idem
