// idemdesk send: one test event from a provider's template (or a file), signed as the provider
// signs, at a running receiver; `stripe trigger` for every provider.
#include "cli/common.h"

#include "engine/send.h"
#include "util/crypto.h"
#include "util/format.h"

#include <QFile>

namespace idem::cli {

int send(const QStringList &arguments)
{
    QCommandLineParser parser;
    parser.setApplicationDescription(
        u"Send a test event to a running receiver, signed as the endpoint's provider signs it "
        u"(with the config's "
        "secret; SendGrid: with --sign-key), and print each answer's status and outcome. Exit 1 "
        "when a delivery was "
        "rejected (401, 400, 422, 5xx, no answer); a duplicate's 409 or a replay is not a rejection."_qs);
    addCommonOptions(parser, false);
    parser.addOption({u"endpoint"_qs, u"The endpoint to deliver to (required)."_qs, u"NAME"_qs});
    parser.addOption(
        {u"template"_qs,
         u"The provider's template (default its first; --list-templates shows them)."_qs, u"T"_qs});
    parser.addOption({u"list-templates"_qs, u"Print the endpoint's templates and exit."_qs});
    parser.addOption(
        {u"file"_qs,
         u"Send this file's bytes as the body instead of the template's ('-': stdin)."_qs,
         u"BODY"_qs});
    parser.addOption({u"copies"_qs,
                      u"Send the same delivery N times (duplicates of one event; default 1)."_qs,
                      u"N"_qs, u"1"_qs});
    parser.addOption({u"sign-key"_qs,
                      u"SendGrid: the ECDSA P-256 private key (PEM file) to sign with."_qs,
                      u"PEM"_qs});
    parser.addOption({u"url"_qs, u"The receiver (default http://<config listen>)."_qs, u"URL"_qs});
    if (const int rc = parseOrExit(parser, arguments, 0); rc >= 0)
        return rc;
    bool ok = false;
    const int copies = parser.value(u"copies"_qs).toInt(&ok);
    if (!ok || copies < 1 || copies > 10000) {
        printError(u"--copies must be a number from 1 to 10000"_qs);
        return ExitUsage;
    }
    if (!parser.isSet(u"endpoint"_qs)) {
        printError(u"send needs --endpoint NAME"_qs);
        return ExitUsage;
    }
    auto options = loadCommon(parser);
    if (!options) {
        printError(options.error().message);
        return ExitUsage;
    }
    const EndpointConfig *found = findEndpoint(options->config, parser.value(u"endpoint"_qs));
    if (!found)
        return ExitUsage;
    EndpointConfig endpoint = *found;
    if (parser.isSet(u"list-templates"_qs)) {
        if (const Provider *provider = providerFor(endpoint.provider))
            printOut(provider->templates().join(u'\n') + u'\n');
        return ExitOk;
    }
    if (parser.isSet(u"sign-key"_qs)) {
        QFile pem(parser.value(u"sign-key"_qs));
        if (!pem.open(QIODevice::ReadOnly)) {
            printError(u"--sign-key %1: %2"_qs.arg(pem.fileName(), pem.errorString()));
            return ExitUsage;
        }
        endpoint.privateKey = pem.read(64 * 1024); // a PEM key is a few hundred bytes
        // Only SendGrid signs with a private key, and only with a P-256 one.
        if (endpoint.provider != u"sendgrid"_qs) {
            printError(
                u"--sign-key is for a sendgrid endpoint; %1 is %2 (signed with its secret)"_qs.arg(
                    endpoint.name, endpoint.provider));
            return ExitUsage;
        }
        if (auto ok = checkEcPrivateKey(endpoint.privateKey); !ok) {
            printError(u"--sign-key %1: %2"_qs.arg(pem.fileName(), ok.error().message));
            return ExitUsage;
        }
    }
    std::optional<QByteArray> body;
    if (parser.isSet(u"file"_qs)) {
        QFile file(parser.value(u"file"_qs));
        const bool opened = file.fileName() == u"-"_qs ? file.open(stdin, QIODevice::ReadOnly)
                                                       : file.open(QIODevice::ReadOnly);
        if (!opened) {
            printError(u"--file %1: %2"_qs.arg(file.fileName(), file.errorString()));
            return ExitUsage;
        }
        body = file.readAll();
    }
    const auto address = receiverAddress(parser, options->config);
    if (!address)
        return ExitUsage;
    auto delivery = composeTestEvent(endpoint, parser.value(u"template"_qs), body);
    if (!delivery) {
        printError(delivery.error().message);
        return ExitUsage;
    }
    SendTarget target;
    target.host = address->first;
    target.port = address->second;
    int rejected = 0;
    auto answers =
        sendTestEvent(target, endpoint, *delivery, copies, [&](int copy, const SentAnswer &a) {
            rejected += a.rejected() ? 1 : 0;
            if (!a.status) {
                printOut(u"#%1  no answer: %2\n"_qs.arg(copy + 1).arg(a.error));
                return;
            }
            QString line = u"#%1  %2 %3  key %4"_qs.arg(copy + 1).arg(a.status).arg(
                QString::fromLatin1(a.outcome.isEmpty() ? "-" : a.outcome),
                QString::fromLatin1(a.key.isEmpty() ? "-" : a.key));
            if (a.rejected() && !a.body.isEmpty())
                line += u"  "_qs + QString::fromUtf8(a.body.left(300)).simplified();
            printOut(line + u'\n');
        });
    if (!answers) {
        printError(answers.error().message +
                   (endpoint.provider == u"sendgrid"_qs ? u" (--sign-key PEM)"_qs : QString()));
        return ExitUsage;
    }
    printOut(
        u"sent %1 to http://%2:%3/hooks/%4: %5\n"_qs
            .arg(countOf(copies, u"delivery", u"deliveries"))
            .arg(QString::fromLatin1(target.host))
            .arg(target.port)
            .arg(endpoint.name)
            .arg(rejected ? countOf(rejected, u"rejected", u"rejected") : u"none rejected"_qs));
    return rejected ? ExitRuntime : ExitOk;
}

} // namespace idem::cli
