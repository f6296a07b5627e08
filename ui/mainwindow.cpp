#include "mainwindow.h"

#include "colours.h"
#include "curlcommand.h"
#include "deliveriesmodel.h"
#include "engine/engine.h"
#include "engine/stats.h"
#include "keydetailview.h"
#include "keysmodel.h"
#include "processing/processor.h"
#include "providers/provider.h"
#include "receiver/receiver.h"
#include "richtext.h"
#include "senddialog.h"
#include "settingsdialog.h"
#include "store/storeurl.h"
#include "store/transfer.h"
#include "stormdialog.h"
#include "trafficview.h"
#include "traymonitor.h"
#include "util/clock.h"
#include "util/format.h"
#include "util/privatefile.h"
#include "util/version.h"

#include <QAction>
#include <QApplication>
#include <QClipboard>
#include <QComboBox>
#include <QFileDialog>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QHostAddress>
#include <QItemSelectionModel>
#include <QLabel>
#include <QLineEdit>
#include <QMenu>
#include <QMenuBar>
#include <QMessageBox>
#include <QProgressDialog>
#include <QPushButton>
#include <QSettings>
#include <QSignalBlocker>
#include <QSortFilterProxyModel>
#include <QSplitter>
#include <QStatusBar>
#include <QStyle>
#include <QSystemTrayIcon>
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

// A theme icon where the desktop has one, else the style's own.
QIcon themed(const QWidget *widget, const char *name, QStyle::StandardPixmap fallback)
{
    return QIcon::fromTheme(QString::fromLatin1(name), widget->style()->standardIcon(fallback));
}
} // namespace

QString tryHint(const Config &config, const QString &base)
{
    // A curl that works as it is needs an endpoint that verifies no signature; the provider's
    // own sample delivery puts the key where that endpoint reads it. Generic ones first.
    const EndpointConfig *unsigned_ = nullptr;
    for (const auto &e : config.endpoints) {
        const bool signs = !e.secrets.isEmpty() || !e.publicKeys.isEmpty();
        if (!signs &&
            (!unsigned_ || (e.provider == u"generic"_qs && unsigned_->provider != u"generic"_qs)))
            unsigned_ = &e;
    }
    if (!unsigned_) {
        return QObject::tr("Every endpoint verifies signatures: send a signed test event with "
                           "<b>File → Send test event…</b> (Ctrl+T) or <code>idemdesk send "
                           "--endpoint NAME</code>.");
    }
    const Provider *provider = providerFor(unsigned_->provider);
    if (!provider)
        return {};
    const OutgoingDelivery d = provider->makeDelivery(*unsigned_, u"k1"_qs, wallMs() / 1000);
    QString curl = u"curl -i -XPOST"_qs;
    for (const auto &[name, value] : d.headers)
        if (name.compare("Content-Type", Qt::CaseInsensitive) != 0)
            curl += u" -H "_qs + shellQuote(QString::fromLatin1(name + ": " + value));
    curl += u" -d "_qs + shellQuote(QString::fromUtf8(d.body)) + u" "_qs +
            shellQuote(base + u"/hooks/"_qs + unsigned_->name);
    return QObject::tr("Try: <code>%1</code>").arg(curl.toHtmlEscaped());
}

