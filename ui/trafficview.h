#pragma once

#include "store/storepool.h"

#include <QMap>
#include <QTimer>
#include <QWidget>

#include <array>
#include <memory>

class QChart;
class QChartView;
class QLabel;
class QLineSeries;
class QTableWidget;
class QValueAxis;

namespace idem {

// Deliveries per second by outcome over the last minutes, and the duplicate ratio per
// endpoint, from the store's delivery log: so in attach mode it shows every instance writing
// to the store. Polls on a store worker once a second; never reads on the GUI thread.
class TrafficView final : public QWidget
{
    Q_OBJECT
public:
    static constexpr int kWindowSeconds = 300;

    explicit TrafficView(std::shared_ptr<StorePool> pool, QWidget *parent = nullptr);

    void poll();
    qint64 total(Outcome outcome) const;
    double duplicateRatio(const QString &endpoint) const;
    QTableWidget *ratios() const { return m_table; }

Q_SIGNALS:
    void updated();

private:
    void render();

    std::shared_ptr<StorePool> m_pool;
    using Counts = std::array<qint64, 8>;
    QMap<qint64, QHash<QString, Counts>> m_buckets; // second → endpoint → outcomes
    bool m_polling = false;
    bool m_primed = false;
    QTimer m_timer;
    QChartView *m_chartView;
    QChart *m_chart;
    QList<QLineSeries *> m_series;
    QValueAxis *m_axisY;
    QTableWidget *m_table;
    QLabel *m_note;
};

} // namespace idem
