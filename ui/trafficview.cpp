#include "trafficview.h"

#include "colours.h"
#include "util/clock.h"
#include "util/format.h"

#include <QApplication>
#include <QBarSet>
#include <QComboBox>
#include <QCursor>
#include <QDateTime>
#include <QHBoxLayout>
#include <QPainter>
#include <QStackedBarSeries>
#include <QStyledItemDelegate>
#include <QToolTip>

#include <QChart>
#include <QChartView>
#include <QHeaderView>
#include <QLabel>
#include <QSplitter>
#include <QTableWidget>
#include <QVBoxLayout>
#include <QValueAxis>

namespace idem {

namespace {
// Deliveries a read takes at once: a few MB on the worker (a mismatch's payload is the most).
constexpr int kPage = 20000;
const std::array kShown{Outcome::Processed,   Outcome::Replayed,   Outcome::InProgress,
                        Outcome::Reprocessed, Outcome::Recovered,  Outcome::Mismatch,
                        Outcome::Rejected,    Outcome::Unavailable};

QColor outcomeBarColour(Outcome outcome)
{
    // The state colours, told apart where two outcomes share one.
    switch (outcome) {
    case Outcome::Reprocessed:
        return outcomeColour(outcome).lighter(135);
    case Outcome::Recovered:
        return QColor(0x00, 0x83, 0x8f);
    case Outcome::Mismatch:
        return QColor(0x8e, 0x44, 0xad);
    case Outcome::Unavailable:
        return QColor(0x77, 0x77, 0x77);
    default:
        return outcomeColour(outcome);
    }
}

// The duplicate ratio as a bar behind its number.
class RatioDelegate final : public QStyledItemDelegate
{
public:
    using QStyledItemDelegate::QStyledItemDelegate;
    void paint(QPainter *painter, const QStyleOptionViewItem &option,
               const QModelIndex &index) const override
    {
        const double ratio = std::clamp(index.data(Qt::UserRole).toDouble(), 0.0, 1.0);
        QRect bar = option.rect.adjusted(3, 4, -3, -4);
        bar.setWidth(int(bar.width() * ratio));
        painter->save();
        QColor fill = outcomeColour(Outcome::Replayed);
        fill.setAlpha(110);
        painter->fillRect(bar, fill);
        painter->restore();
        QStyledItemDelegate::paint(painter, option, index);
    }
};
} // namespace

const QList<TrafficView::Window> &TrafficView::windows()
{
    static const QList<Window> list{{tr("Last minute"), 60, 1},
                                    {tr("Last 5 minutes"), 300, 5},
                                    {tr("Last hour"), 3600, 60},
                                    {tr("Last 24 hours"), 86400, 900}};
    return list;
}

TrafficView::TrafficView(std::shared_ptr<StorePool> pool, QWidget *parent)
    : QWidget(parent), m_pool(std::move(pool)), m_chart(new QChart()),
      m_bars(new QStackedBarSeries(this)), m_axisX(new QValueAxis(this)),
      m_axisY(new QValueAxis(this)), m_window(new QComboBox(this)),
      m_table(new QTableWidget(0, 5, this)), m_note(new QLabel(this)), m_partial(new QLabel(this))
{
    auto *layout = new QVBoxLayout(this);
    for (const Window &w : windows())
        m_window->addItem(w.label);
    m_window->setCurrentIndex(1);
    auto *top = new QHBoxLayout;
    top->addWidget(new QLabel(tr("Window"), this));
    top->addWidget(m_window);
    top->addStretch(1);
    layout->addLayout(top);
    m_partial->setWordWrap(true);
    m_partial->setTextFormat(Qt::RichText);
    m_partial->hide();
    layout->addWidget(m_partial);

    m_axisX->setLabelsVisible(false);
    m_axisX->setGridLineVisible(false);
    m_axisY->setLabelFormat(u"%d"_qs);
    m_axisY->setTitleText(tr("deliveries"));
    m_chart->addAxis(m_axisX, Qt::AlignBottom);
    m_chart->addAxis(m_axisY, Qt::AlignLeft);
    for (Outcome outcome : kShown) {
        auto *set = new QBarSet(toString(outcome), this);
        set->setColor(outcomeBarColour(outcome));
        set->setBorderColor(outcomeBarColour(outcome));
        m_bars->append(set);
        m_sets.append(set);
        connect(set, &QBarSet::hovered, this, [this](bool over, int bucket) {
            if (over)
                QToolTip::showText(QCursor::pos(), bucketSummary(bucket), m_chartView);
            else
                QToolTip::hideText();
        });
    }
    m_bars->setBarWidth(0.9);
    m_chart->addSeries(m_bars);
    m_bars->attachAxis(m_axisX);
    m_bars->attachAxis(m_axisY);
    m_chart->legend()->setAlignment(Qt::AlignBottom);
    m_chart->setBackgroundVisible(false);
    m_chartView = new QChartView(m_chart, this);
    m_chartView->setRenderHint(QPainter::Antialiasing);
    m_chartView->setMinimumHeight(260);
    applyPalette();

    m_table->setHorizontalHeaderLabels({tr("Endpoint"), tr("Deliveries"), tr("Processed"), tr("Duplicates"), tr("Duplicate ratio")});
    m_table->horizontalHeader()->setStretchLastSection(true);
    m_table->verticalHeader()->hide();
    m_table->setEditTriggers(QAbstractItemView::NoEditTriggers);
    m_table->setItemDelegateForColumn(4, new RatioDelegate(m_table));
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
    split->setStretchFactor(0, 3); // the chart gets most of the height
    split->setStretchFactor(1, 1);
    split->setSizes({480, 200});
    layout->addWidget(split);

    connect(m_window, &QComboBox::currentIndexChanged, this, [this] {
        ++*m_generation;  // a read in flight was for the old window: its answer polls again
        m_primed = false; // read the whole new window
        m_countsFromMs = 0;
        m_buckets.clear();
        render(); // the new window's buckets, empty until its read answers
        poll();
    });
    m_timer.setInterval(1000);
    connect(&m_timer, &QTimer::timeout, this, &TrafficView::poll);
    m_timer.start();
    poll();
}

void TrafficView::applyPalette()
{
    // The chart follows the palette (dark desktops); so do the bars' colours.
    const QPalette palette = QApplication::palette();
    m_chart->setTitleBrush(palette.color(QPalette::WindowText));
    m_chart->legend()->setLabelColor(palette.color(QPalette::WindowText));
    for (QValueAxis *axis : {m_axisX, m_axisY}) {
        axis->setLabelsColor(palette.color(QPalette::WindowText));
        axis->setTitleBrush(palette.color(QPalette::WindowText));
        axis->setGridLineColor(palette.color(QPalette::Mid));
        axis->setLinePenColor(palette.color(QPalette::Mid));
    }
    for (qsizetype i = 0; i < m_sets.size(); ++i) {
        m_sets[i]->setColor(outcomeBarColour(kShown[size_t(i)]));
        m_sets[i]->setBorderColor(outcomeBarColour(kShown[size_t(i)]));
    }
}

void TrafficView::changeEvent(QEvent *event)
{
    if (event->type() == QEvent::PaletteChange)
        applyPalette();
    QWidget::changeEvent(event);
}

const TrafficView::Window &TrafficView::window() const
{
    return windows().at(std::max(0, m_window->currentIndex()));
}

int TrafficView::bucketCount() const
{
    return window().seconds / window().bucketSeconds;
}

qint64 TrafficView::bucketStart(int bucket) const
{
    // Buckets end at the current bucket (aligned to its size); the last one is the newest.
    const qint64 size = window().bucketSeconds;
    const qint64 last = (m_renderedAt / size) * size;
    return last - qint64(bucketCount() - 1 - bucket) * size;
}

qint64 TrafficView::bucketCount(int bucket, Outcome outcome) const
{
    const qint64 from = bucketStart(bucket);
    qint64 n = 0;
    for (auto it = m_buckets.lowerBound(from);
         it != m_buckets.end() && it.key() < from + window().bucketSeconds; ++it)
        for (const Counts &c : *it)
            n += c[size_t(outcome)];
    return n;
}

QString TrafficView::bucketSummary(int bucket) const
{
    const qint64 from = bucketStart(bucket);
    const QString format = window().bucketSeconds >= 60 ? u"hh:mm"_qs : u"hh:mm:ss"_qs;
    QStringList lines{u"<b>%1 – %2</b>"_qs.arg(
        QDateTime::fromSecsSinceEpoch(from).toString(format),
        QDateTime::fromSecsSinceEpoch(from + window().bucketSeconds).toString(format))};
    qint64 all = 0;
    for (Outcome outcome : kShown) {
        const qint64 n = bucketCount(bucket, outcome);
        all += n;
        if (n)
            lines << u"%1 %2"_qs.arg(toString(outcome)).arg(n);
    }
    if (!all)
        lines << tr("no deliveries");
    return lines.join(u"<br>"_qs);
}

void TrafficView::poll()
{
    if (m_polling)
        return; // its answer polls again when the window changed meanwhile
    m_polling = true;
    const qint64 now = wallMs();
    // Log entries reach the store in batches: the last few seconds are read again each time.
    // Whole seconds: every bucket from `since` on is rebuilt from what the store returns.
    const qint64 windowSeconds = window().seconds + window().bucketSeconds;
    const qint64 sinceMs = ((m_primed ? now - 5000 : now - windowSeconds * 1000LL) / 1000) * 1000;
    const quint64 generation = *m_generation;
    m_pool->submit<Read>(
        this,
        [sinceMs, cap = m_readCap, current = m_generation, generation](IdempotencyStore &s) {
            return read(s, sinceMs, cap, *current, generation);
        },
        [this, sinceMs, now, windowSeconds, generation](Result<Read> read) {
            m_polling = false;
            if (generation != *m_generation) {
                poll(); // read for a window no longer shown: the one shown is read whole
                return;
            }
            if (!read)
                return;
            m_primed = true;
            m_buckets.erase(m_buckets.lowerBound(sinceMs / 1000), m_buckets.end());
            m_buckets.erase(m_buckets.begin(), m_buckets.lowerBound(now / 1000 - windowSeconds));
            m_buckets.insert(read->seconds);
            if (read->fromMs > sinceMs)
                m_countsFromMs = std::max(m_countsFromMs, read->fromMs);
            render();
            Q_EMIT updated();
        });
}

Result<TrafficView::Read> TrafficView::read(IdempotencyStore &store, qint64 sinceMs, qint64 cap,
                                            const std::atomic<quint64> &generation, quint64 mine)
{
    Read read;
    read.fromMs = sinceMs;
    DeliveryQuery q;
    q.sinceMs = sinceMs;
    q.limit = int(std::min<qint64>(kPage, cap));
    qint64 counted = 0;
    while (generation == mine) {
        auto events = store.deliveries(q);
        if (!events)
            return events.error();
        const bool full = events->size() >= q.limit;
        // A full page may end inside its oldest millisecond: that one is read whole with the
        // next page, which ends (untilMs) where this one is counted to.
        const qint64 cut = full ? events->last().atMs : sinceMs - 1;
        qint64 page = 0;
        for (const DeliveryEvent &e : *events) {
            if (e.atMs <= cut)
                continue;
            // A summary of rejections stands for all of them (DeliveryEvent::count).
            read.seconds[e.atMs / 1000][e.endpoint][size_t(e.outcome)] += e.count;
            ++page;
        }
        counted += page;
        if (!full)
            break;
        if (page == 0 || counted >= cap) { // a page all in one millisecond, or the cap
            read.fromMs = cut + 1;
            break;
        }
        q.untilMs = cut + 1;
    }
    return read;
}

QString TrafficView::partialNotice() const
{
    return m_partial->isHidden() ? QString() : m_partial->text();
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
    m_renderedAt = wallMs() / 1000;
    const int buckets = bucketCount();
    qint64 peak = 1;
    QList<qint64> stacked(buckets, 0);
    for (qsizetype i = 0; i < m_sets.size(); ++i) {
        QList<qreal> values;
        values.reserve(buckets);
        for (int b = 0; b < buckets; ++b) {
            const qint64 n = bucketCount(b, kShown[size_t(i)]);
            stacked[b] += n;
            values.append(qreal(n));
        }
        m_sets[i]->remove(0, m_sets[i]->count());
        m_sets[i]->append(values);
    }
    for (qint64 n : stacked)
        peak = std::max(peak, n);
    m_axisX->setRange(-0.5, buckets - 0.5);
    m_axisY->setRange(0, double(peak) * 1.1 + 1);
    m_axisY->applyNiceNumbers();
    const int size = window().bucketSeconds;
    // Counts cut short inside the window shown: said above the chart and in its title.
    const bool partial = m_countsFromMs > bucketStart(0) * 1000;
    const QDateTime start = QDateTime::fromMSecsSinceEpoch(m_countsFromMs);
    const QString from = start.toString(
        start.date() == QDate::currentDate() ? u"hh:mm:ss"_qs : u"yyyy-MM-dd hh:mm:ss"_qs);
    m_chart->setTitle(tr("Deliveries by outcome, %1 (a bar is %2; now at the right)%3")
                          .arg(window().label.toLower(),
                               size < 60 ? countOf(size, u"second", u"seconds")
                                         : countOf(size / 60, u"minute", u"minutes"),
                               partial ? tr(" — counted from %1 on").arg(from) : QString()));
    m_partial->setVisible(partial);
    if (partial)
        m_partial->setText(
            tr("<b>Counts start at %1.</b> A read stops after %2 deliveries, and this window holds "
               "more: the bars before %1 and the numbers below leave out the older ones "
               "(<code>idemdesk stats --since</code> counts them all).")
                .arg(from, QString::number(m_readCap)));

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
        const double ratio = duplicateRatio(it.key());
        const QStringList cells{it.key().isEmpty() ? tr("(unknown endpoint)") : it.key(),
                                QString::number(all), QString::number(processed),
                                QString::number(dup), u"%1 %"_qs.arg(ratio * 100.0, 0, 'f', 1)};
        for (int col = 0; col < cells.size(); ++col) {
            auto *item = new QTableWidgetItem(cells[col]);
            if (col == 4)
                item->setData(Qt::UserRole, ratio); // the bar's length
            m_table->setItem(row, col, item);
        }
    }
}

} // namespace idem