MainWindow::MainWindow(DeskSession session, QWidget *parent)
    : QMainWindow(parent), m_session(std::move(session)),
      m_keys(new KeysModel(m_session.pool, 200, this)), m_sorted(new QSortFilterProxyModel(this)),
      m_table(new QTableView(this)), m_detail(new KeyDetailView(this)),
      m_traffic(new TrafficView(m_session.pool, this)), m_stateTabs(new QTabBar(this)),
      m_endpointFilter(new QComboBox(this)), m_textFilter(new QLineEdit(this)),
      m_typeFilter(new QLineEdit(this)), m_searchFilter(new QLineEdit(this)),
      m_findStatus(new QLabel(this)), m_pages(new QTabWidget(this)), m_address(new QLabel(this)),
      m_storeLabel(new QLabel(this)), m_counts(new QLabel(this)), m_warnings(new QLabel(this)),
      m_refresh(new QTimer(this)), m_filterDelay(new QTimer(this))
{
    setWindowTitle(tr("Idempotency Desk"));
    setWindowIcon(applicationIcon());
    if (!m_session.receiver) {
        m_localEngine = new IdempotencyEngine(m_session.config, m_session.pool, u"dashboard"_qs, this);
    }

    buildActions();

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
    // Type and body search: read through the store's find, a page at a time on a store worker.
    auto *finds = new QHBoxLayout;
    m_typeFilter->setPlaceholderText(tr("Event type (exact)"));
    m_typeFilter->setClearButtonEnabled(true);
    m_typeFilter->setMaxLength(kMaxEventTypeChars);
    m_searchFilter->setPlaceholderText(tr("Search request bodies, e.g. acme"));
    m_searchFilter->setClearButtonEnabled(true);
    m_searchFilter->setMaxLength(kMaxSearchBytes / 4); // UTF-8: up to 4 bytes a character
    m_findStatus->setTextFormat(Qt::PlainText);
    finds->addWidget(m_typeFilter, 1);
    finds->addWidget(m_searchFilter, 2);
    finds->addWidget(m_findStatus, 2);
    keysLayout->addLayout(finds);

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
    // Keys share long prefixes (`gh:hook-4242/…`): the distinguishing tail stays visible.
    m_table->setTextElideMode(Qt::ElideMiddle);
    m_table->verticalHeader()->setDefaultSectionSize(m_table->fontMetrics().height() + 8);
    m_table->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
    m_table->horizontalHeader()->setSectionResizeMode(KeysModel::Key, QHeaderView::Interactive);
    m_table->horizontalHeader()->setStretchLastSection(true);
    m_table->setContextMenuPolicy(Qt::ActionsContextMenu);
    m_table->addActions({m_copyKeyAction, m_copyCurlAction, m_resetAction, m_retryAction,
                         m_forceFailAction, m_deleteAction});
    auto *split = m_split = new QSplitter(Qt::Horizontal, this);
    split->addWidget(m_table);
    split->addWidget(m_detail);
    split->setStretchFactor(0, 3);
    split->setStretchFactor(1, 2);
    split->setSizes({760, 560});
    keysLayout->addWidget(split, 1);
    m_pages->addTab(keysPage, tr("Keys"));
    m_pages->addTab(m_traffic, tr("Traffic"));
    if (m_session.receiver)
        buildLivePage();
    setCentralWidget(m_pages);
    buildTray();
    addPageActions();

    // Receiver address / attach mode.
    if (m_session.receiver) {
        const QString base = u"http://%1"_qs.arg(m_session.receiver->address().toString());
        QStringList endpoints;
        for (const auto &e : m_session.config.endpoints)
            endpoints << u"/hooks/%1"_qs.arg(e.name);
        m_address->setText(
            tr("<b>Receiving webhooks at</b> %1 &nbsp;(%2). %3")
                .arg(base, endpoints.join(u" "_qs), tryHint(m_session.config, base)));
    } else {
        m_address->setText(tr("<b>Attached to %1</b> (no receiver here): the keys and traffic of "
                              "every instance writing to this store.")
                               .arg(StoreUrl::parse(m_session.storeUrl).ok()
                                        ? StoreUrl::parse(m_session.storeUrl)->display()
                                        : displayUrl(m_session.storeUrl)));
    }

    statusBar()->addWidget(m_counts, 1);
    statusBar()->addPermanentWidget(m_warnings);
    m_storeLabel->setObjectName(u"storeHealth"_qs);
    statusBar()->addPermanentWidget(m_storeLabel);

    connect(m_stateTabs, &QTabBar::currentChanged, this, &MainWindow::applyFilter);
    connect(m_endpointFilter, &QComboBox::currentIndexChanged, this, &MainWindow::applyFilter);
    m_filterDelay->setSingleShot(true);
    m_filterDelay->setInterval(250);
    connect(m_textFilter, &QLineEdit::textChanged, m_filterDelay, qOverload<>(&QTimer::start));
    connect(m_typeFilter, &QLineEdit::textChanged, m_filterDelay, qOverload<>(&QTimer::start));
    connect(m_searchFilter, &QLineEdit::textChanged, m_filterDelay, qOverload<>(&QTimer::start));
    connect(m_keys, &KeysModel::findProgress, this, &MainWindow::updateFindStatus);
    connect(m_keys, &KeysModel::loaded, this, &MainWindow::updateFindStatus);
    connect(m_keys, &QAbstractItemModel::rowsRemoved, this, &MainWindow::updateFindStatus);
    connect(m_filterDelay, &QTimer::timeout, this, &MainWindow::applyFilter);
    connect(m_table->selectionModel(), &QItemSelectionModel::selectionChanged, this, [this] {
        if (m_selectedBeforeMove)
            return; // a refresh moved rows, the selection followed its keys (or lost one)
        m_keptSelection.clear(); // the user chose (a model reset clears it without a signal)
        updateActions();
        loadDetail();
    });
    connect(m_keys, &KeysModel::countsChanged, this, &MainWindow::updateStatus);
    // A refused read is said at once, as the last 10 s of calls tell it (one refused page among
    // good ones is "degraded", its error in the tooltip; it said "store unavailable" until the
    // next refresh).
    connect(m_keys, &KeysModel::storeError, this, &MainWindow::updateStatus);
    connect(m_keys, &QAbstractItemModel::modelReset, this, [this] { updateActions(); });
    keepSelectionAcrossReset();
    connect(m_keys, &KeysModel::loaded, this, &MainWindow::fitKeyColumn);
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
    restoreLayout();
}

MainWindow::~MainWindow()
{
    m_closing->store(true);
    // Remembered for the next start: where the window was and how the panes were split.
    QSettings settings;
    settings.setValue(u"window/geometry"_qs, saveGeometry());
    settings.setValue(u"window/state"_qs, saveState());
    settings.setValue(u"window/split"_qs, m_split->saveState());
}

