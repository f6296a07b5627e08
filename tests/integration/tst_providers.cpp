// Every provider of docs/providers.md: signed the way the sender signs (signatures computed by the
// openssl command line, independently of the code under test), keyed and deduplicated.
#include "engine/send.h"
#include "engine/stats.h"
#include "http/blockingclient.h"
#include "providers/provider.h"
#include "receiver/receiver.h"
#include "store/storefactory.h"
#include "support/downstream.h"
#include "support/names.h"
#include "util/clock.h"

#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QProcess>
#include <QTemporaryDir>
#include <QTest>

#include <limits>

using namespace idem;
using namespace idem::test;

namespace {

QByteArray openssl(const QStringList &args, const QByteArray &input)
{
    QProcess p;
    p.start(QStringLiteral("openssl"), args);
    p.write(input);
    p.closeWriteChannel();
    p.waitForFinished(20000);
    if (p.exitCode() != 0)
        qFatal("openssl %s failed: %s", qPrintable(args.join(u' ')), p.readAllStandardError().constData());
    return p.readAllStandardOutput();
}

// HMAC-SHA256 by `openssl dgst`, hex. `hexKey` for binary keys (Standard Webhooks).
QByteArray hmacHex(const QByteArray &key, const QByteArray &data, bool hexKey = false)
{
    const QByteArray out = openssl({u"dgst"_qs, u"-sha256"_qs, u"-mac"_qs, u"HMAC"_qs, u"-macopt"_qs,
                                    (hexKey ? u"hexkey:"_qs : u"key:"_qs) + QString::fromLatin1(key)},
                                   data);
    return out.mid(out.lastIndexOf("= ") + 2).trimmed();
}

const QByteArray kStripeSecret = "whsec_test_5f2b8c1e9a";
const QByteArray kStripeRotated = "whsec_rotated_77aa01";
const QByteArray kGithubSecret = "It's a Secret to Everybody";
const QByteArray kShopifySecret = "shpss_3c1d5e7f9a";
const QByteArray kSlackSecret = "8f742231b10e8888abcd99yyyzzz85a5";
const QByteArray kStandardSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const QByteArray kStandardRotated = "whsec_cm90YXRlZC1zZWNyZXQtZm9yLXRlc3Rz";

struct Signed
{
    HeaderList headers;
    QByteArray body;
};

} // namespace

class TestProviders : public QObject
{
    Q_OBJECT
    QTemporaryDir m_dir;
    CountingDownstream m_down;
    std::shared_ptr<StorePool> m_pool;
    std::unique_ptr<Receiver> m_receiver;
    quint16 m_port = 0;
    QByteArray m_sgPrivate, m_sgPublic, m_sgRotatedPrivate, m_sgRotatedPublic;
    int m_seq = 0;

    QString pemFile(const QByteArray &pem)
    {
        const QString path = m_dir.filePath(u"k%1.pem"_qs.arg(++m_seq));
        QFile f(path);
        f.open(QIODevice::WriteOnly);
        f.write(pem);
        return path;
    }

