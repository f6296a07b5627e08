#pragma once

#include "store/storepool.h"

#include <QAbstractTableModel>
#include <QTimer>

#include <memory>
#include <optional>

namespace idem {

// The keys of a store, newest activity first, a page at a time (fetchMore as the view
// scrolls). Every read runs on a store worker; answers come back to the GUI thread and are
// dropped when stale (the filter changed meanwhile). TTL and lease columns count down live.
class KeysModel final : public QAbstractTableModel
{
    Q_OBJECT
public:
    enum Column {
        Key,
        Endpoint,
        Type,
        State,
        Deliveries,
        FirstSeen,
        LastSeen,
        Ttl,
        Lease,
        ColumnCount
    };
    enum Role { RawValueRole = Qt::UserRole + 1, KeyRole, StuckRole };

    explicit KeysModel(std::shared_ptr<StorePool> pool, int pageSize = 200, QObject *parent = nullptr);

    int rowCount(const QModelIndex &parent = {}) const override;
    int columnCount(const QModelIndex &parent = {}) const override;
    QVariant data(const QModelIndex &index, int role = Qt::DisplayRole) const override;
    QVariant headerData(int section, Qt::Orientation orientation, int role) const override;
    bool canFetchMore(const QModelIndex &parent) const override;
    void fetchMore(const QModelIndex &parent) override;

    // Text with * ? [ is a glob on the key; other text matches anywhere in the key. `type`
    // (exact) and `search` (text in the stored request bodies) page through
    // IdempotencyStore::findKeys() instead: each call bounded by kFindBudgetMs, and the next one
    // asked for at once while a page is not full, until it is or nothing older matches.
    void setFilter(std::optional<KeyState> state, const QString &endpoint, const QString &text,
                   const QString &type = {}, const QString &search = {});
    // How long one findKeys() call on a store worker may read before it answers.
    static constexpr int kFindBudgetMs = 150;
    void setFindBudgetMs(int ms) { m_findBudgetMs = ms; } // tests: a find of many calls
    // A type or a search is set: rows come from findKeys().
    bool isFinding() const { return !m_type.isEmpty() || !m_search.isEmpty(); }
    // Finding, and the store has more to look through for the page being filled.
    bool isSearching() const { return isFinding() && m_loading; }
    // Finding, and every key the store holds was looked at: the rows are all there are.
    bool foundAll() const { return isFinding() && m_atEnd; }
    qint64 scanned() const { return m_scanned; } // keys looked at by this find so far
    QString type() const { return m_type; }
    QString search() const { return m_search; }
    // Re-reads the loaded rows and the counts (after an action, or on a timer).
    void refresh();
    const KeyRecord *record(int row) const;
    int rowOfKey(const QString &key) const;
    // Counts of the current endpoint filter, by state.
    StateCounts counts() const { return m_counts; }
    qint64 clockOffsetMs() const { return m_clockOffsetMs; } // the store's clock minus this machine's
    bool isLoading() const { return m_loading; }
    QString glob() const { return m_glob; } // the text filter as the store reads it

Q_SIGNALS:
    void countsChanged();
    void loaded(); // a page or a refresh arrived
    void findProgress(); // a find's call answered (isSearching(), foundAll(), scanned() moved)
    void storeError(const QString &message);

private:
    void requestCounts();
    void moveTo(const QList<KeyRecord> &fresh, qsizetype window);
    KeyQuery query(int offset, int limit) const;
    void fetchFound();
    void refreshFound();
    void addRows(const QList<KeyRecord> &page);

    std::shared_ptr<StorePool> m_pool;
    int m_pageSize;
    QList<KeyRecord> m_rows;
    std::optional<KeyState> m_state;
    QString m_endpoint;
    QString m_glob;
    QString m_type;
    QString m_search;
    QString m_after; // finding: where the next findKeys() call goes on (KeyPage::next)
    qint64 m_scanned = 0;
    int m_findBudgetMs = kFindBudgetMs;
    qsizetype m_shift =
        0; // rows loaded twice by the pages since the last refresh: the list moved down
    bool m_atEnd = false;
    bool m_loading = false;
    qint64 m_pageFailedAtMs = 0; // a page the store refused is asked for again a second later
    bool m_refreshing = false;
    quint64 m_generation = 0;
    quint64 m_refreshes = 0;
    StateCounts m_counts;
    qint64 m_clockOffsetMs = 0; // the store's clock minus this machine's
    QTimer m_tick;
};

} // namespace idem
