#include "trafficview.h"

#include "util/clock.h"

#include <QChart>
#include <QChartView>
#include <QHeaderView>
#include <QLabel>
#include <QLineSeries>
#include <QSplitter>
#include <QTableWidget>
#include <QValueAxis>
#include <QVBoxLayout>

namespace idem {

namespace {
constexpr int kPollLimit = 50000;
const std::array kShown{Outcome::Processed, Outcome::Replayed, Outcome::InProgress, Outcome::Reprocessed,
                        Outcome::Recovered, Outcome::Rejected, Outcome::Unavailable};
const std::array kColours{0x1b7f3b, 0x1f5fb0, 0xb06a00, 0x6a1bb0, 0x00838f, 0xb02020, 0x555555};
} // namespace

TrafficView::TrafficView(std::shared_ptr<StorePool> pool, QWidget *parent)
    : QWidget(parent), m_pool(std::move(pool)), m_chart(new QChart()), m_axisY(new QValueAxis(this)),
      m_table(new QTableWidget(0, 5, this)), m_note(new QLabel(this))
{
    auto *layout = new QVBoxLayout(this);
    m_chart->setTitle(tr("Deliveries per second, by outcome (last %1 minutes)").arg(kWindowSeconds / 60));
    auto *axisX = new QValueAxis(this);
    axisX->setRange(-kWindowSeconds, 0);
    axisX->setTitleText(tr("seconds ago"));
    axisX->setLabelFormat(u"%d"_qs);
    m_axisY->setRange(0, 10);
    m_axisY->setLabelFormat(u"%d"_qs);
    m_axisY->setTitleText(tr("deliveries / s"));
    m_chart->addAxis(axisX, Qt::AlignBottom);
    m_chart->addAxis(m_axisY, Qt::AlignLeft);
    for (size_t i = 0; i < kShown.size(); ++i) {
        auto *series = new QLineSeries(this);
        series->setName(toString(kShown[i]));
        QPen pen(QColor::fromRgb(QRgb(kColours[i])));
        pen.setWidth(2);
        series->setPen(pen);
        m_chart->addSeries(series);
        series->attachAxis(axisX);
        series->attachAxis(m_axisY);
        m_series.append(series);
    }
    m_chart->legend()->setAlignment(Qt::AlignBottom);
    m_chartView = new QChartView(m_chart, this);
    m_chartView->setRenderHint(QPainter::Antialiasing);
    m_chartView->setMinimumHeight(260);

    m_table->setHorizontalHeaderLabels({tr("Endpoint"), tr("Deliveries"), tr("Processed"), tr("Duplicates"), tr("Duplicate ratio")});
    m_table->horizontalHeader()->setStretchLastSection(true);
    m_table->verticalHeader()->hide();
    m_table->setEditTriggers(QAbstractItemView::NoEditTriggers);
    m_note->setWordWrap(true);
    m_note->setText(tr("Duplicates are deliveries that were answered from the store (replayed) or told to retry "
                       "(in-progress): the traffic the desk kept away from your app."));

    auto *split = new QSplitter(Qt::Vertical, this);
    split->addWidget(m_chartView);
    auto *bottom = new QWidget(split);
    auto *bottomLayout = new QVBoxLayout(bottom);
    bottomLayout->setContentsMargins(0, 0, 0, 0);
    bottomLayout->addWidget(m_note);
    bottomLayout->addWidget(m_table);
    split->addWidget(bottom);
    layout->addWidget(split);

    m_timer.setInterval(1000);
    connect(&m_timer, &QTimer::timeout, this, &TrafficView::poll);
    m_timer.start();
    poll();
}

void TrafficView::poll()
{
    if (m_polling)
        return;
    m_polling = true;
    const qint64 now = wallMs();
    // Log entries reach the store in batches: the last few seconds are read again each time.
    DeliveryQuery q;
    // Whole seconds: every bucket from `since` on is rebuilt from what the store returns.
    q.sinceMs = ((m_primed ? now - 5000 : now - kWindowSeconds * 1000LL) / 1000) * 1000;
    q.limit = kPollLimit;
    m_pool->submit<QList<DeliveryEvent>>(
        this, [q](IdempotencyStore &s) { return s.deliveries(q); },
        [this, q, now](Result<QList<DeliveryEvent>> events) {
            m_polling = false;
            if (!events)
                return;
            m_primed = true;
            const qint64 from = q.sinceMs / 1000;
            m_buckets.erase(m_buckets.lowerBound(from), m_buckets.end());
            m_buckets.erase(m_buckets.begin(), m_buckets.lowerBound(now / 1000 - kWindowSeconds));
            for (const DeliveryEvent &e : *events) {
                Counts &c = m_buckets[e.atMs / 1000][e.endpoint];
                c[size_t(e.outcome)] += 1;
            }
            render();
            Q_EMIT updated();
        });
}

qint64 TrafficView::total(Outcome outcome) const
{
    qint64 n = 0;
    for (const auto &second : m_buckets)
        for (const Counts &c : second)
            n += c[size_t(outcome)];
    return n;
}

double TrafficView::duplicateRatio(const QString &endpoint) const
{
    Counts c{};
    for (const auto &second : m_buckets)
        if (second.contains(endpoint))
            for (size_t i = 0; i < c.size(); ++i)
                c[i] += second.value(endpoint)[i];
    const qint64 dup = c[size_t(Outcome::Replayed)] + c[size_t(Outcome::InProgress)];
    const qint64 claimed = dup + c[size_t(Outcome::Processed)] + c[size_t(Outcome::Reprocessed)]
                           + c[size_t(Outcome::Recovered)] + c[size_t(Outcome::Mismatch)];
    return claimed ? double(dup) / double(claimed) : 0.0;
}

void TrafficView::render()
{
    const qint64 nowSecond = wallMs() / 1000;
    qint64 peak = 1;
    for (size_t i = 0; i < kShown.size(); ++i) {
        QList<QPointF> points;
        points.reserve(kWindowSeconds + 1);
        for (qint64 s = nowSecond - kWindowSeconds; s <= nowSecond; ++s) {
            qint64 n = 0;
            const auto it = m_buckets.constFind(s);
            if (it != m_buckets.constEnd())
                for (const Counts &c : *it)
                    n += c[size_t(kShown[i])];
            peak = std::max(peak, n);
            points.append(QPointF(double(s - nowSecond), double(n)));
        }
        m_series[qsizetype(i)]->replace(points);
    }
    m_axisY->setRange(0, double(peak) * 1.1 + 1);

    QMap<QString, Counts> perEndpoint;
    for (const auto &second : m_buckets)
        for (auto it = second.begin(); it != second.end(); ++it)
            for (size_t i = 0; i < it->size(); ++i)
                perEndpoint[it.key()][i] += (*it)[i];
    m_table->setRowCount(int(perEndpoint.size()));
    int row = 0;
    for (auto it = perEndpoint.begin(); it != perEndpoint.end(); ++it, ++row) {
        const Counts &c = *it;
        qint64 all = 0;
        for (qint64 v : c)
            all += v;
        const qint64 processed = c[size_t(Outcome::Processed)] + c[size_t(Outcome::Reprocessed)] + c[size_t(Outcome::Recovered)];
        const qint64 dup = c[size_t(Outcome::Replayed)] + c[size_t(Outcome::InProgress)];
        const QStringList cells{it.key().isEmpty() ? tr("(unknown endpoint)") : it.key(), QString::number(all),
                                QString::number(processed), QString::number(dup),
                                u"%1 %"_qs.arg(duplicateRatio(it.key()) * 100.0, 0, 'f', 1)};
        for (int col = 0; col < cells.size(); ++col)
            m_table->setItem(row, col, new QTableWidgetItem(cells[col]));
    }
}

} // namespace idem