    // The delivery `provider` would send for event `id`, signed with `secret` at `t`.
    Signed make(const QString &provider, const QByteArray &id, const QByteArray &secret, qint64 t)
    {
        Signed s;
        const QByteArray ts = QByteArray::number(t);
        if (provider == u"stripe"_qs) {
            s.body = "{\"id\":\"" + id + "\",\"object\":\"event\",\"type\":\"charge.succeeded\"}";
            s.headers = {{"Stripe-Signature", "t=" + ts + ",v1=" + hmacHex(secret, ts + "." + s.body) + ",v0=deadbeef"}};
        } else if (provider == u"github"_qs) {
            s.body = "{\"action\":\"opened\",\"n\":\"" + id + "\"}";
            s.headers = {{"X-GitHub-Event", "issues"}, {"X-GitHub-Hook-ID", "99"}, {"X-GitHub-Delivery", id},
                         {"X-Hub-Signature-256", "sha256=" + hmacHex(secret, s.body)}};
        } else if (provider == u"shopify"_qs) {
            s.body = "{\"id\":1,\"n\":\"" + id + "\"}";
            s.headers = {{"X-Shopify-Webhook-Id", id}, {"X-Shopify-Event-Id", "ev-" + id},
                         {"X-Shopify-Hmac-Sha256", QByteArray::fromHex(hmacHex(secret, s.body)).toBase64()}};
        } else if (provider == u"slack"_qs) {
            s.body = "{\"type\":\"event_callback\",\"event_id\":\"" + id + "\"}";
            s.headers = {{"X-Slack-Request-Timestamp", ts},
                         {"X-Slack-Signature", "v0=" + hmacHex(secret, "v0:" + ts + ":" + s.body)}};
        } else if (provider == u"standard"_qs) {
            s.body = "{\"type\":\"invoice.paid\",\"n\":\"" + id + "\"}";
            const QByteArray key = QByteArray::fromBase64(secret.mid(6)).toHex();
            const QByteArray sig = QByteArray::fromHex(hmacHex(key, id + "." + ts + "." + s.body, true)).toBase64();
            s.headers = {{"webhook-id", id}, {"webhook-timestamp", ts}, {"webhook-signature", "v1a,AAAA v1," + sig}};
        } else { // sendgrid: `secret` is the PEM private key
            s.body = "[{\"email\":\"a@example.com\",\"event\":\"delivered\",\"sg_event_id\":\"" + id + "\",\"timestamp\":" + ts + "}]";
            const QByteArray der = openssl({u"dgst"_qs, u"-sha256"_qs, u"-sign"_qs, pemFile(secret)}, ts + s.body);
            s.headers = {{"X-Twilio-Email-Event-Webhook-Timestamp", ts},
                         {"X-Twilio-Email-Event-Webhook-Signature", der.toBase64()}};
        }
        s.headers.append({QByteArray("Content-Type"), QByteArray("application/json")});
        return s;
    }
    QByteArray secretOf(const QString &provider, bool rotated = false) const
    {
        if (provider == u"stripe"_qs) return rotated ? kStripeRotated : kStripeSecret;
        if (provider == u"github"_qs) return kGithubSecret;
        if (provider == u"shopify"_qs) return kShopifySecret;
        if (provider == u"slack"_qs) return kSlackSecret;
        if (provider == u"standard"_qs) return rotated ? kStandardRotated : kStandardSecret;
        return rotated ? m_sgRotatedPrivate : m_sgPrivate;
    }
    ClientResponse send(const QString &endpoint, const Signed &s)
    {
        return post(m_port, "/hooks/" + endpoint.toUtf8(), s.body, s.headers);
    }
    qint64 storedKeys(const QString &endpoint)
    {
        return m_pool->run<StateCounts>([&](IdempotencyStore &st) { return st.countKeys(endpoint); })->total();
    }

private Q_SLOTS:
    void initTestCase()
    {
        m_sgPrivate = openssl({u"genpkey"_qs, u"-algorithm"_qs, u"EC"_qs, u"-pkeyopt"_qs, u"ec_paramgen_curve:P-256"_qs}, {});
        m_sgPublic = openssl({u"pkey"_qs, u"-pubout"_qs}, m_sgPrivate);
        m_sgRotatedPrivate = openssl({u"genpkey"_qs, u"-algorithm"_qs, u"EC"_qs, u"-pkeyopt"_qs, u"ec_paramgen_curve:P-256"_qs}, {});
        // SendGrid shows its key as base64 DER, without PEM armour: accept that form too.
        m_sgRotatedPublic = openssl({u"pkey"_qs, u"-pubout"_qs, u"-outform"_qs, u"DER"_qs}, m_sgRotatedPrivate).toBase64();
        const QByteArray forward = m_down.url().toString().toUtf8();
        auto jsonString = [](const QByteArray &v) { return QJsonDocument(QJsonArray{QString::fromUtf8(v)}).toJson(QJsonDocument::Compact).mid(1).chopped(1); };
        const QByteArray config =
            "{\"endpoints\": ["
            "{\"name\": \"stripe\", \"provider\": \"stripe\", \"secret\": [" + jsonString(kStripeSecret) + "," + jsonString(kStripeRotated) + "], \"forward_to\": \"" + forward + "\"},"
            "{\"name\": \"github\", \"provider\": \"github\", \"secret\": " + jsonString(kGithubSecret) + ", \"forward_to\": \"" + forward + "\"},"
            "{\"name\": \"shopify\", \"provider\": \"shopify\", \"secret\": " + jsonString(kShopifySecret) + ", \"forward_to\": \"" + forward + "\"},"
            "{\"name\": \"slack\", \"provider\": \"slack\", \"secret\": " + jsonString(kSlackSecret) + ", \"forward_to\": \"" + forward + "\"},"
            "{\"name\": \"standard\", \"provider\": \"standard\", \"secret\": [" + jsonString(kStandardSecret) + "," + jsonString(kStandardRotated) + "], \"forward_to\": \"" + forward + "\"},"
            "{\"name\": \"sendgrid\", \"provider\": \"sendgrid\", \"public_key\": [" + jsonString(m_sgPublic) + "," + jsonString(m_sgRotatedPublic) + "], \"forward_to\": \"" + forward + "\"},"
            "{\"name\": \"fixtures\", \"provider\": \"stripe\", \"secret\": " + jsonString(kStripeSecret) + ", \"signature_tolerance_seconds\": 0},"
            "{\"name\": \"githubbody\", \"provider\": \"github\", \"secret\": " + jsonString(kGithubSecret) + ", \"key\": {\"composite\": [\"\"]}, \"forward_to\": \"" + forward + "\"},"
            "{\"name\": \"shopifybody\", \"provider\": \"shopify\", \"secret\": " + jsonString(kShopifySecret) + ", \"key\": {\"json_pointer\": \"/id\"}, \"forward_to\": \"" + forward + "\"}"
            "]}";
        auto parsed = Config::parse(config, u"providers.json"_qs);
        QVERIFY2(parsed.ok(), parsed.ok() ? "" : qPrintable(parsed.error().message));
        m_pool = *openStorePool(u"sqlite:"_qs + m_dir.filePath(u"p.db"_qs));
        m_receiver = std::make_unique<Receiver>(*parsed, m_pool);
        ListenAddress any;
        any.port = 0;
        m_port = m_receiver->start(any)->port;
    }

    void stripeTemplateInStripesOrder()
    {
        // `send`'s Stripe event reads like Stripe's own: id first, then object, … type last.
        EndpointConfig stripe;
        stripe.name = u"s"_qs;
        stripe.provider = u"stripe"_qs;
        auto d = composeTestEvent(stripe, {}, std::nullopt);
        QVERIFY(d.ok());
        QVERIFY2(d->body.startsWith("{\n  \"id\": \"evt_test_"), d->body.constData());
        QVERIFY(d->body.indexOf("\"object\": \"event\"") < d->body.indexOf("\"type\""));
        const QJsonObject o = QJsonDocument::fromJson(d->body).object();
        QCOMPARE(o.value(u"type"_qs).toString(), u"payment_intent.succeeded"_qs);
        QCOMPARE(o.value(u"data"_qs)
                     .toObject()
                     .value(u"object"_qs)
                     .toObject()
                     .value(u"amount"_qs)
                     .toInt(),
                 4200);
    }

