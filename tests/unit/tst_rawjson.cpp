// rawJsonObjects: a JSON array's objects as sent, and their canonical form (SendGrid batches).
#include "util/rawjson.h"

#include <QJsonArray>
#include <QJsonDocument>
#include <QSet>
#include <QTest>

using namespace idem;

class TestRawJson : public QObject
{
    Q_OBJECT

    static QList<RawJsonObject> read(const QByteArray &json, QByteArrayView idMember = {})
    {
        auto objects = rawJsonObjects(json, idMember);
        if (!objects)
            qFatal("%s: %s", json.constData(), qPrintable(objects.error().message));
        return *objects;
    }
    static QString refusal(const QByteArray &json)
    {
        auto objects = rawJsonObjects(json);
        return objects ? QString() : objects.error().message;
    }

private Q_SLOTS:
    void eachObjectIsItsBytesAsSent()
    {
        const QByteArray first = "{ \"b\" : 1.50 ,\"a\":[ 1 , {\"z\" :null} ] }";
        const QByteArray second = "{\"n\":12345678901234567890}";
        const QList<RawJsonObject> objects =
            read("\xEF\xBB\xBF \n[" + first + " ,\t" + second + "\r\n] \n");
        QCOMPARE(objects.size(), 2);
        QCOMPARE(objects.at(0).raw, first);
        QCOMPARE(objects.at(1).raw, second);
        QCOMPARE(objects.at(0).canonical, QByteArray("{\"a\":[1,{\"z\":null}],\"b\":1.50}"));
        QCOMPARE(objects.at(1).canonical, second);
    }

    // What the desk fingerprinted before it read elements itself, for every element whose
    // numbers are plain integers: fingerprints (and the e-<sha256> keys) stored before stay.
    void theCanonicalFormIsQJsonDocumentsCompactForm_data()
    {
        QTest::addColumn<QByteArray>("object");
        QTest::newRow("sendgrid") << QByteArray(
            "{\"email\":\"example@test.com\",\"timestamp\":1513299569,\"smtp-id\":\"<14c5d75ce93"
            ".dfd.64b469@ismtpd-555>\",\"event\":\"click\",\"category\":[\"cat facts\"],"
            "\"sg_event_id\":\"sg_event_id\",\"sg_message_id\":\"sg_message_id\",\"useragent\":"
            "\"Mozilla/4.0 (compatible; MSIE 6.1; Windows XP)\",\"ip\":\"255.255.255.255\","
            "\"url\":\"http://www.sendgrid.com/\",\"asm_group_id\":-1,\"tls\":true,\"x\":false}");
        QTest::newRow("nested, spaced, out of order")
            << QByteArray("{ \"z\": {\"b\": [ {\"d\":1, \"c\": 2} ], \"a\": {}}, \"a\": [] }");
        QTest::newRow("escapes") << QByteArray(
            "{\"s\":\"\\\"\\\\\\/\\b\\f\\n\\r\\t\\u0001\\u001f\\u007f\\u00e9\\u20ac\\ud83d\\ude00"
            "\\udc00\"}");
        QTest::newRow("names in code point order") << QByteArray(
            "{\"b\":1,\"a\":2,\"B\":3,\"\xC3\xA9\":4,\"\xEF\xBF\xBF\":5,\"\xF0\x9F\x98\x80\":6,"
            "\"\\u0000\":7,\"\":8}");
        QTest::newRow("integers to 2^63") << QByteArray(
            "{\"max\":9223372036854775807,\"min\":-9223372036854775808,\"past\":9007199254740993}");
    }
    void theCanonicalFormIsQJsonDocumentsCompactForm()
    {
        QFETCH(QByteArray, object);
        const QList<RawJsonObject> objects = read("[" + object + "]");
        QCOMPARE(objects.size(), 1);
        QCOMPARE(objects.at(0).raw, object);
        QCOMPARE(objects.at(0).canonical,
                 QJsonDocument::fromJson(object).toJson(QJsonDocument::Compact));
    }

