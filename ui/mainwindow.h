#pragma once

#include "config/config.h"
#include "store/storepool.h"

#include <QMainWindow>

#include <functional>
#include <memory>

class QAction;
class QComboBox;
class QLabel;
class QLineEdit;
class QSortFilterProxyModel;
class QTabBar;
class QTabWidget;
class QTableView;
class QTimer;

namespace idem {

class DeliveriesModel;
class IdempotencyEngine;
class KeyDetailView;
class KeysModel;
class Receiver;
class TrafficView;
struct RetryOutcome;

// What the window works on: the store, and the embedded receiver unless in attach mode.
struct DeskSession
{
    Config config;
    QString storeUrl;
    QString configPath;
    std::shared_ptr<StorePool> pool;
    Receiver *receiver = nullptr; // null: attach mode (`gui --no-receiver`)
};

// The dashboard (SPEC §6): keys by state with live TTLs, the selected key's detail, actions,
// traffic, storm, settings, and a status bar. It only reads what store workers and the
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
    QTabBar *stateTabs() const { return m_stateTabs; }
    QComboBox *endpointFilter() const { return m_endpointFilter; }
    QLineEdit *textFilter() const { return m_textFilter; }
    QTabWidget *pages() const { return m_pages; }
    QLabel *statusWarnings() const { return m_warnings; }
    QString statusText() const;
    QStringList selectedKeys() const;
    void selectKey(const QString &key);

    QAction *resetAction() const { return m_resetAction; }
    QAction *retryAction() const { return m_retryAction; }
    QAction *forceFailAction() const { return m_forceFailAction; }
    QAction *deleteAction() const { return m_deleteAction; }
    QAction *copyCurlAction() const { return m_copyCurlAction; }
    QAction *resetAllFailedAction() const { return m_resetAllFailedAction; }
    QAction *stormAction() const { return m_stormAction; }
    QAction *settingsAction() const { return m_settingsAction; }

    // A curl command that sends the key's stored request again (secret headers masked).
    QString curlFor(const KeyRecord &record) const;

Q_SIGNALS:
    void actionFinished(const QString &message, bool ok); // also shown in the detail
    void detailLoaded(const QString &key);

private:
    void applyFilter();
    void loadDetail();
    void refreshAll();
    void updateStatus();
    void updateActions();
    void operatorOn(const QStringList &keys, OperatorAction action, bool force, const QString &verb);
    void retrySelected();
    void resetAllFailed();
    void openStorm();
    void openSettings();
    void runRetry(const QString &key, bool force, std::function<void(Result<RetryOutcome>)> done);
    bool confirm(const QString &title, const QString &text);
    void finishAction(const QString &message, bool ok);

    DeskSession m_session;
    IdempotencyEngine *m_localEngine = nullptr; // attach mode: runs retries here (never blocks)
    KeysModel *m_keys;
    QSortFilterProxyModel *m_sorted;
    QTableView *m_table;
    KeyDetailView *m_detail;
    TrafficView *m_traffic;
    DeliveriesModel *m_deliveries = nullptr;
    QTabBar *m_stateTabs;
    QComboBox *m_endpointFilter;
    QLineEdit *m_textFilter;
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
    quint64 m_detailGeneration = 0;
    bool m_detailLoading = false;
};

} // namespace idem