void MainWindow::buildActions()
{
    auto action = [this](const QString &text, QIcon icon, QKeySequence shortcut, auto slot) {
        auto *a = new QAction(icon, text, this);
        if (!shortcut.isEmpty())
            a->setShortcut(shortcut);
        connect(a, &QAction::triggered, this, slot);
        return a;
    };
    m_resetAction = action(tr("Reset"), themed(this, "edit-undo", QStyle::SP_BrowserReload),
                           QKeySequence(Qt::CTRL | Qt::Key_R), [this] {
                               operatorOn(actionKeys(), OperatorAction::Reset, false, tr("reset"));
                           });
    m_resetAction->setToolTip(tr("Make the selected failed keys processable again: the next "
                                 "delivery is processed (history kept)."));
    m_retryAction =
        action(tr("Retry now"), themed(this, "media-playback-start", QStyle::SP_MediaPlay),
               QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_R), &MainWindow::retrySelected);
    m_retryAction->setToolTip(
        tr("Run the stored request through the endpoint's processor now and show the result."));
    m_forceFailAction =
        action(tr("Force-fail"), themed(this, "process-stop", QStyle::SP_BrowserStop), {}, [this] {
            const QStringList keys = actionKeys();
            if (!keys.isEmpty() &&
                confirm(tr("Force-fail"), tr("Mark %1 as failed? A worker still processing it will "
                                             "not be able to record its result.")
                                              .arg(keys.join(u", "_qs))))
                operatorOn(keys, OperatorAction::ForceFail, false, tr("force-failed"));
        });
    m_forceFailAction->setToolTip(tr("End a stuck processing key: it becomes failed (and is "
                                     "reprocessed on the next delivery)."));
    m_deleteAction = action(
        tr("Delete"), themed(this, "edit-delete", QStyle::SP_TrashIcon), QKeySequence::Delete,
        [this] {
            const QStringList keys = actionKeys();
            if (!keys.isEmpty() &&
                confirm(tr("Delete keys"), tr("Delete %1? Their stored results are lost: the next "
                                              "delivery of these events is processed again.")
                                               .arg(countOf(keys.size(), u"key", u"keys"))))
                operatorOn(keys, OperatorAction::Delete, false, tr("deleted"));
        });
    m_copyKeyAction = action(
        tr("Copy key"), themed(this, "edit-copy", QStyle::SP_FileIcon), QKeySequence::Copy, [this] {
            const QStringList keys = actionKeys();
            if (keys.isEmpty())
                return;
            QApplication::clipboard()->setText(keys.join(u'\n'));
            statusBar()->showMessage(tr("Copied %1.").arg(countOf(keys.size(), u"key", u"keys")),
                                     4000);
        });
    m_copyCurlAction =
        action(tr("Copy as curl"), themed(this, "edit-paste", QStyle::SP_FileLinkIcon),
               QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_C), [this] {
                   if (m_detail->currentKey().isEmpty())
                       return;
                   const auto curl = curlFor(m_detail->current());
                   if (!curl)
                       return finishAction(tr("Not copied: %1.").arg(curl.error().message), false);
                   QApplication::clipboard()->setText(curl->text);
                   QString message =
                       tr("Copied a curl command for %1 to the clipboard (secret headers masked).")
                           .arg(m_detail->currentKey());
                   if (curl->headersLeftOut)
                       message +=
                           tr(" %1 out: curl cannot send them as stored.")
                               .arg(countOf(curl->headersLeftOut, u"header left", u"headers left"));
                   finishAction(message, true);
               });
    m_resetAllFailedAction =
        action(tr("Reset all failed…"), themed(this, "view-refresh", QStyle::SP_DialogResetButton),
               {}, &MainWindow::resetAllFailed);
    m_exportAction =
        action(tr("Export…"), themed(this, "document-save-as", QStyle::SP_DialogSaveButton),
               QKeySequence(Qt::CTRL | Qt::Key_E), &MainWindow::exportKeys);
    m_exportAction->setToolTip(tr("Write the selected keys (or, with none selected, every key of "
                                  "the filter) as JSON Lines."));
    m_importAction =
        action(tr("Import…"), themed(this, "document-open", QStyle::SP_DialogOpenButton),
               QKeySequence(Qt::CTRL | Qt::Key_I), &MainWindow::importKeys);
    m_importAction->setToolTip(
        tr("Read keys exported by another desk into this store (existing keys are left alone)."));
    m_sendAction =
        action(tr("Send test event…"), themed(this, "mail-send", QStyle::SP_ArrowForward),
               QKeySequence(Qt::CTRL | Qt::Key_T), &MainWindow::openSend);
    m_sendAction->setEnabled(m_session.receiver != nullptr);
    m_stormAction = action(tr("Storm…"), themed(this, "weather-storm", QStyle::SP_MediaSeekForward),
                           {}, &MainWindow::openStorm);
    m_stormAction->setEnabled(m_session.receiver != nullptr);
    m_settingsAction = action(tr("Settings…"),
                              themed(this, "preferences-system", QStyle::SP_FileDialogDetailedView),
                              QKeySequence::Preferences, &MainWindow::openSettings);
    m_findAction = action(tr("Find"), themed(this, "edit-find", QStyle::SP_FileDialogContentsView),
                          QKeySequence::Find, [this] {
                              m_pages->setCurrentIndex(0);
                              m_textFilter->setFocus(Qt::ShortcutFocusReason);
                              m_textFilter->selectAll();
                          });
    m_refreshAction = action(tr("Refresh"), themed(this, "view-refresh", QStyle::SP_BrowserReload),
                             QKeySequence::Refresh, &MainWindow::refreshAll);
    m_aboutAction = action(tr("About Idempotency Desk"),
                           themed(this, "help-about", QStyle::SP_MessageBoxInformation), {},
                           &MainWindow::showAbout);
    auto *quit = action(tr("Quit"), themed(this, "application-exit", QStyle::SP_DialogCloseButton),
                        QKeySequence::Quit, &QWidget::close);
    quit->setMenuRole(QAction::QuitRole);

    QMenu *file = menuBar()->addMenu(tr("&File"));
    file->addActions({m_sendAction, m_stormAction});
    file->addSeparator();
    file->addAction(m_settingsAction);
    file->addSeparator();
    file->addAction(quit);
    QMenu *edit = menuBar()->addMenu(tr("&Edit"));
    edit->addActions({m_copyKeyAction, m_copyCurlAction});
    edit->addSeparator();
    edit->addAction(m_findAction);
    QMenu *keys = menuBar()->addMenu(tr("&Keys"));
    keys->addActions({m_resetAction, m_retryAction, m_forceFailAction, m_deleteAction});
    keys->addSeparator();
    keys->addAction(m_resetAllFailedAction);
    keys->addSeparator();
    keys->addActions({m_exportAction, m_importAction});
    m_viewMenu = menuBar()->addMenu(tr("&View"));
    QMenu *help = menuBar()->addMenu(tr("&Help"));
    help->addAction(m_aboutAction);

    QToolBar *tools = addToolBar(tr("Actions"));
    tools->setObjectName(u"actions"_qs); // saveState() needs it
    tools->setMovable(false);
    tools->setToolButtonStyle(Qt::ToolButtonTextBesideIcon);
    tools->addActions(
        {m_resetAction, m_retryAction, m_forceFailAction, m_deleteAction, m_copyCurlAction});
    tools->addSeparator();
    tools->addAction(m_resetAllFailedAction);
    tools->addSeparator();
    tools->addActions({m_sendAction, m_stormAction, m_settingsAction});
}