    void numbersPast2To53KeepEveryDigit()
    {
        const QList<RawJsonObject> objects = read("[{\"id\":18446744073709551000},"
                                                  "{\"id\":18446744073709551001},"
                                                  "{\"id\":1e2},{\"id\":100}]",
                                                  "id");
        QSet<QByteArray> forms;
        for (const RawJsonObject &o : objects)
            forms.insert(o.canonical);
        QCOMPARE(forms.size(), 4);
        QCOMPARE(objects.at(1).id, u"18446744073709551001"_qs);
    }

    void theIdIsATopLevelScalarAsWritten_data()
    {
        QTest::addColumn<QByteArray>("member");
        QTest::addColumn<QString>("id");
        QTest::newRow("string") << QByteArray("\"caf\\u00e9\"") << u"caf\u00e9"_qs;
        QTest::newRow("number") << QByteArray("-0.10") << u"-0.10"_qs;
        QTest::newRow("true") << QByteArray("true") << u"true"_qs;
        QTest::newRow("false") << QByteArray("false") << u"false"_qs;
        QTest::newRow("null") << QByteArray("null") << QString();
        QTest::newRow("object") << QByteArray("{\"id\":\"deep\"}") << QString();
        QTest::newRow("array") << QByteArray("[\"x\"]") << QString();
    }
    void theIdIsATopLevelScalarAsWritten()
    {
        QFETCH(QByteArray, member);
        QFETCH(QString, id);
        const QList<RawJsonObject> objects =
            read("[{\"x\":\"y\",\"id\":" + member + ",\"z\":{\"id\":\"deeper\"}},{}]", "id");
        QCOMPARE(objects.at(0).id, id);
        QCOMPARE(objects.at(1).id, QString());
    }

    void anObjectNamingAMemberTwiceIsRefused_data()
    {
        QTest::addColumn<QByteArray>("json");
        QTest::newRow("top level") << QByteArray("[{\"a\":1,\"a\":2}]");
        QTest::newRow("same value") << QByteArray("[{\"a\":1,\"b\":0,\"a\":1}]");
        QTest::newRow("escaped") << QByteArray("[{\"a\":1},{\"a\":1,\"\\u0061\":2}]");
        QTest::newRow("deep") << QByteArray("[{\"x\":[{\"y\":{\"z\":1,\"z\":2}}]}]");
    }
    void anObjectNamingAMemberTwiceIsRefused()
    {
        QFETCH(QByteArray, json);
        QVERIFY(QJsonDocument::fromJson(json).isArray()); // Qt takes it (the last one counts)
        const QString why = refusal(json);
        QVERIFY2(why.contains(u"names the member \"a\" twice in one object"_qs) ||
                     why.contains(u"names the member \"z\" twice in one object"_qs),
                 qPrintable(why));
    }

    void anythingButAnArrayOfStrictJsonObjectsIsRefused_data()
    {
        QTest::addColumn<QByteArray>("json");
        QTest::addColumn<QString>("why");
        QTest::newRow("object") << QByteArray("{\"a\":1}") << u"not an array"_qs;
        QTest::newRow("scalar element") << QByteArray("[{},1]") << u"element 1 is not an object"_qs;
        QTest::newRow("array element") << QByteArray("[[]]") << u"element 0 is not an object"_qs;
        QTest::newRow("trailing comma") << QByteArray("[{},]") << u"not JSON at byte"_qs;
        QTest::newRow("two documents") << QByteArray("[{}] [{}]") << u"not JSON at byte 5"_qs;
        QTest::newRow("bad UTF-8") << QByteArray("[{\"a\":\"\xC3\"}]") << u"not JSON"_qs;
        QTest::newRow("lone high surrogate")
            << QByteArray("[{\"a\":\"\\ud800\"}]") << u"not JSON"_qs;
        QTest::newRow("NaN") << QByteArray("[{\"a\":NaN}]") << u"not JSON"_qs;
        QTest::newRow("deeper than Qt reads")
            << "[{\"a\":" + QByteArray(1100, '[') + QByteArray(1100, ']') + "}]"
            << u"element 0 nests deeper than 1024 levels"_qs;
    }
    void anythingButAnArrayOfStrictJsonObjectsIsRefused()
    {
        QFETCH(QByteArray, json);
        QFETCH(QString, why);
        QVERIFY2(refusal(json).contains(why), qPrintable(refusal(json)));
    }
};

QTEST_GUILESS_MAIN(TestRawJson)
#include "tst_rawjson.moc"
