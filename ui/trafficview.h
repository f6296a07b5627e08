#pragma once

#include "store/storepool.h"

#include <QMap>
#include <QTimer>
#include <QWidget>

#include <array>
#include <atomic>
#include <memory>

class QBarSet;
class QChart;
class QChartView;
class QComboBox;
class QLabel;
class QStackedBarSeries;
class QTableWidget;
class QValueAxis;

namespace idem {

// Deliveries by outcome as stacked bars over a window the user picks (1 min, 5 min, 1 h, 24 h;
// 60 to 96 buckets that fit it; the counts on hover), and the duplicate ratio per endpoint with
// a bar beside its number, from the store's delivery log: so in attach mode it shows every
// instance writing to the store. Polls on a store worker once a second; never reads on the GUI
// thread. A window is read whole, a page at a time, and counted on the worker (the view keeps
// counts per second, never the deliveries); past readCap() deliveries the read stops and the
// view says where its counts start.
class TrafficView final : public QWidget
{
    Q_OBJECT
public:
    struct Window
    {
        QString label;
        int seconds;
        int bucketSeconds;
    };
    static const QList<Window> &windows(); // 1 min / 1 s, 5 min / 5 s, 1 h / 1 min, 24 h / 15 min

    explicit TrafficView(std::shared_ptr<StorePool> pool, QWidget *parent = nullptr);

    void poll();
    // Totals over the window shown.
    qint64 total(Outcome outcome) const;
    double duplicateRatio(const QString &endpoint) const;
    QTableWidget *ratios() const { return m_table; }
    QComboBox *windowChoice() const { return m_window; }
    int bucketCount() const;
    qint64 bucketCount(int bucket, Outcome outcome) const; // what the bar shows
    QString bucketSummary(int bucket) const;               // the hover text
    // Where the counts start when the window holds more deliveries than one read takes (empty:
    // the whole window is counted).
    QString partialNotice() const;
    static constexpr qint64 kReadCap = 2'000'000;
    qint64 readCap() const { return m_readCap; }
    void setReadCap(qint64 n) { m_readCap = std::max<qint64>(1, n); } // tests lower it

Q_SIGNALS:
    void updated();

private:
    using Counts = std::array<qint64, 8>;
    using Seconds = QMap<qint64, QHash<QString, Counts>>; // second → endpoint → outcomes
    struct Read
    {
        Seconds seconds;
        qint64 fromMs = 0; // every delivery from here on is counted
    };
    // Counts the deliveries from `sinceMs` on, newest first, a page at a time, until the log
    // ends, `cap` are counted, or `generation` moves on from `mine` (the window changed).
    static Result<Read> read(IdempotencyStore &store, qint64 sinceMs, qint64 cap,
                             const std::atomic<quint64> &generation, quint64 mine);
    void render();
    void applyPalette();
    void changeEvent(QEvent *event) override;
    const Window &window() const;
    qint64 bucketStart(int bucket) const; // in seconds since the epoch

    std::shared_ptr<StorePool> m_pool;
    Seconds m_buckets;
    bool m_polling = false;
    bool m_primed = false;
    // Moves on with each change of window: a read for the one before stops at its next page,
    // and its answer is dropped (the poll runs again for the window shown).
    std::shared_ptr<std::atomic<quint64>> m_generation = std::make_shared<std::atomic<quint64>>(0);
    qint64 m_countsFromMs = 0; // the counts are whole from here on (0: the whole window)
    qint64 m_readCap = kReadCap;
    QTimer m_timer;
    QChartView *m_chartView;
    QChart *m_chart;
    QStackedBarSeries *m_bars;
    QList<QBarSet *> m_sets;
    QValueAxis *m_axisX;
    QValueAxis *m_axisY;
    QComboBox *m_window;
    qint64 m_renderedAt = 0; // the second the bars end at
    QTableWidget *m_table;
    QLabel *m_note;
    QLabel *m_partial;
};

} // namespace idem
