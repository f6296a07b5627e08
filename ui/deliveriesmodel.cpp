#include "deliveriesmodel.h"

#include "colours.h"
#include "richtext.h"
#include "util/format.h"

#include <QBrush>
#include <QColor>
#include <QDateTime>
#include <QFont>

#include <algorithm>
#include <vector>

namespace idem {

DeliveriesModel::DeliveriesModel(int capacity, QObject *parent)
    : QAbstractTableModel(parent), m_capacity(capacity)
{
    m_foldTimer.setSingleShot(true);
    m_foldTimer.setInterval(kFoldIntervalMs);
    m_foldTimer.callOnTimeout(this, &DeliveriesModel::applyFolds);
}

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
    case Type:
        return tr("Type");
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
    const Row &row = m_rows.at(index.row());
    const DeliveryEvent &e = row.event;
    if (role == FoldedCountRole)
        return row.folded ? e.count : 0;
    if (row.folded) {
        const auto time = [](qint64 ms, QStringView format) {
            return QDateTime::fromMSecsSinceEpoch(ms).toString(format);
        };
        if (role == Qt::DisplayRole && index.column() == Key)
            return tr("%1 more rejected (%2) since %3")
                .arg(e.count)
                .arg(e.status)
                .arg(time(row.foldedSinceMs, u"hh:mm:ss"));
        if (role == Qt::DisplayRole && index.column() == Latency)
            return QString();
        if (role == Qt::ToolTipRole)
            return plainToolTip(
                tr("%1 past the list's budget (%2 at once, then %3 a minute per endpoint and "
                   "status), counted in this row since %4; the last at %5: %6")
                    .arg(countOf(e.count, u"rejected delivery", u"rejected deliveries"))
                    .arg(kRejectionBurst)
                    .arg(kRejectionsPerMinute)
                    .arg(time(row.foldedSinceMs, u"hh:mm:ss.zzz"), time(e.atMs, u"hh:mm:ss.zzz"),
                         e.detail.isEmpty() ? tr("(no reason given)") : e.detail));
        if (role == Qt::FontRole) {
            QFont font;
            font.setItalic(true);
            return font;
        }
    }
    if (role == RawValueRole) {
        switch (index.column()) {
        case Time: return e.atMs;
        case Endpoint: return e.endpoint;
        case Key: return e.key;
        case Type:
            return e.type;
        case Outcome: return toString(e.outcome);
        case Status: return e.status;
        case Latency: return e.latencyUs;
        }
    }
    if (role == Qt::DisplayRole) {
        // Key and endpoint are what a sender or a shared store wrote: no bidi control
        // reorders the row.
        switch (index.column()) {
        case Time: return QDateTime::fromMSecsSinceEpoch(e.atMs).toString(u"hh:mm:ss.zzz"_qs);
        case Endpoint: return escapeControls(e.endpoint);
        case Key: return e.key.isEmpty() ? tr("(none)") : escapeControls(e.key);
        case Type:
            return escapeControls(e.type);
        case Outcome: return toString(e.outcome);
        case Status: return e.status;
        case Latency: return u"%1 ms"_qs.arg(double(e.latencyUs) / 1000.0, 0, 'f', 1);
        }
    }
    if (role == Qt::ToolTipRole && deliveryFailed(e))
        return plainToolTip(e.detail.isEmpty() ? tr("failed: %1").arg(e.status) : e.detail);
    if (role == Qt::ToolTipRole && !e.detail.isEmpty())
        return plainToolTip(e.detail);
    // A processed delivery whose processor failed (5xx) is a failure, whatever its outcome.
    if (role == Qt::ForegroundRole && deliveryFailed(e) &&
        (index.column() == Outcome || index.column() == Status))
        return QBrush(stateColour(KeyState::Failed));
    if (role == Qt::ForegroundRole && index.column() == Outcome) {
        return QBrush(outcomeColour(e.outcome));
    }
    return {};
}

// The list's clock at `event`: the newest delivery time seen. A delivery that comes late (its
// time is when it arrived, and it was processed for a while) takes the clock no further; after
// the wall clock stepped back the list's stands still until the deliveries' times pass it again:
// rejections then fold (no row of their own, the budget waits), at the top, all counted.
qint64 DeliveriesModel::arrival(const DeliveryEvent &event)
{
    m_clockMs = std::max(m_clockMs, event.atMs);
    return m_clockMs;
}

