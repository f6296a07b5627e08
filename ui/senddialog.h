#pragma once

#include "config/config.h"
#include "engine/send.h"

#include <QDialog>

class QComboBox;
class QLabel;
class QLineEdit;
class QPlainTextEdit;
class QPushButton;
class QSpinBox;
class QTableWidget;
class QThread;

namespace idem {

// Send test event…: a delivery for an endpoint from its provider's template, edited, sent once
// or N times to the desk's receiver, signed as the provider signs with the endpoint's secret
// (SendGrid: with a private key the user gives), and the answers. The sending runs on a
// thread of its own, never the GUI thread.
class SendDialog final : public QDialog
{
    Q_OBJECT
public:
    SendDialog(const Config &config, const SendTarget &target, QWidget *parent = nullptr);
    ~SendDialog() override;

    QComboBox *endpoint() const { return m_endpoint; }
    QComboBox *templates() const { return m_template; }
    QPlainTextEdit *headers() const { return m_headers; }
    QPlainTextEdit *body() const { return m_body; }
    QSpinBox *copies() const { return m_copies; }
    QLineEdit *signKey() const { return m_signKey; }
    QTableWidget *answers() const { return m_answers; }
    QLabel *summary() const { return m_summary; }
    void send();
    void compose(); // a new event from the template (a new id)

Q_SIGNALS:
    void sent(int rejected); // every copy answered (or the send was refused: -1)

private:
    void endpointChanged();
    void addAnswer(int copy, const SentAnswer &answer);

    Config m_config;
    SendTarget m_target;
    QComboBox *m_endpoint;
    QComboBox *m_template;
    QPlainTextEdit *m_headers;
    QPlainTextEdit *m_body;
    QSpinBox *m_copies;
    QLineEdit *m_signKey;
    QPushButton *m_browse;
    QPushButton *m_send;
    QTableWidget *m_answers;
    QLabel *m_summary;
    QThread *m_thread = nullptr;
    int m_rejected = 0;
};

} // namespace idem
