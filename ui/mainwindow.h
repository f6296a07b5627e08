#pragma once

#include "config/config.h"
#include "curlcommand.h"
#include "model/keyrecord.h"
#include "store/storepool.h"

#include <QMainWindow>

#include <atomic>
#include <functional>
#include <memory>
#include <optional>

class QAction;
class QComboBox;
class QLabel;
class QLineEdit;
class QSortFilterProxyModel;
class QMenu;
class QPushButton;
class QSystemTrayIcon;
class QSplitter;
class QTabBar;
class QTabWidget;
class QTableView;
class QTimer;

namespace idem {

class DeliveriesFilter;
class DeliveriesModel;
class IdempotencyEngine;
class KeyDetailView;
class KeysModel;
class Receiver;
class TrafficView;
class TrayMonitor;
struct RetryOutcome;

// The "Try: curl …" hint for the receiver's address: an endpoint that verifies no signature,
// with the key where it reads it; when every endpoint is signed, Send test event instead.
QString tryHint(const Config &config, const QString &base);

// What the window works on: the store, and the embedded receiver unless in attach mode.
struct DeskSession
{
    Config config;
    QString storeUrl;
    QString configPath;
    std::shared_ptr<StorePool> pool;
    Receiver *receiver = nullptr; // null: attach mode (`gui --no-receiver`)
};

// The dashboard (docs/dashboard.md): keys by state with live TTLs, the selected key's detail,
// actions, traffic, storm, settings, and a status bar. It only reads what store workers and the
// receiver thread send it: the GUI thread never waits on a store or the network.
class MainWindow final : public QMainWindow
{
    Q_OBJECT
public:
    explicit MainWindow(DeskSession session, QWidget *parent = nullptr);
    ~MainWindow() override;

    KeysModel *keys() const { return m_keys; }
    QTableView *keysTable() const { return m_table; }
    KeyDetailView *detail() const { return m_detail; }
    TrafficView *traffic() const { return m_traffic; }
    DeliveriesModel *deliveries() const { return m_deliveries; }
    QTableView *liveView() const { return m_live; }
    QComboBox *liveOutcomeFilter() const { return m_liveOutcome; }
    QComboBox *liveEndpointFilter() const { return m_liveEndpoint; }
    QPushButton *livePause() const { return m_livePause; }
    // The Keys page on `key` (from a live delivery): selected once it is loaded.
    void openKey(const QString &key);
    QTabBar *stateTabs() const { return m_stateTabs; }
    QComboBox *endpointFilter() const { return m_endpointFilter; }
    QLineEdit *textFilter() const { return m_textFilter; }
    QLineEdit *typeFilter() const { return m_typeFilter; }     // exact event type
    QLineEdit *searchFilter() const { return m_searchFilter; } // text in the stored bodies
    // What the Keys page says about its filter: a find under way, or that nothing matched.
    QLabel *findStatus() const { return m_findStatus; }
    QTabWidget *pages() const { return m_pages; }
    QLabel *statusWarnings() const { return m_warnings; }
    QString statusText() const;
    QStringList selectedKeys() const;
    // What Reset, Delete, Retry … act on: the selection, or the selected keys a refresh took
    // out of the filter (still in the detail) until another row is chosen.
    QStringList actionKeys() const;
    void selectKey(const QString &key);

    QAction *resetAction() const { return m_resetAction; }
    QAction *retryAction() const { return m_retryAction; }
    QAction *forceFailAction() const { return m_forceFailAction; }
    QAction *deleteAction() const { return m_deleteAction; }
    QAction *copyCurlAction() const { return m_copyCurlAction; }
    QAction *resetAllFailedAction() const { return m_resetAllFailedAction; }
    QAction *stormAction() const { return m_stormAction; }
    QAction *settingsAction() const { return m_settingsAction; }
    QAction *copyKeyAction() const { return m_copyKeyAction; }
    QAction *exportAction() const { return m_exportAction; }
    QAction *importAction() const { return m_importAction; }
    QAction *sendAction() const { return m_sendAction; }
    QAction *findAction() const { return m_findAction; }
    QAction *refreshAction() const { return m_refreshAction; }
    QAction *aboutAction() const { return m_aboutAction; }
    QAction *notificationsAction() const { return m_notifyAction; }
    TrayMonitor *trayMonitor() const { return m_tray; }
    QSplitter *splitter() const { return m_split; }
    QLabel *addressLabel() const { return m_address; }
    QString aboutText(const QString &storeVersion) const;