void MainWindow::buildLivePage()
{
    // Live deliveries: filtered by outcome and endpoint, paused and resumed; a double-click
    // opens the key on the Keys page. A flood of rejections is folded (DeliveriesModel).
    m_deliveries = new DeliveriesModel(5000, this);
    m_liveFilter = new DeliveriesFilter(this);
    m_liveFilter->setSourceModel(m_deliveries);
    auto *page = new QWidget(this);
    auto *layout = new QVBoxLayout(page);
    auto *bar = new QHBoxLayout;
    m_liveOutcome = new QComboBox(page);
    m_liveOutcome->addItem(tr("All outcomes"), -1);
    m_liveOutcome->addItem(tr("Failures (5xx)"), -2);
    for (int o = int(Outcome::Processed); o <= int(Outcome::Unavailable); ++o)
        m_liveOutcome->addItem(toString(Outcome(o)), o);
    m_liveEndpoint = new QComboBox(page);
    m_liveEndpoint->addItem(tr("All endpoints"), QString());
    for (const auto &e : m_session.config.endpoints)
        m_liveEndpoint->addItem(e.name, e.name);
    m_livePause = new QPushButton(themed(this, "media-playback-pause", QStyle::SP_MediaPause),
                                  tr("Pause"), page);
    m_livePause->setCheckable(true);
    m_livePause->setShortcut(QKeySequence(Qt::CTRL | Qt::Key_P));
    auto *held = new QLabel(page);
    bar->addWidget(m_liveOutcome);
    bar->addWidget(m_liveEndpoint);
    bar->addWidget(m_livePause);
    bar->addWidget(held, 1);
    layout->addLayout(bar);
    m_live = new QTableView(page);
    m_live->setModel(m_liveFilter);
    m_live->verticalHeader()->hide();
    m_live->setAlternatingRowColors(true);
    m_live->setSelectionBehavior(QAbstractItemView::SelectRows);
    m_live->setTextElideMode(Qt::ElideMiddle);
    m_live->horizontalHeader()->setSectionResizeMode(DeliveriesModel::Key, QHeaderView::Stretch);
    m_live->setToolTip(tr("Double-click a delivery to open its key."));
    layout->addWidget(m_live, 1);
    m_pages->addTab(page, tr("Live deliveries"));

    connect(m_liveOutcome, &QComboBox::currentIndexChanged, this, [this] {
        const int o = m_liveOutcome->currentData().toInt();
        m_liveFilter->setOutcome(o < 0 ? std::nullopt : std::optional<Outcome>(Outcome(o)));
        m_liveFilter->setFailuresOnly(o == -2);
    });
    connect(m_liveEndpoint, &QComboBox::currentIndexChanged, this,
            [this] { m_liveFilter->setEndpoint(m_liveEndpoint->currentData().toString()); });
    connect(m_livePause, &QPushButton::toggled, this, [this, held](bool paused) {
        m_livePause->setText(paused ? tr("Resume") : tr("Pause"));
        m_livePause->setIcon(paused ? themed(this, "media-playback-start", QStyle::SP_MediaPlay)
                                    : themed(this, "media-playback-pause", QStyle::SP_MediaPause));
        m_deliveries->setPaused(paused);
        held->clear();
    });
    connect(m_session.receiver->engine(), &IdempotencyEngine::delivered, this,
            [this, held](const DeliveryEvent &event) {
                m_deliveries->append(event);
                if (m_deliveries->isPaused())
                    held->setText(
                        tr("Paused: %1 waiting")
                            .arg(countOf(m_deliveries->heldCount(), u"delivery", u"deliveries")));
            });
    // A folded row (rejections past the list's budget) has no key: the rejected deliveries it
    // counts stored nothing, so a double-click there does nothing.
    connect(m_live, &QTableView::doubleClicked, this, [this](const QModelIndex &index) {
        openKey(m_deliveries->at(m_liveFilter->mapToSource(index).row()).key);
    });
}

void MainWindow::openKey(const QString &key)
{
    if (key.isEmpty())
        return; // rejected before a key was known
    m_pages->setCurrentIndex(0);
    m_keptSelection = {key}; // selected as soon as it is loaded
    m_keptCurrent = key;
    if (m_keys->rowOfKey(key) >= 0)
        return selectKey(key);
    // Not loaded here: show just that key.
    QSignalBlocker quietTabs(m_stateTabs), quietEndpoints(m_endpointFilter),
        quietText(m_textFilter), quietType(m_typeFilter), quietSearch(m_searchFilter);
    m_stateTabs->setCurrentIndex(0);
    m_endpointFilter->setCurrentIndex(0);
    m_textFilter->setText(key);
    m_typeFilter->clear();
    m_searchFilter->clear();
    applyFilter();
}

