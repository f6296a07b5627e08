#include "senddialog.h"

#include "colours.h"
#include "jsonhighlighter.h"
#include "richtext.h"
#include "util/crypto.h"
#include "util/format.h"

#include <QApplication>
#include <QComboBox>
#include <QDialogButtonBox>
#include <QFile>
#include <QFileDialog>
#include <QFontDatabase>
#include <QFormLayout>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QLineEdit>
#include <QPlainTextEdit>
#include <QPointer>
#include <QPushButton>
#include <QSignalBlocker>
#include <QSpinBox>
#include <QSplitter>
#include <QTableWidget>
#include <QThread>
#include <QVBoxLayout>

namespace idem {

SendDialog::SendDialog(const Config &config, const SendTarget &target, QWidget *parent)
    : QDialog(parent), m_config(config), m_target(target), m_endpoint(new QComboBox(this)),
      m_template(new QComboBox(this)), m_headers(new QPlainTextEdit(this)),
      m_body(new QPlainTextEdit(this)), m_copies(new QSpinBox(this)),
      m_signKey(new QLineEdit(this)), m_browse(new QPushButton(tr("Browse…"), this)),
      m_send(new QPushButton(tr("Send"), this)), m_answers(new QTableWidget(0, 5, this)),
      m_summary(new QLabel(this))
{
    setWindowTitle(tr("Send test event"));
    for (const EndpointConfig &e : m_config.endpoints)
        m_endpoint->addItem(u"%1 (%2)"_qs.arg(e.name, e.provider), e.name);
    m_copies->setRange(1, 1000);
    m_copies->setToolTip(
        tr("Identical copies: the first is processed, the others are duplicates of it."));
    m_signKey->setPlaceholderText(
        tr("SendGrid: the private key (PEM file) that pairs with the endpoint's public key"));
    m_headers->setPlaceholderText(
        tr("Name: value, one a line (the signature is added when it is sent)"));
    m_headers->setMaximumHeight(m_headers->fontMetrics().height() * 7);
    m_headers->setLineWrapMode(QPlainTextEdit::NoWrap);
    m_body->setLineWrapMode(QPlainTextEdit::NoWrap);
    m_body->setFont(QFontDatabase::systemFont(QFontDatabase::FixedFont));
    m_headers->setFont(m_body->font());
    new JsonHighlighter(m_body->document());

    auto *form = new QFormLayout;
    auto *templateRow = new QHBoxLayout;
    auto *fresh = new QPushButton(tr("New event"), this);
    fresh->setToolTip(tr("The template again, with a new event id: a new key."));
    templateRow->addWidget(m_template, 1);
    templateRow->addWidget(fresh);
    form->addRow(tr("Endpoint"), m_endpoint);
    form->addRow(tr("Template"), templateRow);
    form->addRow(tr("Headers"), m_headers);
    auto *keyRow = new QHBoxLayout;
    keyRow->addWidget(m_signKey, 1);
    keyRow->addWidget(m_browse);
    form->addRow(tr("Signing key"), keyRow);
    auto *sendRow = new QHBoxLayout;
    sendRow->addWidget(new QLabel(tr("Copies"), this));
    sendRow->addWidget(m_copies);
    sendRow->addStretch(1);
    sendRow->addWidget(m_send);
    m_send->setDefault(true);

    m_answers->setHorizontalHeaderLabels(
        {tr("#"), tr("Status"), tr("Outcome"), tr("Key"), tr("Answer")});
    m_answers->verticalHeader()->hide();
    m_answers->setEditTriggers(QAbstractItemView::NoEditTriggers);
    m_answers->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
    m_answers->horizontalHeader()->setStretchLastSection(true);
    m_answers->setWordWrap(false);

    auto *layout = new QVBoxLayout(this);
    layout->addLayout(form);
    auto *split = new QSplitter(Qt::Vertical, this);
    split->addWidget(m_body);
    split->addWidget(m_answers);
    split->setSizes({320, 160});
    layout->addWidget(split, 1);
    layout->addLayout(sendRow);
    m_summary->setWordWrap(true);
    m_summary->setTextInteractionFlags(Qt::TextSelectableByMouse);
    layout->addWidget(m_summary);
    auto *buttons = new QDialogButtonBox(QDialogButtonBox::Close, this);
    connect(buttons, &QDialogButtonBox::rejected, this, &QDialog::reject);
    layout->addWidget(buttons);

    connect(m_endpoint, &QComboBox::currentIndexChanged, this, &SendDialog::endpointChanged);
    connect(m_template, &QComboBox::currentIndexChanged, this, &SendDialog::compose);
    connect(fresh, &QPushButton::clicked, this, &SendDialog::compose);
    connect(m_send, &QPushButton::clicked, this, &SendDialog::send);
    connect(m_browse, &QPushButton::clicked, this, [this] {
        const QString path = QFileDialog::getOpenFileName(
            this, tr("SendGrid private key"), QString(), tr("PEM (*.pem *.key);;All files (*)"));
        if (!path.isEmpty())
            m_signKey->setText(path);
    });
    endpointChanged();
    resize(760, 640);
}

SendDialog::~SendDialog() =
    default; // a send still running finishes on its own thread and deletes it

void SendDialog::endpointChanged()
{
    const EndpointConfig *e = m_config.endpoint(m_endpoint->currentData().toString());
    const Provider *provider = e ? providerFor(e->provider) : nullptr;
    {
        QSignalBlocker quiet(m_template);
        m_template->clear();
        if (provider)
            m_template->addItems(provider->templates());
    }
    const bool sendgrid = e && e->provider == u"sendgrid"_qs;
    m_signKey->setEnabled(sendgrid);
    m_browse->setEnabled(sendgrid);
    if (!sendgrid)
        m_signKey->clear();
    compose();
}

void SendDialog::compose()
{
    const EndpointConfig *e = m_config.endpoint(m_endpoint->currentData().toString());
    if (!e)
        return;
    auto d = composeTestEvent(*e, m_template->currentText());
    if (!d) {
        m_summary->setText(d.error().message.toHtmlEscaped());
        return;
    }
    QStringList lines;
    for (const auto &[name, value] : d->headers)
        lines << QString::fromLatin1(name + ": " + value);
    m_headers->setPlainText(lines.join(u'\n'));
    m_body->setPlainText(QString::fromUtf8(d->body));
    const bool signs = !e->secrets.isEmpty() || !e->publicKeys.isEmpty();
    m_summary->setText(signs ? tr("Signed as %1 signs, with the endpoint's %2, when it is sent.")
                                   .arg(e->provider, e->provider == u"sendgrid"_qs
                                                         ? tr("private key (give it above)")
                                                         : tr("secret"))
                             : tr("The endpoint verifies no signature: sent unsigned."));
}

void SendDialog::send()
{
    if (m_thread)
        return;
    const EndpointConfig *found = m_config.endpoint(m_endpoint->currentData().toString());
    if (!found)
        return;
    EndpointConfig e = *found;
    if (!m_signKey->text().trimmed().isEmpty()) {
        QFile pem(m_signKey->text().trimmed());
        if (!pem.open(QIODevice::ReadOnly)) {
            m_summary->setText(
                tr("<span style='color:%1'>Cannot read the signing key %2: %3</span>")
                    .arg(stateColour(KeyState::Failed).name(), pem.fileName().toHtmlEscaped(),
                         pem.errorString()));
            Q_EMIT sent(-1);
            return;
        }
        e.privateKey = pem.read(64 * 1024); // a PEM key is a few hundred bytes
        if (auto ok = checkEcPrivateKey(e.privateKey); !ok) {
            m_summary->setText(tr("<span style='color:%1'>The signing key %2: %3</span>")
                                   .arg(stateColour(KeyState::Failed).name(),
                                        pem.fileName().toHtmlEscaped(), ok.error().message));
            Q_EMIT sent(-1);
            return;
        }
    }
    OutgoingDelivery d;
    for (const QString &line : m_headers->toPlainText().split(u'\n', Qt::SkipEmptyParts)) {
        const qsizetype colon = line.indexOf(u':');
        if (colon <= 0) {
            m_summary->setText(
                tr("<span style='color:%1'>Header line “%2” is not Name: value.</span>")
                    .arg(stateColour(KeyState::Failed).name(), line.toHtmlEscaped()));
            Q_EMIT sent(-1);
            return;
        }
        d.headers.append(
            {line.left(colon).trimmed().toLatin1(), line.mid(colon + 1).trimmed().toUtf8()});
    }
    d.body = m_body->toPlainText().toUtf8();
    const int copies = m_copies->value();
    m_answers->setRowCount(0);
    m_rejected = 0;
    m_send->setEnabled(false);
    m_summary->setText(tr("Sending %1…").arg(countOf(copies, u"copy", u"copies")));
    QPointer<SendDialog> self(this);
    const SendTarget target = m_target;
    m_thread = QThread::create([self, target, e, d, copies] {
        auto result =
            sendTestEvent(target, e, d, copies, [self](int copy, const SentAnswer &answer) {
                QMetaObject::invokeMethod(
                    qApp, // the dialog may be gone: `self` says so on the GUI thread
                    [self, copy, answer] {
                        if (self)
                            self->addAnswer(copy, answer);
                    },
                    Qt::QueuedConnection);
            });
        QMetaObject::invokeMethod(
            qApp,
            [self, result, copies] {
                if (!self)
                    return;
                self->m_thread = nullptr; // it deletes itself when it has finished
                self->m_send->setEnabled(true);
                if (!result) {
                    self->m_summary->setText(tr("<span style='color:%1'>Not sent: %2</span>")
                                                 .arg(stateColour(KeyState::Failed).name(),
                                                      result.error().message.toHtmlEscaped()));
                    Q_EMIT self->sent(-1);
                    return;
                }
                self->m_summary->setText(
                    self->m_rejected
                        ? tr("<span style='color:%1'>%2 of %3 rejected.</span>")
                              .arg(stateColour(KeyState::Failed).name())
                              .arg(self->m_rejected)
                              .arg(countOf(copies, u"delivery", u"deliveries"))
                        : tr("<span style='color:%1'>%2 answered, none rejected.</span>")
                              .arg(stateColour(KeyState::Completed).name(),
                                   countOf(copies, u"delivery", u"deliveries")));
                Q_EMIT self->sent(self->m_rejected);
            },
            Qt::QueuedConnection);
    });
    // Closing the dialog never waits for the network: the thread outlives it if need be.
    connect(m_thread, &QThread::finished, m_thread, &QObject::deleteLater);
    m_thread->start();
}

void SendDialog::addAnswer(int copy, const SentAnswer &a)
{
    m_rejected += a.rejected() ? 1 : 0;
    const int row = m_answers->rowCount();
    m_answers->insertRow(row);
    auto item = [&](int column, const QString &text) {
        auto *cell = new QTableWidgetItem(text);
        if (column == 1 || column == 2)
            cell->setForeground(a.rejected() ? stateColour(KeyState::Failed)
                                : a.outcome == "processed" || a.outcome == "reprocessed"
                                    ? stateColour(KeyState::Completed)
                                    : stateColour(KeyState::Reset));
        m_answers->setItem(row, column, cell);
    };
    item(0, QString::number(copy + 1));
    item(1, a.status ? QString::number(a.status) : tr("none"));
    item(2, QString::fromLatin1(a.outcome));
    item(3, QString::fromLatin1(a.key));
    item(4, a.status ? QString::fromUtf8(a.body.left(500)).simplified() : a.error);
    m_answers->item(row, 4)->setToolTip(plainToolTip(QString::fromUtf8(a.body.left(4000))));
}

} // namespace idem
