#include "settingsdialog.h"

#include "colours.h"

#include "store/storefactory.h"
#include "util/format.h"

#include <QApplication>
#include <QComboBox>
#include <QDialogButtonBox>
#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QFormLayout>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QJsonDocument>
#include <QLabel>
#include <QLineEdit>
#include <QMessageBox>
#include <QPointer>
#include <QPushButton>
#include <QSaveFile>
#include <QSettings>
#include <QSpinBox>
#include <QStandardPaths>
#include <QTableWidget>
#include <QThread>
#include <QVBoxLayout>

namespace idem {

namespace {

const QString kHiddenPassword = u"***"_qs;

// A URL in an editable field shows its password as ***; reading the field puts the password
// back unless the operator typed another (or removed it). As text, not QUrl: a Redis Cluster
// URL names several hosts, and the URL is kept as it was written.
QString hidePassword(const QString &url)
{
    return urlPassword(url).isEmpty() ? url : withUrlPassword(url, kHiddenPassword);
}

QString restorePassword(const QString &edited, const QString &original)
{
    const QString password = urlPassword(original);
    if (urlPassword(edited) != kHiddenPassword || password.isEmpty())
        return edited;
    return withUrlPassword(edited, password);
}

} // namespace

QString SettingsDialog::defaultConfigPath()
{
    return QStandardPaths::writableLocation(QStandardPaths::AppConfigLocation) + u"/idemdesk.json"_qs;
}

SettingsDialog::SettingsDialog(Config config, QString storeUrl, QString configPath, QWidget *parent)
    : QDialog(parent), m_config(std::move(config)),
      m_path(configPath.isEmpty() ? defaultConfigPath() : configPath),
      m_listen(new QLineEdit(m_config.listen.toString(), this)), m_storeUrl(storeUrl),
      m_store(new QLineEdit(hidePassword(storeUrl), this)), m_test(new QLabel(this)),
      m_endpoints(new QTableWidget(0, 9, this)), m_status(new QLabel(this))
{
    setWindowTitle(tr("Settings"));
    auto *layout = new QVBoxLayout(this);
    auto *form = new QFormLayout;
    form->addRow(tr("Listen address"), m_listen);
    auto *storeRow = new QHBoxLayout;
    m_store->setPlaceholderText(tr("sqlite:PATH · redis://host:port/db · postgresql://user@host:port/db (empty: the embedded SQLite file)"));
    auto *test = new QPushButton(tr("Test connection"), this);
    storeRow->addWidget(m_store, 1);
    storeRow->addWidget(test);
    form->addRow(tr("Store"), storeRow);
    form->addRow(QString(), m_test);
    layout->addLayout(form);

    m_endpoints->setHorizontalHeaderLabels({tr("Name"), tr("Provider"), tr("Secret"), tr("Forward to"), tr("TTL"),
                                            tr("Lease"), tr("On failed"), tr("On mismatch"), tr("In progress")});
    m_endpoints->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
    m_endpoints->horizontalHeader()->setStretchLastSection(true);
    m_endpoints->verticalHeader()->hide();
    m_endpoints->setSelectionBehavior(QAbstractItemView::SelectRows);
    m_endpoints->setEditTriggers(QAbstractItemView::NoEditTriggers);
    layout->addWidget(new QLabel(tr("<b>Endpoints</b> (webhooks arrive at /hooks/&lt;name&gt;)"), this));
    layout->addWidget(m_endpoints, 1);
    auto *buttons = new QHBoxLayout;
    auto *add = new QPushButton(tr("Add…"), this);
    auto *edit = new QPushButton(tr("Edit…"), this);
    auto *remove = new QPushButton(tr("Remove"), this);
    buttons->addWidget(add);
    buttons->addWidget(edit);
    buttons->addWidget(remove);
    buttons->addStretch();
    layout->addLayout(buttons);
    m_status->setWordWrap(true);
    m_status->setText(tr("Saved to %1; the desk uses it from its next start.").arg(m_path));
    layout->addWidget(m_status);
    auto *box = new QDialogButtonBox(QDialogButtonBox::Save | QDialogButtonBox::Cancel, this);
    layout->addWidget(box);

    connect(test, &QPushButton::clicked, this, &SettingsDialog::testConnection);
    connect(add, &QPushButton::clicked, this, [this] { editEndpoint(-1); });
    connect(edit, &QPushButton::clicked, this, [this] { editEndpoint(m_endpoints->currentRow()); });
    connect(m_endpoints, &QTableWidget::cellDoubleClicked, this, [this](int row, int) { editEndpoint(row); });
    connect(remove, &QPushButton::clicked, this, [this] {
        const int row = m_endpoints->currentRow();
        if (row >= 0 && row < m_config.endpoints.size()) {
            m_config.endpoints.removeAt(row);
            fillEndpoints();
        }
    });
    connect(box, &QDialogButtonBox::accepted, this, [this] {
        if (save())
            accept();
    });
    connect(box, &QDialogButtonBox::rejected, this, &QDialog::reject);
    fillEndpoints();
    resize(900, 520);
}

SettingsDialog::~SettingsDialog() = default; // a connection test's thread outlives the dialog

void SettingsDialog::fillEndpoints()
{
    m_endpoints->setRowCount(int(m_config.endpoints.size()));
    for (int row = 0; row < m_config.endpoints.size(); ++row) {
        const EndpointConfig &e = m_config.endpoints.at(row);
        const QString secret = !e.secrets.isEmpty() ? maskSecret(e.secrets.first()) + (e.secrets.size() > 1 ? tr(" (+%1)").arg(e.secrets.size() - 1) : QString())
                               : !e.publicKeys.isEmpty() ? tr("public key") : tr("none: not verified");
        const QStringList cells{
            e.name,
            e.provider,
            secret,
            e.forwardTo.isEmpty() ? tr("built-in processor") : displayUrl(e.forwardTo),
            formatDuration(e.settings.ttlSeconds * 1000),
            formatDuration(e.settings.leaseSeconds * 1000),
            e.settings.onFailed == OnFailed::Reject ? u"reject"_qs : u"reprocess"_qs,
            e.settings.onMismatch == OnMismatch::Ignore ? u"ignore"_qs : u"reject"_qs,
            QString::number(e.settings.inProgressStatus)};
        for (int col = 0; col < cells.size(); ++col)
            m_endpoints->setItem(row, col, new QTableWidgetItem(cells[col]));
    }
}

void SettingsDialog::editEndpoint(int row)
{
    EndpointConfig e = row >= 0 && row < m_config.endpoints.size() ? m_config.endpoints.at(row) : EndpointConfig{};
    if (row < 0) {
        e.provider = u"generic"_qs;
        e.settings = m_config.defaults;
        e.signatureHeader = "X-Signature-256";
    }
    QDialog dialog(this);
    dialog.setWindowTitle(row < 0 ? tr("New endpoint") : tr("Endpoint %1").arg(e.name));
    auto *form = new QFormLayout(&dialog);
    auto *name = new QLineEdit(e.name, &dialog);
    auto *provider = new QComboBox(&dialog);
    provider->addItems(builtinProviders());
    provider->setCurrentText(e.provider);
    auto *secret = new QLineEdit(e.secrets.value(0), &dialog);
    secret->setEchoMode(QLineEdit::Password);
    secret->setPlaceholderText(tr("signing secret (empty: signatures are not verified)"));
    auto *forward = new QLineEdit(hidePassword(e.forwardTo.toString()), &dialog);
    forward->setPlaceholderText(tr("http://127.0.0.1:3000/webhooks (empty: the built-in processor)"));
    auto *ttl = new QSpinBox(&dialog);
    ttl->setRange(1, 3650 * 24);
    ttl->setSuffix(tr(" h"));
    ttl->setValue(int(std::max<qint64>(1, e.settings.ttlSeconds / 3600)));
    auto *lease = new QSpinBox(&dialog);
    lease->setRange(1, 24 * 3600);
    lease->setSuffix(tr(" s"));
    lease->setValue(int(e.settings.leaseSeconds));
    auto *onFailed = new QComboBox(&dialog);
    onFailed->addItems({u"reprocess"_qs, u"reject"_qs});
    onFailed->setCurrentIndex(e.settings.onFailed == OnFailed::Reject ? 1 : 0);
    auto *onMismatch = new QComboBox(&dialog);
    onMismatch->addItems({u"reject"_qs, u"ignore"_qs});
    onMismatch->setCurrentIndex(e.settings.onMismatch == OnMismatch::Ignore ? 1 : 0);
    auto *inProgress = new QComboBox(&dialog);
    inProgress->addItems({u"409"_qs, u"202"_qs, u"429"_qs, u"503"_qs});
    inProgress->setCurrentText(QString::number(e.settings.inProgressStatus));
    form->addRow(tr("Name"), name);
    form->addRow(tr("Provider"), provider);
    form->addRow(tr("Secret"), secret);
    form->addRow(tr("Forward to"), forward);
    form->addRow(tr("TTL"), ttl);
    form->addRow(tr("Lease"), lease);
    form->addRow(tr("On failed"), onFailed);
    form->addRow(tr("On mismatch"), onMismatch);
    form->addRow(tr("In-progress status"), inProgress);
    auto *error = new QLabel(&dialog);
    error->setStyleSheet(u"color:%1"_qs.arg(stateColour(KeyState::Failed).name()));
    error->setWordWrap(true);
    form->addRow(error);
    auto *box = new QDialogButtonBox(QDialogButtonBox::Ok | QDialogButtonBox::Cancel, &dialog);
    form->addRow(box);
    connect(box, &QDialogButtonBox::rejected, &dialog, &QDialog::reject);
    connect(box, &QDialogButtonBox::accepted, &dialog, [&] {
        EndpointConfig changed = e;
        changed.name = name->text().trimmed();
        changed.provider = provider->currentText();
        if (!secret->text().isEmpty())
            changed.secrets = QStringList{secret->text()} + e.secrets.mid(1);
        else
            changed.secrets.clear();
        changed.forwardTo =
            QUrl(restorePassword(forward->text().trimmed(), e.forwardTo.toString()));
        changed.settings.ttlSeconds = qint64(ttl->value()) * 3600;
        changed.settings.leaseSeconds = lease->value();
        changed.settings.onFailed = onFailed->currentIndex() ? OnFailed::Reject : OnFailed::Reprocess;
        changed.settings.onMismatch = onMismatch->currentIndex() ? OnMismatch::Ignore : OnMismatch::Reject;
        changed.settings.inProgressStatus = inProgress->currentText().toInt();
        Config candidate = m_config;
        if (row >= 0)
            candidate.endpoints[row] = changed;
        else
            candidate.endpoints.append(changed);
        // Validated exactly like a config file.
        auto parsed = Config::parse(QJsonDocument(candidate.toJson()).toJson(), tr("endpoint"));
        if (!parsed) {
            error->setText(parsed.error().message);
            return;
        }
        m_config.endpoints = parsed->endpoints;
        dialog.accept();
    });
    if (dialog.exec() == QDialog::Accepted)
        fillEndpoints();
}

Result<Config> SettingsDialog::edited() const
{
    Config c = m_config;
    c.store = storeUrl();
    auto listen = ListenAddress::parse(m_listen->text().trimmed());
    if (!listen)
        return makeError(ErrorCode::Invalid, tr("Listen address: %1").arg(listen.error().message));
    c.listen = *listen;
    if (auto url = StoreUrl::parse(c.store); !url)
        return url.error();
    return Config::parse(QJsonDocument(c.toJson()).toJson(), m_path);
}

bool SettingsDialog::save()
{
    auto config = edited();
    if (!config) {
        m_status->setText(u"<span style='color:%1'>%2</span>"_qs.arg(
            stateColour(KeyState::Failed).name(), config.error().message.toHtmlEscaped()));
        return false;
    }
    QDir().mkpath(QFileInfo(m_path).absolutePath());
    QSaveFile file(m_path);
    if (!file.open(QIODevice::WriteOnly)) {
        m_status->setText(tr("Cannot write %1: %2").arg(m_path, file.errorString()));
        return false;
    }
    file.write(QJsonDocument(config->toJson()).toJson(QJsonDocument::Indented));
    // Secrets live in this file: only its owner may read it.
    file.setPermissions(QFileDevice::ReadOwner | QFileDevice::WriteOwner);
    if (!file.commit()) {
        m_status->setText(tr("Cannot write %1: %2").arg(m_path, file.errorString()));
        return false;
    }
    QSettings().setValue(u"configPath"_qs, m_path);
    m_status->setText(tr("Saved to %1; the desk uses it from its next start.").arg(m_path));
    return true;
}

void SettingsDialog::testConnection()
{
    if (m_tester)
        return;
    const QString url = storeUrl();
    m_test->setText(tr("Connecting…"));
    QPointer<SettingsDialog> self(this);
    // Connecting may take the store's whole timeout: never on the GUI thread.
    m_tester = QThread::create([self, url] {
        auto pool = openStorePool(url, 1);
        const bool ok = pool.ok();
        const QString message = ok ? tr("Connected to %1.").arg(StoreUrl::parse(url)->display()) : pool.error().message;
        QMetaObject::invokeMethod(
            qApp, // the dialog may be gone: `self` says so on the GUI thread
            [self, ok, message] {
                if (!self)
                    return;
                self->m_tester = nullptr; // it deletes itself when it has finished
                self->m_test->setText(u"<span style='color:%1'>%2</span>"_qs.arg(
                    stateColour(ok ? KeyState::Completed : KeyState::Failed).name(),
                    message.toHtmlEscaped()));
                Q_EMIT self->connectionTested(ok);
            },
            Qt::QueuedConnection);
    });
    // Closing the dialog never waits for the store's connect timeout.
    connect(m_tester, &QThread::finished, m_tester, &QObject::deleteLater);
    m_tester->start();
}

QString SettingsDialog::storeUrl() const
{
    return restorePassword(m_store->text().trimmed(), m_storeUrl);
}

QString SettingsDialog::testResult() const
{
    return m_test->text();
}

std::shared_ptr<StorePool> openStoreOrAsk(Config &config, QString &storeUrl, QString &configPath)
{
    for (;;) {
        auto pool = openStorePool(storeUrl);
        if (pool)
            return *pool;
        // As the command line's printError: one line, nothing a terminal would act on.
        std::fprintf(stderr, "idemdesk: %s\n",
                     escapeControls(pool.error().message, true).toUtf8().constData());
        QMessageBox box(
            QMessageBox::Critical, u"Idempotency Desk"_qs,
            QObject::tr("The store cannot be reached:\n%1\n\nStart it and try again, or choose "
                        "another store in the settings.")
                .arg(pool.error().message));
        QPushButton *again = box.addButton(QObject::tr("Try Again"), QMessageBox::AcceptRole);
        QPushButton *settings = box.addButton(QObject::tr("Settings…"), QMessageBox::ActionRole);
        box.addButton(QObject::tr("Quit"), QMessageBox::RejectRole);
        box.setDefaultButton(again);
        box.exec();
        if (box.clickedButton() == settings) {
            SettingsDialog dialog(config, storeUrl, configPath);
            if (dialog.exec() == QDialog::Accepted) // saved
                if (auto edited = dialog.edited()) {
                    config = *edited;
                    storeUrl = edited->store;
                    configPath = dialog.configPath();
                }
        } else if (box.clickedButton() != again) {
            return nullptr;
        }
    }
}

} // namespace idem