void MainWindow::buildTray()
{
    // A monitor that stays minimized: failed and stuck counts in the tray's tooltip, a
    // notification when a key fails or a lease runs out (rate limited; View → Desktop
    // notifications turns it off).
    m_tray = new TrayMonitor(30'000, {}, this);
    m_tray->setEnabled(QSettings().value(u"notifications"_qs, true).toBool());
    m_notifyAction = new QAction(tr("Desktop notifications"), this);
    m_notifyAction->setCheckable(true);
    m_notifyAction->setChecked(m_tray->isEnabled());
    connect(m_notifyAction, &QAction::toggled, this, [this](bool on) {
        m_tray->setEnabled(on);
        QSettings().setValue(u"notifications"_qs, on);
    });
    if (m_session.receiver)
        connect(m_session.receiver->engine(), &IdempotencyEngine::delivered, m_tray,
                &TrayMonitor::delivered);
    m_tray->setSeesDeliveries(m_session.receiver != nullptr); // attach mode: from the counts
    // No tray on this desktop: nothing shows the monitor, so no switch for it either.
    m_notifyAction->setVisible(QSystemTrayIcon::isSystemTrayAvailable());
    if (!QSystemTrayIcon::isSystemTrayAvailable())
        return;
    m_trayIcon = new QSystemTrayIcon(applicationIcon(), this);
    m_trayIcon->setToolTip(m_tray->toolTip());
    connect(m_tray, &TrayMonitor::countsChanged, this,
            [this] { m_trayIcon->setToolTip(m_tray->toolTip()); });
    connect(m_tray, &TrayMonitor::notify, this, [this](const QString &title, const QString &text) {
        m_trayIcon->showMessage(title, text, windowIcon(), 8000);
    });
    connect(m_trayIcon, &QSystemTrayIcon::activated, this, [this] {
        showNormal();
        raise();
        activateWindow();
    });
    m_trayIcon->show();
}

void MainWindow::pollTray()
{
    struct Counts
    {
        qint64 failed = 0, stuck = 0;
    };
    m_session.pool->submit<Counts>(
        this,
        [](IdempotencyStore &store) -> Result<Counts> {
            auto counts = store.countKeys({});
            if (!counts)
                return counts.error();
            auto stuck = countStuckKeys(store);
            if (!stuck)
                return stuck.error();
            return Counts{counts->failed, *stuck};
        },
        [this](Result<Counts> counts) {
            if (counts)
                m_tray->setCounts(counts->failed, counts->stuck);
        });
}

void MainWindow::addPageActions()
{
    // View: one entry per tab (Ctrl+1…), then Refresh.
    for (int i = 0; i < m_pages->count(); ++i) {
        QAction *page = m_viewMenu->addAction(m_pages->tabText(i), this,
                                              [this, i] { m_pages->setCurrentIndex(i); });
        page->setShortcut(QKeySequence(Qt::CTRL | Qt::Key(Qt::Key_1 + i)));
    }
    m_viewMenu->addSeparator();
    m_viewMenu->addAction(m_refreshAction);
    m_viewMenu->addAction(m_notifyAction);
}

void MainWindow::restoreLayout()
{
    QSettings settings;
    if (!restoreGeometry(settings.value(u"window/geometry"_qs).toByteArray()))
        resize(1280, 760);
    restoreState(settings.value(u"window/state"_qs).toByteArray());
    m_split->restoreState(settings.value(u"window/split"_qs).toByteArray());
}

void MainWindow::fitKeyColumn()
{
    // As wide as the longest loaded key, as far as the other columns leave room: longer ones
    // are elided in the middle (their tooltip has the whole key).
    if (m_fittedKeyWidth && m_table->columnWidth(KeysModel::Key) != m_fittedKeyWidth)
        return; // the user set the width: theirs from now on
    const QFontMetrics metrics(m_table->font());
    int widest = m_table->horizontalHeader()->sectionSizeHint(KeysModel::Key);
    for (int row = 0; row < m_keys->rowCount(); ++row)
        widest = std::max(widest, metrics.horizontalAdvance(m_keys->record(row)->key) + 16);
    // What the other columns leave, but never under 200 px or over half the table.
    int others = 0;
    for (int c = 0; c < KeysModel::ColumnCount; ++c)
        if (c != KeysModel::Key)
            others += m_table->horizontalHeader()->sectionSizeHint(c) > 0 ? m_table->columnWidth(c) : 0;
    const int room = std::max(200, std::min(m_table->viewport()->width() - others, m_table->viewport()->width() / 2));
    m_fittedKeyWidth = std::min(widest, room);
    m_table->setColumnWidth(KeysModel::Key, m_fittedKeyWidth);
}

void MainWindow::showAbout()
{
    auto *box = new QMessageBox(QMessageBox::Information, tr("About Idempotency Desk"),
                                aboutText(tr("asking…")), QMessageBox::Close, this);
    box->setAttribute(Qt::WA_DeleteOnClose);
    box->setIconPixmap(windowIcon().pixmap(64, 64));
    box->setObjectName(u"about"_qs);
    box->show();
    // The store server's version is asked on a store worker; the box fills it in when it comes.
    m_session.pool->submit<QString>(
        box, [](IdempotencyStore &store) { return store.serverVersion(); },
        [box, this](Result<QString> version) {
            box->setText(aboutText(version ? *version
                                           : tr("unavailable (%1)").arg(version.error().message)));
        });
}

QString MainWindow::aboutText(const QString &storeVersion) const
{
    // What `idemdesk --version` prints (util/version.h), then the store and its server.
    const auto row = [](const QString &name, const QString &value) {
        return u"<tr><td>%1</td><td>%2</td></tr>"_qs.arg(name.toHtmlEscaped(),
                                                         value.toHtmlEscaped());
    };
    QString rows = row(tr("Desk"), tr("%1 (commit %2)").arg(deskVersion(), deskCommit()));
    for (const auto &[library, version] : libraryVersions())
        rows +=
            row(library, library == u"Qt"_qs && version != QStringLiteral(QT_VERSION_STR)
                             ? tr("%1 (built with %2)").arg(version, QStringLiteral(QT_VERSION_STR))
                             : version);
    const auto url = StoreUrl::parse(m_session.storeUrl);
    rows += row(tr("Store"), url ? url->display() : displayUrl(m_session.storeUrl));
    rows += row(tr("Store server"), storeVersion);
    return tr("<h3>Idempotency Desk %1</h3><p>Each webhook event processed once, however often it "
              "is delivered.</p><table>%2</table>")
        .arg(deskVersion().toHtmlEscaped(), rows);
}

void MainWindow::keepSelectionAcrossReset()
{
    // A refresh whose rows moved (a reset key is now the newest) resets the model, and a reset
    // clears the selection: keep it on the same keys.
    connect(m_sorted, &QAbstractItemModel::modelAboutToBeReset, this, [this] {
        const QStringList keys = selectedKeys();
        if (!keys.isEmpty())
            m_keptSelection = keys;
        const QModelIndex current = m_table->selectionModel()->currentIndex();
        if (current.isValid())
            m_keptCurrent = m_sorted->mapToSource(current).data(KeysModel::KeyRole).toString();
    });
    auto restore = [this] {
        if (m_keptSelection.isEmpty())
            return;
        QItemSelection selection;
        for (const QString &key : std::as_const(m_keptSelection)) {
            const int row = m_keys->rowOfKey(key);
            if (row < 0)
                continue;
            const QModelIndex index = m_sorted->mapFromSource(m_keys->index(row, 0));
            selection.select(index, index.siblingAtColumn(KeysModel::ColumnCount - 1));
        }
        if (selection.isEmpty())
            return; // not (yet) loaded: tried again when the next rows arrive
        QSignalBlocker quiet(m_table->selectionModel()); // the same keys: nothing to reload
        m_table->selectionModel()->select(selection, QItemSelectionModel::ClearAndSelect |
                                                         QItemSelectionModel::Rows);
        const int currentRow = m_keys->rowOfKey(m_keptCurrent);
        if (currentRow >= 0)
            m_table->selectionModel()->setCurrentIndex(
                m_sorted->mapFromSource(m_keys->index(currentRow, 0)),
                QItemSelectionModel::NoUpdate);
        quiet.unblock();
        m_keptSelection.clear();
        m_table->viewport()->update();
        updateActions();
        const QStringList keys = selectedKeys();
        if (keys.size() == 1 && keys.first() != m_detail->currentKey())
            loadDetail(); // brought here from elsewhere (a live delivery): show it
    };
    connect(m_sorted, &QAbstractItemModel::modelReset, this, restore);
    connect(m_keys, &KeysModel::loaded, this, restore);
    // A refresh moves rows as a change of layout (and takes rows from the end after it): the
    // selection follows its keys by itself. A selected key the move took out of the list (a
    // reset on the failed tab) is kept for the actions and the detail, as across a reset.
    const auto moving = [this] {
        if (!m_selectedBeforeMove)
            m_selectedBeforeMove = selectedKeys();
    };
    const auto moved = [this] {
        if (!m_selectedBeforeMove)
            return;
        const QStringList before = *std::exchange(m_selectedBeforeMove, std::nullopt);
        if (selectedKeys().isEmpty() && !before.isEmpty())
            m_keptSelection = before;
        updateActions();
    };
    connect(m_sorted, &QAbstractItemModel::layoutAboutToBeChanged, this, moving);
    connect(m_sorted, &QAbstractItemModel::layoutChanged, this, moved);
    connect(m_sorted, &QAbstractItemModel::rowsAboutToBeRemoved, this, moving);
    connect(m_sorted, &QAbstractItemModel::rowsRemoved, this, moved);
}

void MainWindow::showWarnings(const QStringList &warnings)
{
    m_warnings->setText(warnings.isEmpty()
                            ? QString()
                            : tr("<span style='color:%1'>⚠ %2</span>")
                                  .arg(stateColour(KeyState::Processing).name(),
                                       countOf(warnings.size(), u"warning", u"warnings")));
    m_warnings->setToolTip(plainToolTip(warnings.join(u'\n')));
}

void MainWindow::applyFilter()
{
    const int tab = std::max(0, m_stateTabs->currentIndex());
    m_keys->setFilter(kTabStates[size_t(tab)], m_endpointFilter->currentData().toString(),
                      m_textFilter->text(), m_typeFilter->text(), m_searchFilter->text());
    updateFindStatus();
}

void MainWindow::updateFindStatus()
{
    // An empty list says why: a filter matched nothing (and which), not an empty store.
    QStringList what;
    if (!m_keys->glob().isEmpty())
        what << tr("matching '%1'").arg(escapeControls(m_textFilter->text().trimmed()));
    if (!m_keys->type().isEmpty())
        what << tr("of type '%1'").arg(escapeControls(m_keys->type()));
    if (!m_keys->search().isEmpty())
        what << tr("whose body contains '%1'").arg(escapeControls(m_keys->search()));
    QString text;
    if (m_keys->isSearching())
        text = tr("Searching… %1 looked at").arg(countOf(m_keys->scanned(), u"key", u"keys"));
    else if (m_keys->rowCount() == 0 && !m_keys->isLoading() && !what.isEmpty())
        text = tr("No keys %1.").arg(what.join(tr(" and "))) +
               (m_keys->isFinding()
                    ? QString()
                    : tr(" The first box reads key names; the search box reads request bodies."));
    else if (m_keys->isFinding())
        text = tr("%1 found, %2 looked at%3")
                   .arg(countOf(m_keys->rowCount(), u"key", u"keys"))
                   .arg(m_keys->scanned())
                   .arg(m_keys->foundAll() ? QString() : tr(" (scroll for more)"));
    m_findStatus->setText(text);
}

QStringList MainWindow::selectedKeys() const
{
    QStringList keys;
    for (const QModelIndex &index : m_table->selectionModel()->selectedRows())
        keys << m_sorted->mapToSource(index).data(KeysModel::KeyRole).toString();
    return keys;
}

QStringList MainWindow::actionKeys() const
{
    // A refresh took the selected keys out of the filter (a reset on the failed tab): the
    // detail still shows them, and the actions still apply to them until another is chosen.
    const QStringList keys = selectedKeys();
    return keys.isEmpty() ? m_keptSelection : keys;
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
    const QStringList keys = actionKeys();
    const bool one = keys.size() == 1;
    m_resetAction->setEnabled(!keys.isEmpty());
    m_deleteAction->setEnabled(!keys.isEmpty());
    m_forceFailAction->setEnabled(!keys.isEmpty());
    m_retryAction->setEnabled(one);
    m_copyCurlAction->setEnabled(one);
    m_copyKeyAction->setEnabled(!keys.isEmpty());
}

void MainWindow::loadDetail()
{
    const QStringList keys = actionKeys();
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
    if (m_refreshes++ % 5 == 0)
        pollTray();
    m_keys->refresh();
    if (!m_detailLoading && !m_detail->currentKey().isEmpty() && actionKeys().size() == 1)
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
        text += tr(" · %1, %2 reached the processor")
                    .arg(countOf(deliveries, u"delivery", u"deliveries"))
                    .arg(counters.processorRuns);
    }
    m_counts->setText(text);
    // The window's calls and the receiver's: a store refusing every delivery (a full disk) while
    // the window's reads go through is not healthy.
    const StoreHealth health =
        m_session.receiver && m_session.receiver->pool() != m_session.pool
            ? combinedHealth(m_session.pool->health(), m_session.receiver->pool()->health())
            : m_session.pool->health();
    const QString store = StoreUrl::parse(m_session.storeUrl).ok()
                              ? StoreUrl::parse(m_session.storeUrl)->display()
                              : displayUrl(m_session.storeUrl);
    // Over the last 10 s of calls, not the last one alone: with one part of the store failing
    // (a Redis Cluster master of three) it flapped between healthy and unavailable.
    const qint64 now = QDateTime::currentMSecsSinceEpoch();
    QString verdict;
    KeyState colour = KeyState::Failed;
    QString why;
    const auto lastError = [&health] {
        return tr("last error (%1): %2")
            .arg(QDateTime::fromMSecsSinceEpoch(health.lastErrorAtMs).toString(u"hh:mm:ss"_qs),
                 health.lastError);
    };
    switch (health.verdict(now)) {
    case StoreHealth::Verdict::Healthy:
        verdict = tr("healthy");
        colour = KeyState::Completed;
        break;
    case StoreHealth::Verdict::Degraded:
        verdict = tr("degraded");
        colour = KeyState::Processing;
        why = tr("%1 of the last %2 calls failed in %3 s; %4")
                  .arg(health.recentFailures)
                  .arg(health.recentCalls)
                  .arg(StoreHealth::kRecentSeconds)
                  .arg(lastError());
        break;
    case StoreHealth::Verdict::RefusingWrites:
        verdict = tr("refusing writes");
        why = tr("new deliveries get 503: %1").arg(health.lastWriteError);
        break;
    case StoreHealth::Verdict::Unavailable:
        verdict = tr("unavailable");
        why = lastError();
        break;
    }
    m_storeLabel->setText(tr("Store %1 <span style='color:%2'>● %3</span>")
                              .arg(store.toHtmlEscaped(), stateColour(colour).name(), verdict));
    m_storeLabel->setToolTip(plainToolTip(why));
}