    void githubPublishedVector()
    {
        // From GitHub's "Validating webhook deliveries".
        EndpointConfig e;
        e.secrets = {QString::fromUtf8(kGithubSecret)};
        HttpRequest r;
        r.body = "Hello, World!";
        r.headers = {{"X-Hub-Signature-256", "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"}};
        QVERIFY(providerFor(u"github")->verify(r, e, 0).ok());
        r.body = "Hello, World?";
        QVERIFY(!providerFor(u"github")->verify(r, e, 0).ok());
    }

    void signedDeliveries_data()
    {
        QTest::addColumn<QString>("provider");
        QTest::addColumn<QByteArray>("expectedKeyPrefix");
        QTest::addColumn<bool>("timestamped");
        QTest::newRow("stripe") << u"stripe"_qs << QByteArray("stripe:") << true;
        QTest::newRow("github") << u"github"_qs << QByteArray("github:hook-99/") << false;
        QTest::newRow("shopify") << u"shopify"_qs << QByteArray("shopify:") << false;
        QTest::newRow("slack") << u"slack"_qs << QByteArray("slack:") << true;
        QTest::newRow("standard") << u"standard"_qs << QByteArray("standard:") << true;
        QTest::newRow("sendgrid") << u"sendgrid"_qs << QByteArray("sendgrid:") << true;
    }
    void signedDeliveries()
    {
        QFETCH(QString, provider);
        QFETCH(QByteArray, expectedKeyPrefix);
        QFETCH(bool, timestamped);
        const qint64 now = wallMs() / 1000;
        const QByteArray id = "evt_" + provider.toUtf8() + "_1";
        const int forwardedBefore = m_down.total();

        // A valid delivery is processed once; its duplicate is replayed.
        const Signed valid = make(provider, id, secretOf(provider), now);
        ClientResponse r = send(provider, valid);
        QVERIFY2(r.status == 200, r.body.constData());
        QCOMPARE(r.header("Idempotency-Outcome"), QByteArray("processed"));
        QCOMPARE(r.header("Idempotency-Key"), expectedKeyPrefix + id);
        r = send(provider, valid);
        QCOMPARE(r.status, 200);
        QCOMPARE(r.header("Idempotency-Outcome"), QByteArray("replayed"));
        QCOMPARE(m_down.total(), forwardedBefore + 1);
        const qint64 keys = storedKeys(provider);
        QCOMPARE(keys, 1);

        // Each broken delivery: 401, which check failed, nothing stored.
        auto refused = [&](const Signed &s, const char *expectedDetail) {
            const ClientResponse answer = send(provider, s);
            QCOMPARE(answer.status, 401);
            QCOMPARE(answer.header("Idempotency-Outcome"), QByteArray("rejected"));
            const QString detail = QJsonDocument::fromJson(answer.body).object().value(u"detail").toString();
            QVERIFY2(detail.contains(QLatin1String(expectedDetail)), qPrintable(detail));
            for (const auto &[name, value] : valid.headers) // never the expected signature
                if (value.size() > 20)
                    QVERIFY(!answer.body.contains(value));
            QCOMPARE(storedKeys(provider), keys);
        };
        Signed tampered = make(provider, "evt_tampered", secretOf(provider), now);
        tampered.body.replace("evt_tampered", "evt_tampereD");
        refused(tampered, provider == u"sendgrid"_qs ? "does not verify" : "match");
        const QByteArray wrong = provider == u"sendgrid"_qs ? openssl({u"genpkey"_qs, u"-algorithm"_qs, u"EC"_qs, u"-pkeyopt"_qs, u"ec_paramgen_curve:P-256"_qs}, {})
                                                            : provider == u"standard"_qs ? QByteArray("whsec_d3Jvbmctc2VjcmV0LXZhbHVl") : QByteArray("wrong-secret");
        refused(make(provider, "evt_wrong", wrong, now), provider == u"sendgrid"_qs ? "does not verify" : "match");
        Signed unsigned_ = make(provider, "evt_unsigned", secretOf(provider), now);
        unsigned_.headers.removeIf([](const auto &h) {
            return h.first.toLower().contains("signature") || h.first.toLower().contains("hmac");
        });
        refused(unsigned_, "missing");
        if (timestamped) {
            refused(make(provider, "evt_stale", secretOf(provider), now - 1000), "old");
            refused(make(provider, "evt_future", secretOf(provider), now + 1000), "future");
            // Validly signed timestamps at the ends of 64 bits: refused, and on the right side
            // (now - t used to overflow, which is undefined, before anything bounded t).
            constexpr qint64 lowest = std::numeric_limits<qint64>::min(), highest = std::numeric_limits<qint64>::max();
            refused(make(provider, "evt_lowest", secretOf(provider), lowest), "old");
            refused(make(provider, "evt_wraps", secretOf(provider), lowest + now - 100), "old");
            refused(make(provider, "evt_highest", secretOf(provider), highest), "future");
            refused(make(provider, "evt_high", secretOf(provider), highest - 5), "future");
        }

        // During a rotation any configured secret verifies.
        if (provider == u"stripe"_qs || provider == u"standard"_qs || provider == u"sendgrid"_qs) {
            r = send(provider, make(provider, "evt_rotated", secretOf(provider, true), now));
            QVERIFY2(r.status == 200, r.body.constData());
            QCOMPARE(r.header("Idempotency-Outcome"), QByteArray("processed"));
        }
    }

