#pragma once

#include "config/config.h"
#include "engine/storm.h"

#include <QDialog>

class QComboBox;
class QLabel;
class QLineEdit;
class QProgressBar;
class QPushButton;
class QSpinBox;
class QThread;

namespace idem {

// Fires identical, properly signed deliveries at the desk's own receiver (or another URL) from
// a thread of its own, and shows what came back: one processor run per key.
class StormDialog final : public QDialog
{
    Q_OBJECT
public:
    StormDialog(const Config &config, const QString &receiverUrl, QWidget *parent = nullptr);
    ~StormDialog() override;

    void start();
    bool running() const { return m_thread != nullptr; }
    QString resultText() const;
    const StormReport &report() const { return m_report; }
    QComboBox *endpoint() const { return m_endpoint; }
    QSpinBox *copies() const { return m_copies; }
    QSpinBox *concurrency() const { return m_concurrency; }
    QSpinBox *keys() const { return m_keys; }

Q_SIGNALS:
    void finished();

private:
    void showReport();

    Config m_config;
    QComboBox *m_endpoint;
    QSpinBox *m_copies;
    QSpinBox *m_concurrency;
    QSpinBox *m_keys;
    QLineEdit *m_url;
    QPushButton *m_run;
    QProgressBar *m_progress;
    QLabel *m_result;
    QThread *m_thread = nullptr;
    StormReport m_report;
};

} // namespace idem