    // Export / import without a file dialog (the dialogs call these; so do tests).
    void exportTo(const QString &path, const QStringList &keys);
    void importFrom(const QString &path);

    // A curl command that sends the key's stored request again (curlcommand.h).
    Result<CurlCommand> curlFor(const KeyRecord &record) const;

Q_SIGNALS:
    void actionFinished(const QString &message, bool ok); // also shown in the detail
    void detailLoaded(const QString &key);

private:
    void applyFilter();
    void loadDetail();
    void refreshAll();
    void updateStatus();
    void updateActions();
    void buildActions();
    void buildLivePage();
    void buildTray();
    void pollTray();
    void addPageActions();
    void restoreLayout();
    void fitKeyColumn();
    void keepSelectionAcrossReset();
    void showAbout();
    void openSend();
    void exportKeys();
    void importKeys();
    void operatorOn(const QStringList &keys, OperatorAction action, bool force,
                    const QString &verb);
    void retrySelected();
    void resetAllFailed();
    void openStorm();
    void openSettings();
    void runRetry(const QString &key, bool force, std::function<void(Result<RetryOutcome>)> done);
    bool confirm(const QString &title, const QString &text);
    void finishAction(const QString &message, bool ok);

    DeskSession m_session;
    // Set when the window goes: an export or import on a store worker stops at its next key,
    // so quitting never waits for a whole store to be written out.
    std::shared_ptr<std::atomic<bool>> m_closing = std::make_shared<std::atomic<bool>>(false);
    IdempotencyEngine *m_localEngine = nullptr; // attach mode: runs retries here (never blocks)
    KeysModel *m_keys;
    QSortFilterProxyModel *m_sorted;
    QTableView *m_table;
    KeyDetailView *m_detail;
    TrafficView *m_traffic;
    DeliveriesModel *m_deliveries = nullptr;
    DeliveriesFilter *m_liveFilter = nullptr;
    QTableView *m_live = nullptr;
    QComboBox *m_liveOutcome = nullptr;
    QComboBox *m_liveEndpoint = nullptr;
    QPushButton *m_livePause = nullptr;
    QTabBar *m_stateTabs;
    QComboBox *m_endpointFilter;
    QLineEdit *m_textFilter;
    QLineEdit *m_typeFilter;
    QLineEdit *m_searchFilter;
    QLabel *m_findStatus;
    void updateFindStatus();
    QTabWidget *m_pages;
    QLabel *m_address;
    QLabel *m_storeLabel;
    QLabel *m_counts;
    QLabel *m_warnings;
    void showWarnings(const QStringList &warnings);
    QTimer *m_refresh;
    QTimer *m_filterDelay;
    QAction *m_resetAction;
    QAction *m_retryAction;
    QAction *m_forceFailAction;
    QAction *m_deleteAction;
    QAction *m_copyCurlAction;
    QAction *m_resetAllFailedAction;
    QAction *m_stormAction;
    QAction *m_settingsAction;
    QAction *m_copyKeyAction;
    QAction *m_exportAction;
    QAction *m_importAction;
    QAction *m_sendAction;
    QAction *m_findAction;
    QAction *m_refreshAction;
    QAction *m_aboutAction;
    QMenu *m_viewMenu;
    QAction *m_notifyAction = nullptr;
    TrayMonitor *m_tray = nullptr;
    QSystemTrayIcon *m_trayIcon = nullptr;
    quint64 m_refreshes = 0;
    QSplitter *m_split = nullptr;
    QStringList m_keptSelection; // selected keys to bring back after the model was reset
    QString m_keptCurrent;
    // While the model moves rows (a refresh: new keys on top, a key out of the filter), what
    // was selected before; the selection the move drops is not the user's choice.
    std::optional<QStringList> m_selectedBeforeMove;
    int m_fittedKeyWidth = 0; // the Key column's width as fitted last (another: the user's)
    quint64 m_detailGeneration = 0;
    bool m_detailLoading = false;
};

} // namespace idem