    // GitHub's and Shopify's id headers are outside their signature: a captured body sent again
    // under a fresh id is a new event to an endpoint keyed by the header (the limit that
    // docs/security.md states), and a duplicate to one keyed by the signed body.
    void aSignedBodyUnderAFreshIdIsADuplicateWhenKeyedByTheBody_data()
    {
        QTest::addColumn<QString>("provider");
        QTest::newRow("github") << u"github"_qs;
        QTest::newRow("shopify") << u"shopify"_qs;
    }
    void aSignedBodyUnderAFreshIdIsADuplicateWhenKeyedByTheBody()
    {
        QFETCH(QString, provider);
        const Signed captured = make(provider, "evt_captured", secretOf(provider), wallMs() / 1000);
        Signed resent = captured;
        for (auto &[name, value] : resent.headers)
            if (name == "X-GitHub-Delivery" || name == "X-Shopify-Webhook-Id")
                value = "a-fresh-id";
        const int before = m_down.total();
        QCOMPARE(send(provider, captured).header("Idempotency-Outcome"), QByteArray("processed"));
        QCOMPARE(send(provider, resent).header("Idempotency-Outcome"), QByteArray("processed"));
        QCOMPARE(m_down.total(), before + 2);

        const QString byBody = provider + u"body"_qs;
        QCOMPARE(send(byBody, captured).header("Idempotency-Outcome"), QByteArray("processed"));
        const ClientResponse again = send(byBody, resent);
        QCOMPARE(again.status, 200);
        QCOMPARE(again.header("Idempotency-Outcome"), QByteArray("replayed"));
        QCOMPARE(m_down.total(), before + 3);
        // A body that differs is another event, whatever its id header says.
        Signed other = make(provider, "evt_other", secretOf(provider), wallMs() / 1000);
        if (provider == u"shopify"_qs) { // keyed by the resource's /id: another order
            other.body.replace("{\"id\":1,", "{\"id\":2,");
            setHeader(other.headers, "X-Shopify-Hmac-Sha256",
                      QByteArray::fromHex(hmacHex(secretOf(provider), other.body)).toBase64());
        }
        for (auto &[name, value] : other.headers)
            if (name == "X-GitHub-Delivery" || name == "X-Shopify-Webhook-Id")
                value = "a-fresh-id";
        QCOMPARE(send(byBody, other).header("Idempotency-Outcome"), QByteArray("processed"));
    }

