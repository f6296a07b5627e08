#pragma once

#include <QMainWindow>

class QLabel;
class QTableView;

namespace idem {

class DeliveriesModel;
class Receiver;

// The window of `idemdesk` / `idemdesk gui`: the receiver's address and the live deliveries.
// Reads only what the receiver thread sends it; never waits on the store or the network.
class MainWindow final : public QMainWindow
{
    Q_OBJECT
public:
    MainWindow(Receiver *receiver, QString storeDisplay, QWidget *parent = nullptr);
    DeliveriesModel *deliveries() const { return m_model; }

private:
    void refreshStatus();

    Receiver *m_receiver;
    QString m_storeDisplay;
    DeliveriesModel *m_model;
    QTableView *m_table;
    QLabel *m_address;
    QLabel *m_counts;
};

} // namespace idem
