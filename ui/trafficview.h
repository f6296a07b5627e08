#pragma once

#include "store/storepool.h"

#include <QMap>
#include <QTimer>
#include <QWidget>

#include <array>
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
// thread.
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

Q_SIGNALS:
    void updated();

private:
    void render();
    void applyPalette();
    void changeEvent(QEvent *event) override;
    const Window &window() const;
    qint64 bucketStart(int bucket) const; // in seconds since the epoch

    std::shared_ptr<StorePool> m_pool;
    using Counts = std::array<qint64, 8>;
    QMap<qint64, QHash<QString, Counts>> m_buckets; // second → endpoint → outcomes
    bool m_polling = false;
    bool m_primed = false;
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
};

} // namespace idem