QString MainWindow::statusText() const
{
    return m_counts->text() + u" | "_qs + m_storeLabel->text() + u" | "_qs + m_warnings->toolTip();
}

bool MainWindow::confirm(const QString &title, const QString &text)
{
    // The text names keys: plain, never read as HTML.
    QMessageBox box(QMessageBox::Question, title, escapeControls(text, true),
                    QMessageBox::Yes | QMessageBox::Cancel, this);
    box.setTextFormat(Qt::PlainText);
    box.setDefaultButton(QMessageBox::Cancel);
    return box.exec() == QMessageBox::Yes;
}

void MainWindow::finishAction(const QString &message, bool ok)
{
    Q_EMIT actionFinished(message, ok);
    statusBar()->showMessage(escapeControls(message), 8000);
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
                results << (*verdict == OperatorVerdict::Accept    ? QString()
                            : *verdict == OperatorVerdict::Missing ? u"missing"_qs
                            : *verdict == OperatorVerdict::Leased
                                ? u"its lease has not ended: a run may still be going"_qs
                                : u"wrong state"_qs);
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
    // Watching a shared store (no receiver here) without the desk's config, the endpoint's
    // processor is unknown: the built-in config's would simulate, and mark the event completed
    // without the app seeing it.
    if (!m_session.receiver && m_session.configPath.isEmpty())
        return deliver(makeError(
            ErrorCode::Invalid,
            tr("not retried — this window watches the store without the desk's config, so it "
               "does not know where the endpoint forwards; start it with --config FILE")));
    IdempotencyEngine *engine = m_session.receiver ? m_session.receiver->engine() : m_localEngine;
    QMetaObject::invokeMethod(engine, [engine, key, force, deliver] { engine->retryKey(key, force, deliver); }, Qt::QueuedConnection);
}

