#include "keydetailview.h"

#include "colours.h"
#include "jsonhighlighter.h"
#include "richtext.h"
#include "textdiff.h"
#include "timelinemodel.h"
#include "util/clock.h"
#include "util/format.h"

#include <QCheckBox>
#include <QDateTime>
#include <QHeaderView>
#include <QLabel>
#include <QPlainTextEdit>
#include <QSplitter>
#include <QTabWidget>
#include <QTableView>
#include <QTableWidget>
#include <QVBoxLayout>

#include <algorithm>

namespace idem {

namespace {
QPlainTextEdit *bodyEditor(QWidget *parent)
{
    auto *edit = new QPlainTextEdit(parent);
    edit->setReadOnly(true);
    edit->setLineWrapMode(QPlainTextEdit::NoWrap);
    edit->setFont(QFont(u"monospace"_qs));
    new JsonHighlighter(edit->document());
    return edit;
}

// What a body pane shows of a body: a megabyte of JSON laid out and highlighted held the window
// for over a second. The whole body is a `keys show` or a Copy as curl away.
constexpr qsizetype kShownBodyChars = 256 * 1024;

QString shownBody(QString text)
{
    if (text.size() <= kShownBodyChars)
        return text;
    const qsizetype more = text.size() - kShownBodyChars;
    text.truncate(kShownBodyChars);
    return text +
           QObject::tr("\n… %1 more characters not shown (idemdesk keys show KEY, or Copy as curl, "
                       "gives the whole body)")
               .arg(more);
}

// The parts of a record the tabs draw (not its TTL or lease, which count down in the summary):
// unchanged, they are left as they are, scrolled and selected as the user left them.
bool sameTabs(const KeyRecord &a, const KeyRecord &b)
{
    return a.key == b.key && a.state == b.state && a.token == b.token &&
           a.request.method == b.request.method && a.request.path == b.request.path &&
           a.request.headers == b.request.headers && a.request.body == b.request.body &&
           a.result.status == b.result.status && a.result.headers == b.result.headers &&
           a.result.body == b.result.body;
}

bool sameEvents(const QList<DeliveryEvent> &a, const QList<DeliveryEvent> &b)
{
    return std::equal(a.cbegin(), a.cend(), b.cbegin(), b.cend(),
                      [](const DeliveryEvent &x, const DeliveryEvent &y) {
                          return x.atMs == y.atMs && x.outcome == y.outcome &&
                                 x.status == y.status && x.token == y.token &&
                                 x.instance == y.instance && x.detail == y.detail;
                      });
}

QTableWidget *headerTable(QWidget *parent)
{
    auto *table = new QTableWidget(0, 2, parent);
    table->setHorizontalHeaderLabels({QObject::tr("Header"), QObject::tr("Value")});
    table->horizontalHeader()->setStretchLastSection(true);
    table->verticalHeader()->hide();
    table->setEditTriggers(QAbstractItemView::NoEditTriggers);
    table->setMaximumHeight(160);
    return table;
}
} // namespace

KeyDetailView::KeyDetailView(QWidget *parent)
    : QWidget(parent), m_title(new QLabel(this)), m_summary(new QLabel(this)), m_banner(new QLabel(this)),
      m_tabs(new QTabWidget(this)), m_timeline(new TimelineModel(this))
{
    auto *layout = new QVBoxLayout(this);
    layout->setContentsMargins(4, 4, 4, 4);
    m_title->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_summary->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_summary->setWordWrap(true);
    m_banner->setWordWrap(true);
    // Action results quote keys and store errors: never read as HTML.
    m_title->setTextFormat(Qt::RichText);
    m_summary->setTextFormat(Qt::RichText);
    m_banner->setTextFormat(Qt::PlainText);
    m_banner->hide();
    layout->addWidget(m_title);
    layout->addWidget(m_summary);
    layout->addWidget(m_banner);

    auto *request = new QWidget(this);
    auto *requestLayout = new QVBoxLayout(request);
    m_raw = new QCheckBox(tr("Raw body"), request);
    m_requestHeaders = headerTable(request);
    m_requestBody = bodyEditor(request);
    requestLayout->addWidget(m_requestHeaders);
    requestLayout->addWidget(m_raw);
    requestLayout->addWidget(m_requestBody, 1);
    m_tabs->addTab(request, tr("Request"));

    auto *result = new QWidget(this);
    auto *resultLayout = new QVBoxLayout(result);
    m_resultStatus = new QLabel(result);
    m_resultHeaders = headerTable(result);
    m_resultBody = bodyEditor(result);
    resultLayout->addWidget(m_resultStatus);
    resultLayout->addWidget(m_resultHeaders);
    resultLayout->addWidget(m_resultBody, 1);
    m_tabs->addTab(result, tr("Result"));

    m_timelineView = new QTableView(this);
    m_timelineView->setModel(m_timeline);
    m_timelineView->verticalHeader()->hide();
    m_timelineView->verticalHeader()->setDefaultSectionSize(m_timelineView->fontMetrics().height() + 6);
    m_timelineView->setWordWrap(false);
    m_timelineView->horizontalHeader()->setStretchLastSection(true);
    m_timelineView->setSelectionBehavior(QAbstractItemView::SelectRows);
    m_tabs->addTab(m_timelineView, tr("Timeline"));

    m_history = new QPlainTextEdit(this);
    m_history->setReadOnly(true);
    m_tabs->addTab(m_history, tr("History && audit"));

    m_diff = new QPlainTextEdit(this);
    m_diff->setReadOnly(true);
    m_diff->setFont(QFont(u"monospace"_qs));
    m_diffTab = m_tabs->addTab(m_diff, tr("Payload diff (422)"));
    m_tabs->setTabVisible(m_diffTab, false);
    layout->addWidget(m_tabs, 1);

    connect(m_raw, &QCheckBox::toggled, this, &KeyDetailView::renderBodies);
    showNothing(tr("Select a key to see its stored request, result, history and timeline."));
}

void KeyDetailView::fillHeaders(QTableWidget *table, const HeaderList &headers)
{
    table->setRowCount(int(headers.size()));
    for (int i = 0; i < headers.size(); ++i) {
        table->setItem(i, 0, new QTableWidgetItem(QString::fromLatin1(headers[i].first)));
        table->setItem(i, 1, new QTableWidgetItem(QString::fromUtf8(headers[i].second)));
    }
    table->resizeColumnToContents(0);
}

void KeyDetailView::showNothing(const QString &message)
{
    m_key.clear();
    m_record = {};
    m_historyText.clear();
    m_events.clear();
    m_title->setText(richTextEscaped(message));
    m_summary->clear();
    m_tabs->setEnabled(false);
    m_requestHeaders->setRowCount(0);
    m_resultHeaders->setRowCount(0);
    m_requestBody->clear();
    m_resultBody->clear();
    m_history->clear();
    m_timeline->setEvents({});
    m_tabs->setTabVisible(m_diffTab, false);
}

void KeyDetailView::showActionResult(const QString &message, bool ok)
{
    m_banner->setText(escapeControls(message, true));
    m_banner->setStyleSheet(ok ? u"background:#e3f4e8;color:#1b5e20;padding:4px;border-radius:3px"_qs
                               : u"background:#fde7e7;color:#8a1c1c;padding:4px;border-radius:3px"_qs);
    m_banner->show();
}

void KeyDetailView::showKey(const KeyRecord &r, const QList<DeliveryEvent> &newestFirst)
{
    if (r.key != m_key)
        m_banner->hide();
    // Shown again every second: only what changed is drawn again.
    const bool tabsChanged = r.key != m_key || !sameTabs(r, m_record);
    m_key = r.key;
    m_record = r;
    m_tabs->setEnabled(true);
    const qint64 now = wallMs() + m_clockOffsetMs; // the store's clock decides the lease
    const QString failed = stateColour(KeyState::Failed).name(); // readable on light and dark
    const QHash<KeyState, QString> colours{{KeyState::Completed, stateColour(KeyState::Completed).name()},
                                           {KeyState::Failed, failed},
                                           {KeyState::Processing, stateColour(KeyState::Processing).name()},
                                           {KeyState::Reset, stateColour(KeyState::Reset).name()}};
    // Key, endpoint, provider and error are what a sender or a shared store wrote.
    m_title->setText(u"<b>%1</b> &nbsp; <span style='color:%2'><b>%3</b></span>"_qs.arg(
        richTextEscaped(r.key), colours.value(r.state), toString(r.state)));
    QString summary =
        tr("endpoint %1 (%2) · %3 · TTL %4 · token %5 · first seen %6 · last seen "
           "%7<br>fingerprint sha256:%8")
            .arg(richTextEscaped(r.endpoint), richTextEscaped(r.provider))
            .arg(countOf(r.attempts, u"delivery", u"deliveries"))
            .arg(formatDuration(r.expiresAtMs - now))
            .arg(r.token)
            .arg(QDateTime::fromMSecsSinceEpoch(r.createdMs).toString(u"yyyy-MM-dd hh:mm:ss"_qs),
                 QDateTime::fromMSecsSinceEpoch(r.updatedMs).toString(u"yyyy-MM-dd hh:mm:ss"_qs),
                 richTextEscaped(QString::fromLatin1(r.fingerprint)));
    if (r.state == KeyState::Processing)
        summary += r.leaseUntilMs > now ? tr("<br>lease: %1 left").arg(formatDuration(r.leaseUntilMs - now))
                                        : tr("<br><span style='color:%2'><b>stuck</b>: the lease ran out %1 ago</span>").arg(formatDuration(now - r.leaseUntilMs), failed);
    // A key reset or reprocessed keeps the error of its failed run: shown as the last one then.
    if (!r.error.isEmpty() && r.state == KeyState::Failed)
        summary += tr("<br><span style='color:%2'><b>error:</b> %1</span>")
                       .arg(richTextEscaped(r.error), failed);
    else if (!r.error.isEmpty())
        summary += tr("<br><b>last error</b> (before it was %2): %1")
                       .arg(richTextEscaped(r.error), toString(r.state));
    if (const QString lost = lostSharedContent(r); !lost.isEmpty())
        summary += tr("<br><span style='color:%2'><b>lost:</b> %1, kept as shared content "
                      "the store no longer has</span>")
                       .arg(lost, failed);
    m_summary->setText(summary);

    if (tabsChanged) {
        fillHeaders(m_requestHeaders, maskSecrets(r.request.headers));
        if (r.state == KeyState::Processing || r.result.status == 0) {
            m_resultStatus->setText(tr("No result stored yet (%1).").arg(toString(r.state)));
            m_resultHeaders->setRowCount(0);
        } else {
            m_resultStatus->setText(
                tr("<b>%1</b> stored; duplicates get exactly this.").arg(r.result.status));
            fillHeaders(m_resultHeaders, r.result.headers);
        }
    }

    QString history;
    for (const HistoryEntry &h : r.history)
        history +=
            u"%1  %2  (token %3)%4\n"_qs
                .arg(QDateTime::fromMSecsSinceEpoch(h.atMs).toString(u"yyyy-MM-dd hh:mm:ss.zzz"_qs),
                     escapeControls(h.event).leftJustified(12))
                .arg(h.token)
                .arg(h.detail.isEmpty() ? QString() : u"  "_qs + escapeControls(h.detail));
    if (history != m_historyText) {
        m_historyText = history;
        m_history->setPlainText(history);
    }

    if (tabsChanged || !sameEvents(newestFirst, m_events)) {
        m_events = newestFirst;
        m_timeline->setEvents(newestFirst);
        m_timelineView->resizeColumnsToContents();
    }
    QByteArray mismatch;
    for (const DeliveryEvent &e : newestFirst)
        if (e.outcome == Outcome::Mismatch && !e.payload.isEmpty()) {
            mismatch = e.payload;
            break;
        }
    if (tabsChanged || mismatch != m_mismatchPayload) {
        m_mismatchPayload = mismatch;
        m_tabs->setTabVisible(m_diffTab, !m_mismatchPayload.isEmpty());
        renderBodies();
    }
}

void KeyDetailView::renderBodies()
{
    const bool raw = m_raw->isChecked();
    m_requestBody->setPlainText(shownBody(prettyBody(m_record.request.body, raw)));
    m_resultBody->setPlainText(shownBody(prettyBody(m_record.result.body, raw)));
    if (!m_mismatchPayload.isEmpty()) {
        const QStringList diff = lineDiff(prettyBody(m_record.request.body, false).split(u'\n'),
                                          prettyBody(m_mismatchPayload, false).split(u'\n'));
        m_diff->setPlainText(
            shownBody(tr("- stored payload (processed)\n+ refused payload (same key, 422)\n\n") +
                      diff.join(u'\n')));
    }
}

QString KeyDetailView::historyText() const
{
    return m_history->toPlainText();
}

QString KeyDetailView::diffText() const
{
    return m_diff->toPlainText();
}

QString KeyDetailView::summaryText() const
{
    return m_summary->text();
}

} // namespace idem
