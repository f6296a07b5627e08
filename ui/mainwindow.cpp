#include "mainwindow.h"

#include "deliveriesmodel.h"
#include "engine/engine.h"
#include "engine/stats.h"
#include "keydetailview.h"
#include "keysmodel.h"
#include "receiver/receiver.h"
#include "settingsdialog.h"
#include "stormdialog.h"
#include "store/storeurl.h"
#include "trafficview.h"
#include "util/clock.h"
#include "util/format.h"
#include "processing/processor.h"

#include <QAction>
#include <QApplication>
#include <QClipboard>
#include <QComboBox>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QItemSelectionModel>
#include <QLabel>
#include <QLineEdit>
#include <QMessageBox>
#include <QSortFilterProxyModel>
#include <QSplitter>
#include <QStatusBar>
#include <QTabBar>
#include <QTabWidget>
#include <QTableView>
#include <QTimer>
#include <QToolBar>
#include <QVBoxLayout>

namespace idem {

namespace {
const std::array<std::optional<KeyState>, 5> kTabStates{std::nullopt, KeyState::Processing, KeyState::Failed,
                                                        KeyState::Completed, KeyState::Reset};

QString shellQuote(const QString &text)
{
    QString quoted = text;
    quoted.replace(u"'"_qs, u"'\\''"_qs);
    return u"'"_qs + quoted + u"'"_qs;
}
} // namespace

MainWindow::MainWindow(DeskSession session, QWidget *parent)
    : QMainWindow(parent), m_session(std::move(session)), m_keys(new KeysModel(m_session.pool, 200, this)),
      m_sorted(new QSortFilterProxyModel(this)), m_table(new QTableView(this)), m_detail(new KeyDetailView(this)),
      m_traffic(new TrafficView(m_session.pool, this)), m_stateTabs(new QTabBar(this)),
      m_endpointFilter(new QComboBox(this)), m_textFilter(new QLineEdit(this)), m_pages(new QTabWidget(this)),
      m_address(new QLabel(this)), m_storeLabel(new QLabel(this)), m_counts(new QLabel(this)), m_warnings(new QLabel(this)),
      m_refresh(new QTimer(this)), m_filterDelay(new QTimer(this))
{
    setWindowTitle(tr("Idempotency Desk"));
    if (!m_session.receiver) {
        m_localEngine = new IdempotencyEngine(m_session.config, m_session.pool, u"dashboard"_qs, this);
    }

    // Toolbar: the actions on the selected keys.
    QToolBar *tools = addToolBar(tr("Actions"));
    tools->setMovable(false);
    tools->setToolButtonStyle(Qt::ToolButtonTextOnly);
    m_resetAction = tools->addAction(tr("Reset"), this, [this] { operatorOn(selectedKeys(), OperatorAction::Reset, false, tr("reset")); });
    m_resetAction->setToolTip(tr("Make the selected failed keys processable again: the next delivery is processed (history kept)."));
    m_retryAction = tools->addAction(tr("Retry now"), this, &MainWindow::retrySelected);
    m_retryAction->setToolTip(tr("Run the stored request through the endpoint's processor now and show the result."));
    m_forceFailAction = tools->addAction(tr("Force-fail"), this, [this] {
        const QStringList keys = selectedKeys();
        if (!keys.isEmpty() && confirm(tr("Force-fail"), tr("Mark %1 as failed? A worker still processing it will not be able to record its result.").arg(keys.join(u", "_qs))))
            operatorOn(keys, OperatorAction::ForceFail, false, tr("force-failed"));
    });
    m_forceFailAction->setToolTip(tr("End a stuck processing key: it becomes failed (and is reprocessed on the next delivery)."));
    m_deleteAction = tools->addAction(tr("Delete"), this, [this] {
        const QStringList keys = selectedKeys();
        if (!keys.isEmpty() && confirm(tr("Delete keys"), tr("Delete %n key(s)? Their stored results are lost: the next delivery of these events is processed again.", nullptr, int(keys.size()))))
            operatorOn(keys, OperatorAction::Delete, false, tr("deleted"));
    });
    m_copyCurlAction = tools->addAction(tr("Copy as curl"), this, [this] {
        if (m_detail->currentKey().isEmpty())
            return;
        QApplication::clipboard()->setText(curlFor(m_detail->current()));
        finishAction(tr("Copied a curl command for %1 to the clipboard (secret headers masked).").arg(m_detail->currentKey()), true);
    });
    tools->addSeparator();
    m_resetAllFailedAction = tools->addAction(tr("Reset all failed…"), this, &MainWindow::resetAllFailed);
    tools->addSeparator();
    m_stormAction = tools->addAction(tr("Storm…"), this, &MainWindow::openStorm);
    m_stormAction->setEnabled(m_session.receiver != nullptr);
    m_settingsAction = tools->addAction(tr("Settings…"), this, &MainWindow::openSettings);

    // Keys page: filters, table, detail.
    auto *keysPage = new QWidget(this);
    auto *keysLayout = new QVBoxLayout(keysPage);
    m_address->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_address->setWordWrap(true);
    keysLayout->addWidget(m_address);
    auto *filters = new QHBoxLayout;
    for (const auto &state : kTabStates)
        m_stateTabs->addTab(state ? toString(*state) : tr("all"));
    m_endpointFilter->addItem(tr("All endpoints"), QString());
    for (const auto &e : m_session.config.endpoints)
        m_endpointFilter->addItem(e.name, e.name);
    m_textFilter->setPlaceholderText(tr("Filter keys: text, or a glob like orders:evt_*"));
    m_textFilter->setClearButtonEnabled(true);
    filters->addWidget(m_stateTabs);
    filters->addWidget(m_endpointFilter);
    filters->addWidget(m_textFilter, 1);
    keysLayout->addLayout(filters);

    m_sorted->setSourceModel(m_keys);
    m_sorted->setSortRole(KeysModel::RawValueRole);
    m_table->setModel(m_sorted);
    m_table->setSortingEnabled(true);
    m_table->sortByColumn(KeysModel::LastSeen, Qt::DescendingOrder);
    m_table->setSelectionBehavior(QAbstractItemView::SelectRows);
    m_table->setSelectionMode(QAbstractItemView::ExtendedSelection);
    m_table->setAlternatingRowColors(true);
    m_table->verticalHeader()->hide();
    m_table->setWordWrap(false);
    m_table->verticalHeader()->setDefaultSectionSize(m_table->fontMetrics().height() + 8);
    m_table->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
    m_table->horizontalHeader()->setSectionResizeMode(KeysModel::Key, QHeaderView::Stretch);
    auto *split = new QSplitter(Qt::Horizontal, this);
    split->addWidget(m_table);
    split->addWidget(m_detail);
    split->setStretchFactor(0, 3);
    split->setStretchFactor(1, 2);
    split->setSizes({760, 560});
    keysLayout->addWidget(split, 1);
    m_pages->addTab(keysPage, tr("Keys"));
    m_pages->addTab(m_traffic, tr("Traffic"));
    if (m_session.receiver) {
        m_deliveries = new DeliveriesModel(5000, this);
        auto *live = new QTableView(this);
        live->setModel(m_deliveries);
        live->verticalHeader()->hide();
        live->setAlternatingRowColors(true);
        live->horizontalHeader()->setSectionResizeMode(DeliveriesModel::Key, QHeaderView::Stretch);
        m_pages->addTab(live, tr("Live deliveries"));
        connect(m_session.receiver->engine(), &IdempotencyEngine::delivered, this,
                [this](const DeliveryEvent &event) { m_deliveries->append(event); });
    }
    setCentralWidget(m_pages);

    // Receiver address / attach mode.
    if (m_session.receiver) {
        const QString base = u"http://%1"_qs.arg(m_session.receiver->address().toString());
        QStringList endpoints;
        for (const auto &e : m_session.config.endpoints)
            endpoints << u"/hooks/%1"_qs.arg(e.name);
        m_address->setText(tr("<b>Receiving webhooks at</b> %1 &nbsp;(%2). Try: <code>curl -i -XPOST -H 'Idempotency-Key: k1' -d '{\"a\":1}' %1/hooks/generic</code>")
                               .arg(base, endpoints.join(u" "_qs)));
    } else {
        m_address->setText(tr("<b>Attached to %1</b> (no receiver here): the keys and traffic of "
                              "every instance writing to this store.")
                               .arg(StoreUrl::parse(m_session.storeUrl).ok()
                                        ? StoreUrl::parse(m_session.storeUrl)->display()
                                        : displayUrl(m_session.storeUrl)));
    }

    statusBar()->addWidget(m_counts, 1);
    statusBar()->addPermanentWidget(m_warnings);
    statusBar()->addPermanentWidget(m_storeLabel);

    connect(m_stateTabs, &QTabBar::currentChanged, this, &MainWindow::applyFilter);
    connect(m_endpointFilter, &QComboBox::currentIndexChanged, this, &MainWindow::applyFilter);
    m_filterDelay->setSingleShot(true);
    m_filterDelay->setInterval(250);
    connect(m_textFilter, &QLineEdit::textChanged, m_filterDelay, qOverload<>(&QTimer::start));
    connect(m_filterDelay, &QTimer::timeout, this, &MainWindow::applyFilter);
    connect(m_table->selectionModel(), &QItemSelectionModel::selectionChanged, this, [this] {
        updateActions();
        loadDetail();
    });
    connect(m_keys, &KeysModel::countsChanged, this, &MainWindow::updateStatus);
    connect(m_keys, &KeysModel::storeError, this, [this](const QString &message) {
        m_storeLabel->setText(tr("<span style='color:#b02020'>store unavailable: %1</span>").arg(message.toHtmlEscaped()));
    });
    connect(m_keys, &QAbstractItemModel::modelReset, this, [this] { updateActions(); });
    connect(this, &MainWindow::actionFinished, m_detail, &KeyDetailView::showActionResult);

    m_refresh->setInterval(1000);
    connect(m_refresh, &QTimer::timeout, this, &MainWindow::refreshAll);
    m_refresh->start();

    showWarnings(configWarnings(m_session.config));
    // What may lose acknowledged records on this store (Redis eviction, no persistence): asked
    // off the GUI thread, added when the store answers.
    m_session.pool->submit<QStringList>(
        this, [](IdempotencyStore &store) { return store.durabilityWarnings(); },
        [this](Result<QStringList> durability) {
            if (durability && !durability->isEmpty())
                showWarnings(configWarnings(m_session.config) + *durability);
        });
    applyFilter();
    updateStatus();
    updateActions();
    resize(1280, 760);
}

MainWindow::~MainWindow() = default;

void MainWindow::showWarnings(const QStringList &warnings)
{
    m_warnings->setText(warnings.isEmpty() ? QString() : tr("<span style='color:#b06a00'>⚠ %n warning(s)</span>", nullptr, int(warnings.size())));
    m_warnings->setToolTip(warnings.join(u'\n'));
}

void MainWindow::applyFilter()
{
    const int tab = std::max(0, m_stateTabs->currentIndex());
    m_keys->setFilter(kTabStates[size_t(tab)], m_endpointFilter->currentData().toString(), m_textFilter->text());
}

QStringList MainWindow::selectedKeys() const
{
    QStringList keys;
    for (const QModelIndex &index : m_table->selectionModel()->selectedRows())
        keys << m_sorted->mapToSource(index).data(KeysModel::KeyRole).toString();
    return keys;
}

void MainWindow::selectKey(const QString &key)
{
    const int row = m_keys->rowOfKey(key);
    if (row < 0)
        return;
    const QModelIndex index = m_sorted->mapFromSource(m_keys->index(row, 0));
    m_table->selectionModel()->select(index, QItemSelectionModel::ClearAndSelect | QItemSelectionModel::Rows);
    m_table->selectionModel()->setCurrentIndex(index, QItemSelectionModel::NoUpdate);
    m_table->scrollTo(index);
}

void MainWindow::updateActions()
{
    const QStringList keys = selectedKeys();
    const bool one = keys.size() == 1;
    m_resetAction->setEnabled(!keys.isEmpty());
    m_deleteAction->setEnabled(!keys.isEmpty());
    m_forceFailAction->setEnabled(!keys.isEmpty());
    m_retryAction->setEnabled(one);
    m_copyCurlAction->setEnabled(one);
}

void MainWindow::loadDetail()
{
    const QStringList keys = selectedKeys();
    if (keys.size() != 1) {
        if (keys.isEmpty())
            m_detail->showNothing(tr("Select a key to see its stored request, result, history and timeline."));
        return;
    }
    const QString key = keys.first();
    const quint64 generation = ++m_detailGeneration;
    m_detailLoading = true;
    struct Detail
    {
        std::optional<KeyRecord> record;
        QList<DeliveryEvent> events;
    };
    m_session.pool->submit<Detail>(
        this,
        [key](IdempotencyStore &store) -> Result<Detail> {
            auto record = store.key(key);
            if (!record)
                return record.error();
            DeliveryQuery q;
            q.key = key;
            q.limit = 500;
            auto events = store.deliveries(q);
            if (!events)
                return events.error();
            return Detail{*record, *events};
        },
        [this, key, generation](Result<Detail> detail) {
            if (generation != m_detailGeneration)
                return;
            m_detailLoading = false;
            if (!detail) {
                m_detail->showNothing(tr("Cannot read %1: %2").arg(key, detail.error().message));
                return;
            }
            if (!detail->record) {
                m_detail->showNothing(tr("%1 is gone (deleted or expired).").arg(key));
                return;
            }
            m_detail->setClockOffsetMs(m_keys->clockOffsetMs());
            m_detail->showKey(*detail->record, detail->events);
            Q_EMIT detailLoaded(key);
        });
}

void MainWindow::refreshAll()
{
    m_keys->refresh();
    if (!m_detailLoading && !m_detail->currentKey().isEmpty() && selectedKeys().size() == 1)
        loadDetail();
    updateStatus();
}

void MainWindow::updateStatus()
{
    const StateCounts c = m_keys->counts();
    const QStringList labels{tr("all (%1)").arg(c.total()), tr("processing (%1)").arg(c.processing), tr("failed (%1)").arg(c.failed),
                             tr("completed (%1)").arg(c.completed), tr("reset (%1)").arg(c.reset)};
    for (int i = 0; i < labels.size() && i < m_stateTabs->count(); ++i)
        m_stateTabs->setTabText(i, labels[i]);
    QString text = m_session.receiver ? tr("Receiver %1").arg(m_session.receiver->address().toString()) : tr("Attach mode (no receiver)");
    text += tr(" · keys: %1 processing · %2 completed · %3 failed").arg(c.processing).arg(c.completed).arg(c.failed);
    if (m_session.receiver) {
        const EngineCounters counters = m_session.receiver->engine()->counters();
        qint64 deliveries = 0;
        for (qint64 n : counters.byOutcome)
            deliveries += n;
        text += tr(" · %1 deliveries, %2 reached the processor").arg(deliveries).arg(counters.processorRuns);
    }
    m_counts->setText(text);
    const StoreHealth health = m_session.pool->health();
    const QString store = StoreUrl::parse(m_session.storeUrl).ok()
                              ? StoreUrl::parse(m_session.storeUrl)->display()
                              : displayUrl(m_session.storeUrl);
    m_storeLabel->setText(health.healthy ? tr("Store %1 <span style='color:#1b7f3b'>● healthy</span>").arg(store.toHtmlEscaped())
                                         : tr("Store %1 <span style='color:#b02020'>● unavailable</span>").arg(store.toHtmlEscaped()));
    m_storeLabel->setToolTip(health.healthy ? QString() : health.lastError);
}

QString MainWindow::statusText() const
{
    return m_counts->text() + u" | "_qs + m_storeLabel->text() + u" | "_qs + m_warnings->toolTip();
}

bool MainWindow::confirm(const QString &title, const QString &text)
{
    return QMessageBox::question(this, title, text, QMessageBox::Yes | QMessageBox::Cancel, QMessageBox::Cancel)
           == QMessageBox::Yes;
}

void MainWindow::finishAction(const QString &message, bool ok)
{
    Q_EMIT actionFinished(message, ok);
    statusBar()->showMessage(message, 8000);
    refreshAll();
}

void MainWindow::operatorOn(const QStringList &keys, OperatorAction action, bool force, const QString &verb)
{
    if (keys.isEmpty())
        return;
    m_session.pool->submit<QStringList>(
        this,
        [keys, action, force](IdempotencyStore &store) -> Result<QStringList> {
            QStringList results;
            for (const QString &key : keys) {
                auto verdict = store.applyOperator(key, action, force, u"operator (dashboard)"_qs);
                if (!verdict)
                    return verdict.error();
                results << (*verdict == OperatorVerdict::Accept ? QString() : *verdict == OperatorVerdict::Missing ? u"missing"_qs : u"wrong state"_qs);
            }
            return results;
        },
        [this, keys, verb](Result<QStringList> results) {
            if (!results)
                return finishAction(tr("Not done: %1").arg(results.error().message), false);
            QStringList done, refused;
            for (qsizetype i = 0; i < keys.size(); ++i)
                (results->at(i).isEmpty() ? done : refused) << (results->at(i).isEmpty() ? keys[i] : u"%1 (%2)"_qs.arg(keys[i], results->at(i)));
            QString message = done.isEmpty() ? QString() : tr("%1 %2.").arg(verb, done.join(u", "_qs));
            if (!refused.isEmpty())
                message += tr(" Refused: %1 — reset takes failed keys, force-fail takes processing keys.").arg(refused.join(u", "_qs));
            finishAction(message.trimmed(), refused.isEmpty());
        });
}

void MainWindow::runRetry(const QString &key, bool force, std::function<void(Result<RetryOutcome>)> done)
{
    QPointer<MainWindow> self(this);
    auto deliver = [self, done](Result<RetryOutcome> outcome) {
        // From the engine's thread back to the GUI thread.
        QMetaObject::invokeMethod(self.data(), [self, done, outcome] {
            if (self)
                done(outcome);
        }, Qt::QueuedConnection);
    };
    IdempotencyEngine *engine = m_session.receiver ? m_session.receiver->engine() : m_localEngine;
    QMetaObject::invokeMethod(engine, [engine, key, force, deliver] { engine->retryKey(key, force, deliver); }, Qt::QueuedConnection);
}

void MainWindow::retrySelected()
{
    const QStringList keys = selectedKeys();
    if (keys.size() != 1)
        return;
    const QString key = keys.first();
    const KeyRecord *record = m_keys->record(m_keys->rowOfKey(key));
    bool force = false;
    if (record && (record->state == KeyState::Completed || record->state == KeyState::Processing)) {
        if (!confirm(tr("Retry now"), tr("%1 is %2. Run its stored request through the processor again anyway?").arg(key, toString(record->state))))
            return;
        force = true;
    }
    m_retryAction->setEnabled(false);
    finishAction(tr("Retrying %1…").arg(key), true);
    runRetry(key, force, [this, key](Result<RetryOutcome> outcome) {
        m_retryAction->setEnabled(true);
        if (!outcome)
            return finishAction(tr("Retry of %1 not done: %2").arg(key, outcome.error().message), false);
        if (outcome->completed)
            return finishAction(tr("Retried %1: the processor answered %2; completed and stored.").arg(key).arg(outcome->response.status), true);
        finishAction(tr("Retried %1: failed again (%2): %3").arg(key).arg(outcome->response.status).arg(outcome->error), false);
    });
}

void MainWindow::resetAllFailed()
{
    const QString endpoint = m_endpointFilter->currentData().toString();
    const QString scope = endpoint.isEmpty() ? tr("of every endpoint") : tr("of %1").arg(endpoint);
    if (!confirm(tr("Reset all failed"), tr("Reset every failed key %1? The next delivery of each is processed again.").arg(scope)))
        return;
    m_session.pool->submit<qint64>(
        this,
        [endpoint](IdempotencyStore &store) {
            return resetFailedKeys(store, endpoint, u"operator (dashboard): reset all failed"_qs);
        },
        [this, scope](Result<qint64> reset) {
            if (!reset)
                return finishAction(tr("Reset not done: %1").arg(reset.error().message), false);
            finishAction(tr("Reset %1 failed key(s) %2.").arg(*reset).arg(scope), true);
        });
}

void MainWindow::openStorm()
{
    if (!m_session.receiver)
        return;
    auto *dialog = new StormDialog(m_session.config, u"http://"_qs + m_session.receiver->address().toString(), this);
    dialog->setAttribute(Qt::WA_DeleteOnClose);
    connect(dialog, &StormDialog::finished, this, &MainWindow::refreshAll);
    dialog->show();
}

void MainWindow::openSettings()
{
    auto *dialog = new SettingsDialog(m_session.config, m_session.storeUrl, m_session.configPath, this);
    dialog->setAttribute(Qt::WA_DeleteOnClose);
    dialog->show();
}

QString MainWindow::curlFor(const KeyRecord &r) const
{
    const QString base = m_session.receiver ? u"http://"_qs + m_session.receiver->address().toString()
                                            : u"http://"_qs + m_session.config.listen.toString();
    // --globoff: a stored path's [ ] { } are not curl's URL patterns.
    QString curl = u"curl -i --globoff -X %1 %2"_qs.arg(
        QString::fromLatin1(r.request.method.isEmpty() ? QByteArray("POST") : r.request.method),
        shellQuote(base + QString::fromUtf8(r.request.path)));
    for (const auto &[name, value] : maskSecrets(r.request.headers)) {
        if (isHopByHopHeader(name))
            continue;
        curl += u" \\\n  -H "_qs + shellQuote(QString::fromLatin1(name) + u": "_qs + QString::fromUtf8(value));
    }
    // --data-raw, not --data-binary: a body that begins with @ is sent as it is, never read
    // as the name of one of the operator's files.
    curl += u" \\\n  --data-raw "_qs + shellQuote(QString::fromUtf8(r.request.body));
    return curl;
}

} // namespace idem
