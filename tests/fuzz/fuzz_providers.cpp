// Every provider's signature check, key extraction and event type on arbitrary headers and
// bodies; the event type's JSON reader against QJsonDocument's on every body that parses.
// Input: one byte choosing the provider, then "name: value" lines, a blank line, the body.
#include "providers/provider.h"
#include "util/rawjson.h"

#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>

#include <cstddef>
#include <cstdint>
#include <cstdlib>

namespace {
idem::EndpointConfig endpoint(const QString &provider)
{
    idem::EndpointConfig e;
    e.name = provider;
    e.provider = provider;
    e.secrets = {provider == u"standard"_qs ? QStringLiteral("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw") : QStringLiteral("whsec_fuzz_secret")};
    e.signatureHeader = "X-Signature-256";
    e.key.jsonPointer = QStringLiteral("/a/0/~1b");
    e.key.composite = {QStringLiteral("/type"), QStringLiteral("/data/id")};
    if (provider == u"sendgrid"_qs)
        e.publicKeys = {"MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE83T4O/n84iotIvIW4mdBgQ/7dAfSmpqIM8kF9mN1flpVKS3GRqe62gw+2fNNRaINXvVpiglSI8eNEc6wEA3F+g=="};
    return e;
}

// A batch's elements are its own, as sent, and their canonical forms mean the same: each read
// alone is the object QJsonDocument reads at its place in the whole.
void checkElements(const QByteArray &body, const QList<idem::BatchElement> &elements)
{
    const QJsonArray whole = QJsonDocument::fromJson(body).array();
    const auto objects = idem::rawJsonObjects(body);
    if (!objects || whole.size() != elements.size() || objects->size() != elements.size())
        abort();
    for (qsizetype i = 0; i < elements.size(); ++i) {
        const QJsonObject sent = QJsonDocument::fromJson(elements.at(i).raw).object();
        const QJsonObject canonical = QJsonDocument::fromJson(objects->at(i).canonical).object();
        if (elements.at(i).raw != objects->at(i).raw || sent != whole.at(i).toObject() ||
            canonical != sent)
            abort();
    }
}

// What the desk keeps of an event type: printable ASCII, bounded.
void checkType(const QString &type)
{
    if (type.size() > idem::kMaxEventTypeChars)
        abort();
    for (const QChar c : type)
        if (c.unicode() < 0x20 || c.unicode() > 0x7e)
            abort();
}

// jsonValueAt reads a string where QJsonDocument's tree has that string, and nothing where
// the tree has nothing.
void checkPointer(const QByteArray &body, const QJsonDocument &doc, const QString &pointer)
{
    const QJsonValue root = doc.isArray() ? QJsonValue(doc.array()) : QJsonValue(doc.object());
    const auto tree = idem::resolvePointer(root, pointer);
    const auto raw = idem::jsonValueAt(body, pointer);
    if (tree.has_value() != raw.has_value())
        abort();
    if (tree && tree->isString() && idem::jsonScalarText(*raw) != tree->toString())
        abort();
}
} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    static const QStringList providers = idem::builtinProviders();
    const QString provider = providers.at(data[0] % providers.size());
    const QByteArray rest(reinterpret_cast<const char *>(data + 1), qsizetype(size - 1));
    idem::HttpRequest request;
    const qsizetype split = rest.indexOf("\n\n");
    const QByteArray head = split < 0 ? rest : rest.left(split);
    request.body = split < 0 ? QByteArray() : rest.mid(split + 2);
    for (const QByteArray &line : head.split('\n')) {
        const qsizetype colon = line.indexOf(':');
        if (colon > 0)
            request.headers.append({line.left(colon), line.mid(colon + 1).trimmed()});
    }
    static const idem::EndpointConfig endpoints[] = {endpoint(providers[0]), endpoint(providers[1]), endpoint(providers[2]),
                                                     endpoint(providers[3]), endpoint(providers[4]), endpoint(providers[5]),
                                                     endpoint(providers[6])};
    const idem::EndpointConfig &e = endpoints[data[0] % providers.size()];
    const idem::Provider *p = idem::providerFor(provider);
    (void)p->verify(request, e, 1'700'000'000);
    const idem::KeyExtraction key = p->extractKey(request, e);
    if (key.kind == idem::KeyExtraction::Kind::Found)
        (void)idem::namespacedKey(e.name, key.key);
    if (p->isBatch())
        if (const auto elements = p->splitBatch(request, e.settings.maxBatchElements)) {
            checkElements(request.body, *elements);
            for (const idem::BatchElement &element : *elements)
                checkType(p->elementType(element.raw));
        }
    (void)p->directAnswer(request);
    (void)p->note(request);
    checkType(p->eventType(request, e));
    QJsonParseError error;
    const QJsonDocument doc = QJsonDocument::fromJson(request.body, &error);
    if (error.error == QJsonParseError::NoError)
        for (const QString &pointer : {QStringLiteral("/type"), QStringLiteral("/event/type"),
                                       QStringLiteral("/0/event"), QStringLiteral("/a/0/~1b")})
            checkPointer(request.body, doc, pointer);
    return 0;
}