void DeliveriesModel::append(const DeliveryEvent &event)
{
    const qint64 arrivedMs = arrival(event);
    if (folds(event, arrivedMs)) {
        Fold &fold = m_pendingFolds[{event.endpoint, event.status}];
        if (fold.count == 0)
            fold.sinceMs = event.atMs;
        fold.count += deliveryCount(event.count);
        fold.last = event;
        fold.lastArrivedMs = arrivedMs;
        if (!m_paused && !m_foldTimer.isActive())
            m_foldTimer.start();
        return;
    }
    const Row row{event, false, 0, arrivedMs};
    if (!m_paused)
        return insert({row});
    m_held.append(row);
    if (m_held.size() > m_capacity)
        m_held.removeFirst(); // the list keeps no more anyway
}

// Whether `event` goes into its endpoint and status's folded row rather than a row of its own.
bool DeliveriesModel::folds(const DeliveryEvent &event, qint64 arrivedMs)
{
    if (event.outcome != Outcome::Rejected)
        return false;
    if (event.count > 1)
        return true; // a summary: deliveries that were not shown one by one anyway
    // On the list's clock, the deliveries' own times: what the list shows depends on what came
    // when, not on when the GUI thread got to it (nor on a pause).
    auto budget = m_budgets
                      .try_emplace({event.endpoint, event.status}, kRejectionBurst,
                                   kRejectionsPerMinute, arrivedMs)
                      .first;
    return !budget->second.take(arrivedMs);
}

void DeliveriesModel::insert(const QList<Row> &newestLast)
{
    if (newestLast.isEmpty())
        return;
    beginInsertRows({}, 0, int(newestLast.size()) - 1);
    for (const Row &row : newestLast)
        m_rows.prepend(row);
    endInsertRows();
    trim();
}

void DeliveriesModel::trim()
{
    if (m_rows.size() <= m_capacity)
        return;
    beginRemoveRows({}, m_capacity, int(m_rows.size()) - 1);
    m_rows.resize(m_capacity);
    endRemoveRows();
}

void DeliveriesModel::applyFolds()
{
    m_foldTimer.stop();
    if (m_paused || m_pendingFolds.empty())
        return;
    // The newest last, so that it ends above the others.
    std::vector<std::pair<FoldKey, Fold>> folds(m_pendingFolds.begin(), m_pendingFolds.end());
    m_pendingFolds.clear();
    std::stable_sort(folds.begin(), folds.end(), [](const auto &a, const auto &b) {
        return a.second.lastArrivedMs < b.second.lastArrivedMs;
    });
    for (const auto &entry : folds) {
        // Named, not a structured binding: clang 14 (the fuzz build) cannot capture one.
        const auto &key = entry.first;
        const auto &fold = entry.second;
        // A folded row has no key of its own: the rejections it counts stored nothing.
        DeliveryEvent shown = fold.last;
        shown.key.clear();
        shown.latencyUs = 0;
        shown.token = 0;
        shown.payload.clear();
        const auto row = std::find_if(m_rows.cbegin(), m_rows.cend(), [&key](const Row &r) {
            return r.folded && r.event.endpoint == key.first && r.event.status == key.second;
        });
        const int at = int(row - m_rows.cbegin()); // the row's, or the end
        // Its place by its last rejection's time: the top while the flood lasts, below a real
        // delivery that came after it (the timer runs up to kFoldIntervalMs later).
        int to = 0;
        while (to < at && m_rows.at(to).arrivedMs > fold.lastArrivedMs)
            ++to;
        if (row == m_rows.cend()) { // new, or pushed out of the list by newer ones
            shown.count = std::min(fold.count, kMaxDeliveryCount);
            beginInsertRows({}, to, to);
            m_rows.insert(to, Row{shown, true, fold.sinceMs, fold.lastArrivedMs});
            endInsertRows();
            continue;
        }
        shown.count = std::min(row->event.count + fold.count, kMaxDeliveryCount);
        if (to < at) {
            beginMoveRows({}, at, at, {}, to);
            m_rows.move(at, to);
            endMoveRows();
        }
        m_rows[to].event = shown;
        m_rows[to].arrivedMs = fold.lastArrivedMs;
        Q_EMIT dataChanged(index(to, 0), index(to, ColumnCount - 1));
    }
    trim();
}

void DeliveriesModel::setPaused(bool paused)
{
    if (paused == m_paused)
        return;
    m_paused = paused;
    if (paused)
        return m_foldTimer.stop();
    QList<Row> held;
    held.swap(m_held);
    insert(held);
    applyFolds();
}

qint64 DeliveriesModel::heldCount() const
{
    qint64 n = m_held.size();
    for (const auto &[key, fold] : m_pendingFolds)
        n += fold.count;
    return n;
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
