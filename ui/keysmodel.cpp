#include "keysmodel.h"

#include "colours.h"
#include "richtext.h"
#include "util/clock.h"
#include "util/format.h"

#include <QBrush>
#include <QColor>
#include <QDateTime>
#include <QHash>
#include <QSet>

#include <algorithm>

namespace idem {

namespace {
// Today's times as hh:mm:ss, older ones with their date.
QString shortTime(qint64 ms)
{
    const QDateTime t = QDateTime::fromMSecsSinceEpoch(ms);
    return t.date() == QDate::currentDate() ? t.toString(u"hh:mm:ss"_qs) : t.toString(u"yyyy-MM-dd hh:mm"_qs);
}
} // namespace

KeysModel::KeysModel(std::shared_ptr<StorePool> pool, int pageSize, QObject *parent)
    : QAbstractTableModel(parent), m_pool(std::move(pool)), m_pageSize(pageSize)
{
    // The TTL and lease columns count down; nothing is read for that.
    m_tick.setInterval(1000);
    connect(&m_tick, &QTimer::timeout, this, [this] {
        if (!m_rows.isEmpty())
            Q_EMIT dataChanged(index(0, Ttl), index(int(m_rows.size()) - 1, Lease), {Qt::DisplayRole, RawValueRole});
    });
    m_tick.start();
}

int KeysModel::rowCount(const QModelIndex &parent) const
{
    return parent.isValid() ? 0 : int(m_rows.size());
}

int KeysModel::columnCount(const QModelIndex &parent) const
{
    return parent.isValid() ? 0 : ColumnCount;
}

QVariant KeysModel::headerData(int section, Qt::Orientation orientation, int role) const
{
    if (orientation != Qt::Horizontal || role != Qt::DisplayRole)
        return {};
    switch (section) {
    case Key: return tr("Key");
    case Endpoint: return tr("Endpoint");
    case Type:
        return tr("Type");
    case State: return tr("State");
    case Deliveries: return tr("Deliveries");
    case FirstSeen: return tr("First seen");
    case LastSeen: return tr("Last seen");
    case Ttl: return tr("TTL");
    case Lease: return tr("Lease");
    }
    return {};
}

QVariant KeysModel::data(const QModelIndex &index, int role) const
{
    if (!checkIndex(index, CheckIndexOption::IndexIsValid | CheckIndexOption::ParentIsInvalid))
        return {};
    const KeyRecord &r = m_rows.at(index.row());
    const qint64 now = wallMs() + m_clockOffsetMs;
    const bool processing = r.state == KeyState::Processing;
    const bool stuck = processing && r.leaseUntilMs <= now;
    switch (role) {
    case KeyRole:
        return r.key;
    case StuckRole:
        return stuck;
    case RawValueRole:
        switch (index.column()) {
        case Key: return r.key;
        case Endpoint: return r.endpoint;
        case Type:
            return r.type;
        case State: return int(r.state);
        case Deliveries: return r.attempts;
        case FirstSeen: return r.createdMs;
        case LastSeen: return r.updatedMs;
        case Ttl: return r.expiresAtMs - now;
        case Lease: return processing ? r.leaseUntilMs - now : std::numeric_limits<qint64>::max();
        }
        return {};
    case Qt::DisplayRole:
        // Key and endpoint are what a sender or a shared store wrote: no bidi control
        // reorders the row.
        switch (index.column()) {
        case Key: return escapeControls(r.key);
        case Endpoint: return escapeControls(r.endpoint);
        case Type:
            return escapeControls(r.type);
        case State: return toString(r.state);
        case Deliveries: return r.attempts;
        case FirstSeen: return shortTime(r.createdMs);
        case LastSeen: return shortTime(r.updatedMs);
        case Ttl: return formatDuration(r.expiresAtMs - now);
        case Lease:
            if (!processing)
                return QString();
            return stuck ? tr("stuck %1").arg(formatDuration(now - r.leaseUntilMs))
                         : tr("%1 left").arg(formatDuration(r.leaseUntilMs - now));
        }
        return {};
    case Qt::ForegroundRole:
        if (index.column() == State) {
            return QBrush(stateColour(r.state));
        }
        return {};
    case Qt::BackgroundRole:
        if (stuck)
            return QBrush(stuckBackground()); // a processing key whose worker is gone
        return {};
    case Qt::ToolTipRole:
        if (index.column() == Key)
            return plainToolTip(r.key); // the whole key: the column elides it in the middle
        if (stuck)
            return tr("The lease ran out %1 ago: the worker likely died. The next delivery recovers it; or force-fail it.")
                .arg(formatDuration(now - r.leaseUntilMs));
        if (!r.error.isEmpty())
            return plainToolTip(r.error);
        return {};
    }
    return {};
}

KeyQuery KeysModel::query(int offset, int limit) const
{
    KeyQuery q;
    q.state = m_state;
    q.endpoint = m_endpoint;
    q.glob = m_glob;
    q.type = m_type;
    q.search = m_search;
    q.offset = offset;
    q.limit = limit;
    return q;
}

bool KeysModel::canFetchMore(const QModelIndex &parent) const
{
    // Not while a refresh is out: its rows come in first (a page asked for before them counted
    // the keys it brings as moved down twice, and the next page skipped as many rows for good).
    return !parent.isValid() && !m_atEnd && !m_loading && !m_refreshing &&
           wallMs() - m_pageFailedAtMs >= 1000;
}

void KeysModel::fetchMore(const QModelIndex &parent)
{
    if (!canFetchMore(parent))
        return;
    m_loading = true;
    if (isFinding())
        return fetchFound();
    const KeyQuery q = query(int(m_rows.size() + m_shift), m_pageSize);
    const quint64 generation = m_generation;
    m_pool->submit<QList<KeyRecord>>(
        this, [q](IdempotencyStore &s) { return s.listKeys(q); },
        [this, generation, q](Result<QList<KeyRecord>> page) {
            if (generation != m_generation)
                return; // the filter changed meanwhile
            if (!page) {
                // Not the end of the list: the next scroll (or refresh) asks again. Taken for
                // the end, no page was read again until the filter changed.
                m_loading = false;
                m_pageFailedAtMs = wallMs();
                Q_EMIT storeError(page.error().message);
                return;
            }
            m_atEnd = page->size() < q.limit;
            // Keys that arrived since the last refresh pushed the list down: the page starts
            // with rows loaded already. Not shown twice, and the next page is asked that much
            // further on (the same page again, under traffic, and never the end of it).
            QSet<QString> known;
            known.reserve(m_rows.size());
            for (const KeyRecord &r : std::as_const(m_rows))
                known.insert(r.key);
            QList<KeyRecord> added;
            for (const KeyRecord &r : std::as_const(*page))
                if (!known.contains(r.key))
                    added.append(r);
            m_shift += page->size() - added.size();
            // Still "loading" while the rows go in: a view asking for more from inside the
            // insertion must not fetch the same offset again.
            addRows(added);
            m_loading = false;
            Q_EMIT loaded();
        });
}

void KeysModel::addRows(const QList<KeyRecord> &page)
{
    if (page.isEmpty())
        return;
    beginInsertRows({}, int(m_rows.size()), int(m_rows.size() + page.size()) - 1);
    m_rows += page;
    endInsertRows();
}

void KeysModel::fetchFound()
{
    KeyQuery q = query(0, m_pageSize);
    q.after = m_after;
    q.budgetMs = m_findBudgetMs;
    const quint64 generation = m_generation;
    m_pool->submit<KeyPage>(
        this, [q](IdempotencyStore &s) { return s.findKeys(q); },
        [this, generation](Result<KeyPage> page) {
            if (generation != m_generation)
                return; // the filter changed meanwhile: this find stops here
            if (!page) {
                m_loading = false;
                m_pageFailedAtMs = wallMs();
                Q_EMIT storeError(page.error().message);
                Q_EMIT findProgress();
                return;
            }
            m_scanned += page->scanned;
            m_after = page->next;
            m_atEnd = page->next.isEmpty();
            // A key claimed again during the find moved ahead of it and may come back: shown once.
            QSet<QString> known;
            for (const KeyRecord &r : std::as_const(m_rows))
                known.insert(r.key);
            QList<KeyRecord> added;
            for (const KeyRecord &r : std::as_const(page->records))
                if (!known.contains(r.key))
                    added.append(r);
            addRows(added);
            // A call that ran out of its budget before its page was full goes on at once, on a
            // store worker: the GUI thread only takes the answers.
            if (!m_atEnd && page->records.size() < m_pageSize) {
                Q_EMIT findProgress();
                return fetchFound();
            }
            m_loading = false;
            Q_EMIT findProgress();
            Q_EMIT loaded();
        });
}

// A find's rows are read again key by key (the store's find is not run again every second:
// on a million keys a search reads them all): their state, deliveries and TTL stay current,
// and a key deleted or expired meanwhile leaves the list.
void KeysModel::refreshFound()
{
    QStringList keys;
    for (qsizetype i = 0; i < std::min<qsizetype>(m_rows.size(), 500); ++i)
        keys.append(m_rows.at(i).key);
    if (keys.isEmpty())
        return;
    m_refreshing = true;
    const quint64 generation = m_generation;
    m_pool->submit<QList<std::optional<KeyRecord>>>(
        this,
        [keys](IdempotencyStore &s) -> Result<QList<std::optional<KeyRecord>>> {
            QList<std::optional<KeyRecord>> records;
            for (const QString &key : keys) {
                auto record = s.key(key);
                if (!record)
                    return record.error();
                if (*record) { // the list's record: no request, result or history
                    (*record)->request = {};
                    (*record)->result = {};
                    (*record)->history.clear();
                }
                records.append(*record);
            }
            return records;
        },
        [this, generation, keys](Result<QList<std::optional<KeyRecord>>> records) {
            if (generation != m_generation)
                return;
            m_refreshing = false;
            if (!records) {
                Q_EMIT storeError(records.error().message);
                return;
            }
            for (qsizetype i = records->size() - 1; i >= 0; --i) {
                const int row = rowOfKey(keys.at(i));
                if (row < 0)
                    continue;
                if (!records->at(i)) {
                    beginRemoveRows({}, row, row);
                    m_rows.removeAt(row);
                    endRemoveRows();
                    continue;
                }
                m_rows[row] = *records->at(i);
                Q_EMIT dataChanged(index(row, 0), index(row, ColumnCount - 1));
            }
            Q_EMIT loaded();
        });
}

void KeysModel::setFilter(std::optional<KeyState> state, const QString &endpoint,
                          const QString &text, const QString &type, const QString &search)
{
    QString glob = text.trimmed();
    if (!glob.isEmpty() && !glob.contains(u'*') && !glob.contains(u'?') && !glob.contains(u'['))
        glob = u"*"_qs + glob + u"*"_qs;
    const bool endpointChanged = endpoint != m_endpoint;
    ++m_generation;
    beginResetModel();
    m_state = state;
    m_endpoint = endpoint;
    m_glob = glob;
    m_type = type.trimmed();
    m_search = search;
    m_after.clear();
    m_scanned = 0;
    m_rows.clear();
    m_shift = 0;
    m_atEnd = false;
    m_loading = false;
    m_pageFailedAtMs = 0;
    m_refreshing = false;
    endResetModel();
    fetchMore({});
    if (endpointChanged || m_counts.total() == 0)
        requestCounts();
}

void KeysModel::requestCounts()
{
    // TTLs and leases count down on the store's clock: how far this machine's is from it.
    m_pool->submit<qint64>(
        this, [](IdempotencyStore &s) { return s.clockMs(); },
        [this, sentMs = wallMs()](Result<qint64> clock) {
            if (clock)
                m_clockOffsetMs = *clock - (sentMs + wallMs()) / 2;
        });
    const QString endpoint = m_endpoint;
    m_pool->submit<StateCounts>(
        this, [endpoint](IdempotencyStore &s) { return s.countKeys(endpoint); },
        [this, endpoint](Result<StateCounts> counts) {
            if (!counts) {
                Q_EMIT storeError(counts.error().message);
                return;
            }
            if (endpoint != m_endpoint)
                return;
            m_counts = *counts;
            Q_EMIT countsChanged();
        });
}

void KeysModel::refresh()
{
    // Counting a million keys takes a store worker a while: every fifth refresh is enough.
    if (m_refreshes++ % 5 == 0)
        requestCounts();
    if (m_refreshing || m_loading)
        return;
    if (isFinding())
        return refreshFound();
    m_refreshing = true;
    const KeyQuery q = query(0, std::max(m_pageSize, int(std::min<qsizetype>(m_rows.size(), 5000))));
    const quint64 generation = m_generation;
    m_pool->submit<QList<KeyRecord>>(
        this, [q](IdempotencyStore &s) { return s.listKeys(q); },
        [this, generation, q](Result<QList<KeyRecord>> rows) {
            if (generation != m_generation)
                return;
            m_refreshing = false;
            if (!rows) {
                Q_EMIT storeError(rows.error().message);
                return;
            }
            // Past the rows a refresh reads (5000), the loaded ones stay: only the first are
            // read again, and compared (all rows were replaced, and the selection lost, every
            // second once more were loaded).
            const qsizetype n = rows->size();
            bool sameKeys = m_rows.size() > q.limit ? n == q.limit : n == m_rows.size();
            for (qsizetype i = 0; sameKeys && i < n; ++i)
                sameKeys = rows->at(i).key == m_rows.at(i).key;
            if (sameKeys) {
                std::copy(rows->cbegin(), rows->cend(), m_rows.begin());
                if (n)
                    Q_EMIT dataChanged(index(0, 0), index(int(n) - 1, ColumnCount - 1));
            } else {
                if (n < q.limit)
                    m_atEnd = true; // the whole list
                else if (m_rows.size() <= q.limit)
                    m_atEnd = false;
                moveTo(*rows, q.limit);
            }
            Q_EMIT loaded();
        });
}

// The rows as a refresh read them (`fresh`, the first `window` of the list), followed by the
// loaded rows the list has pushed past the window, as one change of the layout: the selection
// and the current row follow their keys, the view keeps its place, and rows loaded past the
// window stay. A reset did it before: under traffic (a new key is the newest) the view went back
// to the top every second, the rows past 5000 were dropped and loaded again.
void KeysModel::moveTo(const QList<KeyRecord> &fresh, qsizetype window)
{
    QHash<QString, int> rowOf;
    rowOf.reserve(fresh.size());
    for (qsizetype i = 0; i < fresh.size(); ++i)
        rowOf.insert(fresh.at(i).key, int(i));
    // Only rows loaded past the window are kept after it: nothing re-reads them. Activity only
    // grows, so those the list pushed past the window were after the window's last row: the
    // loaded rows after it that are not in the window follow it (a row before it that is not in
    // the window is gone). With no row loaded past the window there is nothing to keep: a loaded
    // row missing from it is gone, or pushed past it, where the next page reads it (keeping it
    // kept deleted keys: the window's last row was then one never loaded, and every loaded row
    // missing from the window passed for pushed).
    qsizetype pushed = m_rows.size();
    if (m_rows.size() > window && fresh.size() >= window && !fresh.isEmpty()) {
        pushed = 0; // the window's last row is new: every loaded row is past it
        for (qsizetype i = m_rows.size() - 1; i >= 0; --i)
            if (m_rows.at(i).key == fresh.last().key) {
                pushed = i + 1;
                break;
            }
    }
    QList<KeyRecord> rows = fresh;
    for (qsizetype i = pushed; i < m_rows.size(); ++i)
        if (!rowOf.contains(m_rows.at(i).key)) {
            rowOf.insert(m_rows.at(i).key, int(rows.size()));
            rows.append(m_rows.at(i));
        }
    // The count changes outside the layout change: rows are added at the end before it and
    // taken from the end after it (blank meanwhile, never drawn).
    const qsizetype was = m_rows.size();
    if (rows.size() > was) {
        beginInsertRows({}, int(was), int(rows.size()) - 1);
        m_rows.resize(rows.size());
        endInsertRows();
    }
    const qsizetype kept = rows.size();
    rows.resize(m_rows.size());
    Q_EMIT layoutAboutToBeChanged();
    const QModelIndexList from = persistentIndexList();
    QModelIndexList to;
    to.reserve(from.size());
    for (const QModelIndex &i : from) {
        const int row = i.row() < was ? rowOf.value(m_rows.at(i.row()).key, -1) : -1;
        to.append(row < 0 ? QModelIndex() : index(row, i.column()));
    }
    m_rows = std::move(rows);
    m_shift = 0; // the keys that pushed the list down are among the rows now
    changePersistentIndexList(from, to);
    Q_EMIT layoutChanged();
    if (kept < m_rows.size()) {
        beginRemoveRows({}, int(kept), int(m_rows.size()) - 1);
        m_rows.resize(kept);
        endRemoveRows();
    }
}

const KeyRecord *KeysModel::record(int row) const
{
    return row >= 0 && row < m_rows.size() ? &m_rows.at(row) : nullptr;
}

int KeysModel::rowOfKey(const QString &key) const
{
    for (qsizetype i = 0; i < m_rows.size(); ++i)
        if (m_rows.at(i).key == key)
            return int(i);
    return -1;
}

} // namespace idem