    // Send test event and storms put each event's id where the endpoint reads its key: in the
    // body when it is keyed by the body.
    void samplesCarryTheirIdWhereTheBodyKeyIsRead_data()
    {
        QTest::addColumn<QString>("provider");
        QTest::addColumn<QString>("spec");
        QTest::newRow("github, whole body") << u"github"_qs << QString();
        QTest::newRow("github, pointer") << u"github"_qs << u"/after"_qs;
        QTest::newRow("shopify, pointer") << u"shopify"_qs << u"/id"_qs;
    }
    void samplesCarryTheirIdWhereTheBodyKeyIsRead()
    {
        QFETCH(QString, provider);
        QFETCH(QString, spec);
        EndpointConfig e;
        e.name = provider;
        e.provider = provider;
        e.secrets = {u"s"_qs};
        if (spec.isEmpty())
            e.key.composite = {QString()};
        else
            e.key.jsonPointer = spec;
        const Provider *p = providerFor(provider);
        // The key the event `id` is delivered under, empty if it is not signed or has none.
        auto keyOf = [&](const QString &id) {
            const OutgoingDelivery d = p->makeDelivery(e, id, 1'700'000'000);
            HttpRequest r;
            r.headers = d.headers;
            r.body = d.body;
            const KeyExtraction k = p->extractKey(r, e);
            return p->verify(r, e, 1'700'000'000).ok() && k.kind == KeyExtraction::Kind::Found
                       ? k.key
                       : QString();
        };
        const QString one = keyOf(u"one"_qs);
        QVERIFY(!one.isEmpty());
        QVERIFY(keyOf(u"two"_qs) != one);
        QCOMPARE(keyOf(u"one"_qs), one);
        if (!spec.isEmpty())
            QCOMPARE(one, u"one"_qs);
    }

    void capturedFixturesReplayWithoutTheTimestampCheck()
    {
        // signature_tolerance_seconds: 0 accepts an old capture; its signature is still checked.
        Signed old = make(u"stripe"_qs, "evt_fixture", kStripeSecret, 1600000000);
        QCOMPARE(send(u"fixtures"_qs, old).status, 200);
        old.body.replace("charge", "chargE");
        QCOMPARE(send(u"fixtures"_qs, old).status, 401);
    }

    void sendgridBatchForwardsOnlyNewElements()
    {
        const qint64 now = wallMs() / 1000;
        auto batch = [&](const QList<QByteArray> &ids) {
            QByteArray body = "[";
            for (const QByteArray &id : ids)
                body += (body.size() > 1 ? "," : "") + QByteArray("{\"event\":\"open\",\"sg_event_id\":\"") + id + "\",\"timestamp\":1}";
            body += "]";
            const QByteArray ts = QByteArray::number(now);
            const QByteArray der = openssl({u"dgst"_qs, u"-sha256"_qs, u"-sign"_qs, pemFile(m_sgPrivate)}, ts + body);
            return Signed{{{"X-Twilio-Email-Event-Webhook-Timestamp", ts}, {"X-Twilio-Email-Event-Webhook-Signature", der.toBase64()}}, body};
        };
        const int before = m_down.total();
        ClientResponse r = send(u"sendgrid"_qs, batch({"sg-a", "sg-b"}));
        QCOMPARE(r.status, 200);
        QCOMPARE(m_down.total(), before + 1);
        QCOMPARE(QJsonDocument::fromJson(m_down.requests().last().body).array().size(), 2);
        // Re-sent with one new element: only that element is forwarded.
        r = send(u"sendgrid"_qs, batch({"sg-a", "sg-b", "sg-c"}));
        QCOMPARE(r.status, 200);
        QCOMPARE(m_down.total(), before + 2);
        const QJsonArray forwarded = QJsonDocument::fromJson(m_down.requests().last().body).array();
        QCOMPARE(forwarded.size(), 1);
        QCOMPARE(forwarded.first().toObject().value(u"sg_event_id").toString(), u"sg-c"_qs);
        QCOMPARE(QJsonDocument::fromJson(r.body).object().value(u"replayed").toInt(), 2);
        // Entirely seen before: nothing forwarded, replayed.
        r = send(u"sendgrid"_qs, batch({"sg-b", "sg-c"}));
        QCOMPARE(r.status, 200);
        QCOMPARE(r.header("Idempotency-Outcome"), QByteArray("replayed"));
        QCOMPARE(m_down.total(), before + 2);
        // Every element has its own record.
        auto k = m_pool->run<std::optional<KeyRecord>>([](IdempotencyStore &s) { return s.key(u"sendgrid:sg-c"_qs); });
        QVERIFY(k->has_value());
        QCOMPARE(name((*k)->state), name(KeyState::Completed));
        QCOMPARE(QJsonDocument::fromJson((*k)->request.body).array().size(), 1);
    }

    void sendgridBatchIsNot2xxUntilEveryElementCompleted()
    {
        m_down.setStatus(500);
        const qint64 now = wallMs() / 1000;
        const QByteArray body = "[{\"event\":\"open\",\"sg_event_id\":\"sg-fail\"},{\"event\":\"click\",\"email\":\"x@y.z\",\"timestamp\":5}]";
        const QByteArray ts = QByteArray::number(now);
        const QByteArray der = openssl({u"dgst"_qs, u"-sha256"_qs, u"-sign"_qs, pemFile(m_sgPrivate)}, ts + body);
        const Signed s{{{"X-Twilio-Email-Event-Webhook-Timestamp", ts}, {"X-Twilio-Email-Event-Webhook-Signature", der.toBase64()}}, body};
        ClientResponse r = send(u"sendgrid"_qs, s);
        QCOMPARE(r.status, 500);
        m_down.setStatus(200);
        r = send(u"sendgrid"_qs, s);
        QCOMPARE(r.status, 200);
        // The element without sg_event_id got a key of its own: its canonical JSON's hash.
        KeyQuery q;
        q.endpoint = u"sendgrid"_qs;
        q.glob = u"sendgrid:e-*"_qs;
        QCOMPARE(m_pool->run<QList<KeyRecord>>([&](IdempotencyStore &st) { return st.listKeys(q); })->size(), 1);
    }

    void slackUrlVerificationAndRetries()
    {
        const qint64 now = wallMs() / 1000;
        Signed challenge;
        challenge.body = "{\"type\":\"url_verification\",\"challenge\":\"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P\"}";
        const QByteArray ts = QByteArray::number(now);
        challenge.headers = {{"X-Slack-Request-Timestamp", ts}, {"X-Slack-Signature", "v0=" + hmacHex(kSlackSecret, "v0:" + ts + ":" + challenge.body)}};
        const ClientResponse r = send(u"slack"_qs, challenge);
        QCOMPARE(r.status, 200);
        QCOMPARE(QJsonDocument::fromJson(r.body).object().value(u"challenge").toString(),
                 u"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"_qs);
        Signed retry = make(u"slack"_qs, "Ev_retry", kSlackSecret, now);
        QCOMPARE(send(u"slack"_qs, retry).status, 200);
        retry.headers.append({QByteArray("X-Slack-Retry-Num"), QByteArray("1")});
        retry.headers.append({QByteArray("X-Slack-Retry-Reason"), QByteArray("http_timeout")});
        QCOMPARE(send(u"slack"_qs, retry).header("Idempotency-Outcome"), QByteArray("replayed"));
        DeliveryQuery dq;
        dq.key = u"slack:Ev_retry"_qs;
        QTRY_VERIFY_WITH_TIMEOUT(m_pool->run<QList<DeliveryEvent>>([&](IdempotencyStore &s) { return s.deliveries(dq); })->size() == 2, 5000);
        const auto events = *m_pool->run<QList<DeliveryEvent>>([&](IdempotencyStore &s) { return s.deliveries(dq); });
        QVERIFY2(events.first().detail.contains(u"slack retry 1 (http_timeout)"), qPrintable(events.first().detail));
    }

    void eachProviderReadsItsEventType_data()
    {
        QTest::addColumn<QString>("provider");
        QTest::addColumn<HeaderList>("headers");
        QTest::addColumn<QByteArray>("body");
        QTest::addColumn<QString>("type");
        const HeaderList json{{"Content-Type", "application/json"}};
        const HeaderList form{{"Content-Type", "application/x-www-form-urlencoded"}};
        QTest::newRow("stripe")
            << u"stripe"_qs << json
            << QByteArray("{\"id\":\"evt_1\",\"data\":{\"object\":{\"type\":\"card\"}},"
                          "\"type\":\"payment_intent.succeeded\"}")
            << u"payment_intent.succeeded"_qs;
        QTest::newRow("github with action")
            << u"github"_qs << HeaderList{{"X-GitHub-Event", "issues"}}
            << QByteArray("{\"issue\":{\"action\":\"x\"},\"action\":\"opened\"}")
            << u"issues.opened"_qs;
        QTest::newRow("github without action")
            << u"github"_qs << HeaderList{{"X-GitHub-Event", "push"}}
            << QByteArray("{\"ref\":\"refs/heads/main\"}") << u"push"_qs;
        QTest::newRow("github without the header")
            << u"github"_qs << json << QByteArray("{\"action\":\"opened\"}") << QString();
        QTest::newRow("shopify") << u"shopify"_qs
                                 << HeaderList{{"X-Shopify-Topic", "orders/create"}}
                                 << QByteArray("{\"id\":1}") << u"orders/create"_qs;
        QTest::newRow("slack event_callback")
            << u"slack"_qs << json
            << QByteArray("{\"type\":\"event_callback\",\"event\":{\"type\":\"app_mention\"}}")
            << u"app_mention"_qs;
        QTest::newRow("slack url_verification")
            << u"slack"_qs << json
            << QByteArray("{\"type\":\"url_verification\",\"challenge\":\"c\"}")
            << u"url_verification"_qs;
        QTest::newRow("slack slash command")
            << u"slack"_qs << form
            << QByteArray("team_id=T1&command=%2Fdeploy&text=prod&trigger_id=1") << u"/deploy"_qs;
        QTest::newRow("slack interaction")
            << u"slack"_qs << form
            << QByteArray(
                   "payload=%7B%22type%22%3A%22block_actions%22%2C%22trigger_id%22%3A%221%22%7D")
            << u"block_actions"_qs;
        QTest::newRow("standard") << u"standard"_qs << json
                                  << QByteArray("{\"type\":\"invoice.paid\",\"data\":{}}")
                                  << u"invoice.paid"_qs;
        QTest::newRow("generic /type")
            << u"generic"_qs << json
            << QByteArray(" {\"data\":[1,{\"a\":\"}\"}],\"type\":\"order.shipped\"}")
            << u"order.shipped"_qs;
        QTest::newRow("generic escaped")
            << u"generic"_qs << json << QByteArray("{\"typ\\u0065\":\"caf\\u00e9\"}") << u"caf?"_qs;
        QTest::newRow("generic number")
            << u"generic"_qs << json << QByteArray("{\"type\": 42}") << u"42"_qs;
        QTest::newRow("generic object")
            << u"generic"_qs << json << QByteArray("{\"type\":{\"a\":1}}") << QString();
        QTest::newRow("not json") << u"stripe"_qs << json << QByteArray("type=payment")
                                  << QString();
        QTest::newRow("cut json") << u"stripe"_qs << json
                                  << QByteArray("{\"id\":\"e\",\"type\":\"pay") << QString();
    }
    void eachProviderReadsItsEventType()
    {
        QFETCH(QString, provider);
        QFETCH(HeaderList, headers);
        QFETCH(QByteArray, body);
        QFETCH(QString, type);
        HttpRequest request;
        request.headers = headers;
        request.body = body;
        EndpointConfig endpoint;
        endpoint.name = endpoint.provider = provider;
        QCOMPARE(providerFor(provider)->eventType(request, endpoint), type);
    }

    void sendgridReadsEachElementsEventType()
    {
        const Provider *sendgrid = providerFor(u"sendgrid");
        QCOMPARE(sendgrid->elementType("{\"event\":\"bounce\"}"), u"bounce"_qs);
        QCOMPARE(sendgrid->elementType("{\"sg_event_id\":\"x\"}"), QString());
        HttpRequest batch;
        batch.body = "[{\"event\":\"open\",\"sg_event_id\":\"a\"},{\"event\":\"click\",\"sg_event_"
                     "id\":\"b\"}]";
        auto elements = sendgrid->splitBatch(batch, 100);
        QVERIFY(elements.ok());
        QCOMPARE(sendgrid->elementType(elements->at(1).raw), u"click"_qs);
    }

    void hostileEventTypesAreBoundedAndPrintable_data()
    {
        QTest::addColumn<QByteArray>("body");
        QTest::addColumn<QString>("type");
        QTest::newRow("line break") << QByteArray("{\"type\":\"a\\nb\"}") << u"a?b"_qs;
        QTest::newRow("terminal escape")
            << QByteArray("{\"type\":\"\\u001b[31mred\"}") << u"?[31mred"_qs;
        QTest::newRow("bidi override") << QByteArray("{\"type\":\"a\\u202eb\"}") << u"a?b"_qs;
        QTest::newRow("spaces around") << QByteArray("{\"type\":\"  x.y \\t\"}") << u"x.y"_qs;
        QTest::newRow("long") << "{\"type\":\"" + QByteArray(5000, 'a') + "\"}"
                              << QString(97, u'a') + u"..."_qs;
        QTest::newRow("deep") << QByteArray(100000, '[') + "{\"type\":\"x\"}" << QString();
        QTest::newRow("deep before")
            << "{\"a\":" + QByteArray(100000, '[') + ",\"type\":\"x\"}" << QString();
        QTest::newRow("unterminated string")
            << QByteArray("{\"a\":\"\\\",\"type\":\"x\"}") << QString();
    }
    void hostileEventTypesAreBoundedAndPrintable()
    {
        QFETCH(QByteArray, body);
        QFETCH(QString, type);
        HttpRequest request;
        request.body = body;
        EndpointConfig endpoint;
        endpoint.provider = u"generic"_qs;
        const QString read = providerFor(u"generic")->eventType(request, endpoint);
        QCOMPARE(read, type);
        QVERIFY(read.size() <= kMaxEventTypeChars);
    }

    // The type reader skips what it does not need; where QJsonDocument (the key, the window)
    // reads the body, the reader reads the same value.
    void theTypeReaderReadsWhatTheJsonParserReads_data()
    {
        QTest::addColumn<QByteArray>("body");
        QTest::addColumn<QString>("pointer");
        QTest::addColumn<QString>("expected");
        QTest::newRow("a name given twice")
            << QByteArray("{\"type\":\"first\",\"type\":\"second\"}") << u"/type"_qs
            << u"second"_qs;
        QTest::newRow("given twice, the first escaped")
            << QByteArray("{\"typ\\u0065\":\"first\",\"type\":\"second\"}") << u"/type"_qs
            << u"second"_qs;
        QTest::newRow("given twice, the last escaped")
            << QByteArray("{\"type\":\"first\",\"typ\\u0065\":\"second\"}") << u"/type"_qs
            << u"second"_qs;
        QTest::newRow("given twice in a nested object")
            << QByteArray("{\"event\":{\"type\":\"a\",\"type\":\"b\"},\"type\":\"c\"}")
            << u"/event/type"_qs << u"b"_qs;
        QTest::newRow("an object given again as a string")
            << QByteArray("{\"event\":{\"type\":\"a\"},\"event\":\"x\"}") << u"/event/type"_qs
            << QString();
        // ./dev fuzz (fuzz_providers, checkPointer): a SendGrid batch whose first element names
        // its event twice, the second time with control characters in it.
        QTest::newRow("the fuzzer's SendGrid batch")
            << QByteArray("[{\"email\":\"a@example.com\",\"event\":\"click\",\"sg_message_id\":"
                          "\"m\",\"event\":\"clic\x06webhook-id:v0= msgok-\x1a{}\"},{\"sg_event_"
                          "id\":\"x\",\"v\":1},{ \"v\" : 1, \"sg_even|_id\" : \"x\" },{\"sg_event_"
                          "id\":\"x\",\"v\":2},{\"n\":9007199254740993}]")
            << u"/0/event"_qs << u"clic\x06webhook-id:v0= msgok-\x1a{}"_qs;
        QTest::newRow("a byte order mark first")
            << QByteArray("\xEF\xBB\xBF {\"type\":\"invoice.paid\"}") << u"/type"_qs
            << u"invoice.paid"_qs;
    }
    void theTypeReaderReadsWhatTheJsonParserReads()
    {
        QFETCH(QByteArray, body);
        QFETCH(QString, pointer);
        QFETCH(QString, expected);
        QJsonParseError error;
        const QJsonDocument doc = QJsonDocument::fromJson(body, &error);
        QCOMPARE(error.error, QJsonParseError::NoError);
        const auto tree = resolvePointer(
            doc.isArray() ? QJsonValue(doc.array()) : QJsonValue(doc.object()), pointer);
        QCOMPARE(tree ? tree->toString() : QString(), expected);
        const auto raw = jsonValueAt(body, pointer);
        QCOMPARE(raw.has_value(), tree.has_value());
        QCOMPARE(raw ? jsonScalarText(*raw) : QString(), expected);
        // What the desk keeps of it.
        QCOMPARE(eventTypeAt(body, pointer), eventTypeText(expected));
    }

    void genericTypePointerIsConfigured()
    {
        auto c = Config::parse("{\"endpoints\": [{\"name\": \"a\", \"provider\": \"generic\", "
                               "\"type_pointer\": \"/meta/event~1name\"}, {\"name\": \"b\", "
                               "\"provider\": \"generic\", \"type_pointer\": \"\"}]}",
                               u"c.json"_qs);
        QVERIFY2(c.ok(), c.ok() ? "" : qPrintable(c.error().message));
        HttpRequest request;
        request.body = "{\"type\":\"top\",\"meta\":{\"event/name\":\"order.paid\"}}";
        const Provider *generic = providerFor(u"generic");
        QCOMPARE(generic->eventType(request, *c->endpoint(u"a")), u"order.paid"_qs);
        QCOMPARE(generic->eventType(request, *c->endpoint(u"b")), QString());
        // Written back only where it differs from the default.
        const QJsonArray written = c->toJson().value(u"endpoints"_qs).toArray();
        QCOMPARE(written.at(0).toObject().value(u"type_pointer"_qs).toString(),
                 u"/meta/event~1name"_qs);
        QCOMPARE(written.at(1).toObject().value(u"type_pointer"_qs).toString(), QString());
        QVERIFY(written.at(1).toObject().contains(u"type_pointer"_qs));
    }

    void providerConfigIsValidated_data()
    {
        QTest::addColumn<QByteArray>("endpoint");
        QTest::addColumn<QString>("expected");
        QTest::newRow("sendgrid secret") << QByteArray("{\"name\": \"s\", \"provider\": \"sendgrid\", \"secret\": \"x\"}") << u"endpoints[0].secret: sendgrid signs with ECDSA"_qs;
        QTest::newRow("bad public key") << QByteArray("{\"name\": \"s\", \"provider\": \"sendgrid\", \"public_key\": \"bm9wZQ==\"}") << u"endpoints[0].public_key: not a public key"_qs;
        QTest::newRow("public key elsewhere") << QByteArray("{\"name\": \"s\", \"provider\": \"stripe\", \"public_key\": \"x\"}") << u"endpoints[0].public_key: only the sendgrid"_qs;
        QTest::newRow("standard secret") << QByteArray("{\"name\": \"s\", \"provider\": \"standard\", \"secret\": \"whsec_***\"}") << u"endpoints[0].secret: a Standard Webhooks secret"_qs;
        QTest::newRow("key on stripe") << QByteArray("{\"name\": \"s\", \"provider\": \"stripe\", \"key\": {\"header\": \"X\"}}") << u"endpoints[0].key: only the generic"_qs;
        QTest::newRow("key header on github") << QByteArray("{\"name\": \"s\", \"provider\": \"github\", \"key\": {\"header\": \"X-GitHub-Delivery\"}}") << u"endpoints[0].key: a github key is read from the signed body"_qs;
        QTest::newRow("empty key on shopify") << QByteArray("{\"name\": \"s\", \"provider\": \"shopify\", \"key\": {}}") << u"endpoints[0].key: a shopify key is read from the signed body"_qs;
        QTest::newRow("batch cap elsewhere") << QByteArray("{\"name\": \"s\", \"provider\": \"stripe\", \"max_batch_elements\": 10}") << u"endpoints[0].max_batch_elements: only batch providers (sendgrid)"_qs;
        QTest::newRow("batch cap zero") << QByteArray("{\"name\": \"s\", \"provider\": \"sendgrid\", \"max_batch_elements\": 0}") << u"endpoints[0].max_batch_elements: must be an integer from 1 to 100000"_qs;
        QTest::newRow("signature header on github") << QByteArray("{\"name\": \"s\", \"provider\": \"github\", \"signature_header\": \"X\"}") << u"endpoints[0].signature_header: only the generic"_qs;
        QTest::newRow("type pointer on stripe")
            << QByteArray("{\"name\": \"s\", \"provider\": \"stripe\", \"type_pointer\": \"/t\"}")
            << u"endpoints[0].type_pointer: only the generic"_qs;
        QTest::newRow("type pointer not a pointer")
            << QByteArray(
                   "{\"name\": \"s\", \"provider\": \"generic\", \"type_pointer\": \"type\"}")
            << u"endpoints[0].type_pointer: must be"_qs;
    }
    void providerConfigIsValidated()
    {
        QFETCH(QByteArray, endpoint);
        QFETCH(QString, expected);
        auto c = Config::parse("{\"endpoints\": [" + endpoint + "]}", u"c.json"_qs);
        QVERIFY(!c.ok());
        QVERIFY2(c.error().message.contains(expected), qPrintable(c.error().message));
    }

    void retryWindowsAndWarnings()
    {
        const Config builtin = Config::builtin();
        QCOMPARE(builtin.endpoints.size(), 7);
        for (const EndpointConfig &e : builtin.endpoints) {
            QCOMPARE(e.name, e.provider); // /hooks/<provider>
            QVERIFY(e.settings.ttlSeconds >= providerFor(e.provider)->retryWindowSeconds());
        }
        QCOMPARE(providerFor(u"stripe")->retryWindowSeconds(), 3 * 86400);
        QCOMPARE(providerFor(u"shopify")->retryWindowSeconds(), 4 * 3600);
        QCOMPARE(providerFor(u"sendgrid")->retryWindowSeconds(), 86400);
        QCOMPARE(providerFor(u"standard")->retryWindowSeconds(), 76 * 3600);
        auto c = Config::parse("{\"endpoints\": [{\"name\": \"s\", \"provider\": \"stripe\", \"secret\": \"whsec_x\", \"ttl_seconds\": 3600}]}", u"c"_qs);
        const QStringList warnings = configWarnings(*c);
        QCOMPARE(warnings.size(), 1);
        QVERIFY2(warnings.first().contains(u"shorter than stripe's retry window"), qPrintable(warnings.first()));
        QVERIFY(configWarnings(builtin).first().contains(u"signatures are not verified"));
        auto accepted = Config::parse(
            "{\"endpoints\": [{\"name\": \"s\", \"provider\": \"stripe\", \"secret\": \"whsec_x\", "
            "\"in_progress_status\": 202}]}",
            u"c"_qs);
        QVERIFY(accepted.ok());
        QCOMPARE(configWarnings(*accepted).size(), 1);
        QVERIFY2(configWarnings(*accepted).first().contains(u"in_progress_status 202 is a 2xx"),
                 qPrintable(configWarnings(*accepted).first()));
        // SendGrid verifies with a public key, not a secret: that is verified too.
        const QStringList ours = configWarnings(m_receiver->engine()->config());
        QVERIFY2(!ours.join(u'\n').contains(u"sendgrid: no secret"), qPrintable(ours.join(u'\n')));
        QVERIFY(verifiesSignatures(*m_receiver->engine()->config().endpoint(u"sendgrid")));
    }
};

QTEST_GUILESS_MAIN(TestProviders)
#include "tst_providers.moc"