void MainWindow::retrySelected()
{
    const QStringList keys = actionKeys();
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
            finishAction(
                tr("Reset %1 %2.").arg(countOf(*reset, u"failed key", u"failed keys"), scope),
                true);
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

void MainWindow::openSend()
{
    if (!m_session.receiver)
        return;
    SendTarget target;
    const ListenAddress address = m_session.receiver->address();
    // A receiver on every address is reached on loopback.
    target.host =
        address.host.isEqual(QHostAddress::AnyIPv4) || address.host.isEqual(QHostAddress::Any)
            ? QByteArray("127.0.0.1")
            : address.host.toString().toLatin1();
    target.port = address.port;
    auto *dialog = new SendDialog(m_session.config, target, this);
    dialog->setAttribute(Qt::WA_DeleteOnClose);
    connect(dialog, &SendDialog::sent, this, &MainWindow::refreshAll);
    dialog->show();
}

void MainWindow::exportKeys()
{
    const QString path =
        QFileDialog::getSaveFileName(this, tr("Export keys"), u"idemdesk-keys.jsonl"_qs,
                                     tr("JSON Lines (*.jsonl);;All files (*)"));
    if (!path.isEmpty())
        exportTo(path, actionKeys());
}

void MainWindow::importKeys()
{
    const QString path = QFileDialog::getOpenFileName(
        this, tr("Import keys"), QString(), tr("JSON Lines (*.jsonl *.json);;All files (*)"));
    if (!path.isEmpty())
        importFrom(path);
}

void MainWindow::exportTo(const QString &path, const QStringList &selected)
{
    // A type or a search is not a filter the store's export reads: the keys found are written.
    QStringList keys = selected;
    if (keys.isEmpty() && m_keys->isFinding()) {
        for (int row = 0; row < m_keys->rowCount(); ++row)
            keys << m_keys->record(row)->key;
        if (keys.isEmpty())
            return finishAction(tr("Export not done: no key found"), false);
    }
    // The selection, or with none selected every key of the filter; written on a store worker.
    KeyQuery filter;
    const int tab = std::max(0, m_stateTabs->currentIndex());
    filter.state = kTabStates[size_t(tab)];
    filter.endpoint = m_endpointFilter->currentData().toString();
    filter.glob = m_keys->glob();
    m_session.pool->submit<ExportReport>(
        this,
        [path, keys, filter, closing = m_closing](IdempotencyStore &store) -> Result<ExportReport> {
            PrivateFile file; // 0600, whole or not at all
            if (auto opened = file.open(path); !opened)
                return opened.error();
            auto report = idem::exportKeys(
                store, filter, keys,
                [&](const QByteArray &line) { file.device()->write(line + '\n'); }, closing.get());
            if (!report)
                return report.error(); // the file is not replaced
            if (auto committed = file.commit(); !committed)
                return committed.error();
            return report;
        },
        [this, path](Result<ExportReport> report) {
            if (!report)
                return finishAction(tr("Export not done: %1").arg(report.error().message), false);
            QString message =
                tr("Exported %1 to %2.").arg(countOf(report->written, u"key", u"keys"), path);
            if (!report->missing.isEmpty())
                message += tr(" Gone meanwhile: %1.").arg(report->missing.join(u", "_qs));
            if (!report->incomplete.isEmpty())
                message += tr(" Not exported, as the store no longer has the shared content "
                              "they name: %1.")
                               .arg(report->incomplete.join(u"; "_qs));
            finishAction(message, report->missing.isEmpty() && report->incomplete.isEmpty());
        });
}

void MainWindow::importFrom(const QString &path)
{
    struct Report
    {
        QStringList imported, existing, refused;
        QString stopped;
    };
    m_session.pool->submit<Report>(
        this,
        [path, config = m_session.config,
         closing = m_closing](IdempotencyStore &store) -> Result<Report> {
            QFile file(path);
            if (!file.open(QIODevice::ReadOnly))
                return makeError(ErrorCode::Invalid, u"%1: %2"_qs.arg(path, file.errorString()));
            Report report;
            const ImportReport counts = importLines(
                store, file, config,
                [&](qint64 number, const Result<ImportedLine> &done) {
                    if (!done)
                        report.refused << u"line %1: %2"_qs.arg(number).arg(done.error().message);
                    else
                        (done->verdict == ImportVerdict::Imported ? report.imported
                                                                  : report.existing)
                            << done->key;
                },
                closing.get());
            report.stopped = counts.stopped;
            return report;
        },
        [this, path](Result<Report> report) {
            if (!report)
                return finishAction(tr("Import not done: %1").arg(report.error().message), false);
            QString message = tr("Imported %1 from %2.")
                                  .arg(countOf(report->imported.size(), u"key", u"keys"), path);
            // The first ten of each list, the rest counted: the message is the status bar's and the
            // detail's banner.
            auto firstOf = [](const QStringList &items, const QString &separator) {
                return items.size() <= 10
                           ? items.join(separator)
                           : items.mid(0, 10).join(separator) +
                                 tr("%1and %2 more").arg(separator).arg(items.size() - 10);
            };
            if (!report->existing.isEmpty())
                message +=
                    tr(" Already here, left alone: %1.").arg(firstOf(report->existing, u", "_qs));
            if (!report->refused.isEmpty())
                message += tr(" Refused: %1").arg(firstOf(report->refused, u"; "_qs));
            if (!report->stopped.isEmpty())
                message += tr(" Stopped: %1").arg(report->stopped);
            finishAction(message, report->refused.isEmpty() && report->stopped.isEmpty());
        });
}

void MainWindow::openSettings()
{
    auto *dialog = new SettingsDialog(m_session.config, m_session.storeUrl, m_session.configPath, this);
    dialog->setAttribute(Qt::WA_DeleteOnClose);
    dialog->show();
}

Result<CurlCommand> MainWindow::curlFor(const KeyRecord &r) const
{
    const QString base = m_session.receiver ? u"http://"_qs + m_session.receiver->address().toString()
                                            : u"http://"_qs + m_session.config.listen.toString();
    return curlCommand(r.request, base);
}

} // namespace idem
