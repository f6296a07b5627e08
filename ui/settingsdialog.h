#pragma once

#include "config/config.h"
#include "store/storepool.h"

#include <QDialog>

class QLabel;
class QLineEdit;
class QPushButton;
class QTableWidget;
class QThread;

namespace idem {

// Endpoints (secrets masked), store URL with "Test connection", listen address; saved as the
// JSON config file the desk starts with next time (its path is remembered in QSettings).
class SettingsDialog final : public QDialog
{
    Q_OBJECT
public:
    SettingsDialog(Config config, QString storeUrl, QString configPath, QWidget *parent = nullptr);
    ~SettingsDialog() override;

    // The config as edited, validated like a config file (errors name the field).
    Result<Config> edited() const;
    bool save();
    void testConnection();
    QString testResult() const;
    QTableWidget *endpointTable() const { return m_endpoints; }
    QLineEdit *storeEdit() const { return m_store; } // its password shown as ***
    QString storeUrl() const;                        // the field, with the password back
    QString configPath() const { return m_path; }
    void editEndpoint(int row); // opens the endpoint form (row -1: a new endpoint)

    static QString defaultConfigPath();

Q_SIGNALS:
    void connectionTested(bool ok);

private:
    void fillEndpoints();

    Config m_config;
    QString m_path;
    QLineEdit *m_listen;
    QString m_storeUrl; // as given: the field hides its password
    QLineEdit *m_store;
    QLabel *m_test;
    QTableWidget *m_endpoints;
    QLabel *m_status;
    QThread *m_tester = nullptr;
};

// The store at `storeUrl`, opened at start; while it cannot be reached, a box says why and offers
// to try again, to choose another store in the settings (saved to `configPath`, as the Settings
// dialog saves), or to quit: null then. `config`, `storeUrl` and `configPath` end as chosen
// (docs/configuration.md#the-windows-settings: the window never just exits on a store it cannot
// reach). Before any window is shown: each try waits for the store's connect timeout.
std::shared_ptr<StorePool> openStoreOrAsk(Config &config, QString &storeUrl, QString &configPath);

} // namespace idem
