#include "util/rawjson.h"

#include <rapidjson/error/en.h>
#include <rapidjson/memorystream.h>
#include <rapidjson/reader.h>

#include <QVarLengthArray>

#include <algorithm>
#include <string_view>

namespace idem {
namespace {

constexpr int kMaxDepth = 1024; // QJsonDocument's nesting limit

// The string's text as QJsonDocument::Compact writes it: '"' and '\' escaped, control
// characters as \b \f \n \r \t or \u00xx, a surrogate alone as \uxxxx, the rest as UTF-8.
void appendQuoted(QByteArray &out, std::string_view s)
{
    static constexpr char kHex[] = "0123456789abcdef";
    out += '"';
    for (size_t i = 0; i < s.size(); ++i) {
        const auto c = uchar(s[i]);
        if (c == '"' || c == '\\') {
            out += '\\';
            out += char(c);
        } else if (c < 0x20) {
            static constexpr char kShort[] = "btn\0fr"; // \b=8 \t=9 \n=10, \f=12 \r=13
            out += '\\';
            if (c >= 8 && c <= 13 && c != 11)
                out += kShort[c - 8];
            else
                out.append("u00").append(kHex[c >> 4]).append(kHex[c & 15]);
        } else if (c == 0xED && i + 2 < s.size() && (uchar(s[i + 1]) & 0xE0) == 0xA0) {
            // U+D800..U+DFFF, which only a \u escape alone can give (the input is valid UTF-8).
            const unsigned u = 0xD000 | (uchar(s[i + 1]) & 0x3F) << 6 | (uchar(s[i + 2]) & 0x3F);
            out.append("\\u").append(kHex[u >> 12]).append(kHex[u >> 8 & 15]);
            out.append(kHex[u >> 4 & 15]).append(kHex[u & 15]);
            i += 2;
        } else {
            out += char(c);
        }
    }
    out += '"';
}

// RapidJSON's SAX handler: each element of the top-level array read into a tree of offsets,
// written out canonically when it closes, then dropped (memory is one element's, not the
// body's).
class Elements : public rapidjson::BaseReaderHandler<rapidjson::UTF8<>, Elements>
{
public:
    Elements(const rapidjson::MemoryStream &stream, QByteArrayView json, qsizetype base,
             QByteArrayView idMember)
        : m_stream(stream), m_json(json), m_base(base), m_idMember(idMember)
    {}
    QList<RawJsonObject> elements;
    QString error; // why the handler stopped the reader

    bool Null() { return scalar("null"); }
    bool Bool(bool b) { return keep(b ? "true" : "false") && scalar(b ? "true" : "false"); }
    // Numbers arrive as their text (kParseNumbersAsStringsFlag): nothing is lost to a double.
    bool RawNumber(const char *s, rapidjson::SizeType n, bool)
    {
        return keep({s, n}) && scalar({s, n});
    }
    bool String(const char *s, rapidjson::SizeType n, bool)
    {
        QByteArray quoted;
        appendQuoted(quoted, {s, n});
        return keep({s, n}) && scalar(quoted);
    }
    bool Key(const char *s, rapidjson::SizeType n, bool)
    {
        m_name = int(m_text.size());
        m_nameSize = int(n);
        m_text.append(s, n);
        return true;
    }
    bool StartObject() { return open(Node::Object); }
    bool StartArray() { return open(Node::Array); }
    bool EndObject(rapidjson::SizeType) { return close('}'); }
    bool EndArray(rapidjson::SizeType) { return close(']'); }
    bool Default() { return fail(u"unexpected JSON"_qs); } // no other event comes

private:
    // A value of the element being read, its children linked in the order sent. Offsets are
    // 32-bit (the body is checked to fit): a node is 28 bytes.
    struct Node
    {
        enum Kind : qint32 { Scalar, Object, Array };
        Kind kind = Scalar;
        qint32 name = 0, nameSize = 0; // its member name as a member of an object, in m_text
        qint32 text = 0, textSize = 0; // a scalar's canonical text, in m_text
        qint32 first = -1, next = -1;  // children
    };

    bool fail(const QString &why)
    {
        error = why;
        return false;
    }
    QString element() const { return u"element %1"_qs.arg(elements.size()); }
    // Where the reader stands, in `json`: on `c` or just past it (RapidJSON calls some
    // handlers before taking the character, some after).
    qsizetype at(char c) const
    {
        const auto p = qsizetype(m_stream.Tell());
        return m_base + (p < m_json.size() && m_json[p] == c ? p : p - 1);
    }

    bool add(Node node)
    {
        if (!m_open.isEmpty()) {
            Node &parent = m_nodes[m_open.last()];
            if (parent.kind == Node::Object) {
                node.name = m_name;
                node.nameSize = m_nameSize;
            }
            if (m_last.last() < 0)
                parent.first = qint32(m_nodes.size());
            else
                m_nodes[m_last.last()].next = qint32(m_nodes.size());
            m_last.last() = qint32(m_nodes.size());
        }
        m_nodes.append(node);
        return true;
    }
    // `value` as RawJsonObject::id when the scalar read is the top-level member idMember.
    bool keep(std::string_view value)
    {
        if (m_depth == 2 && !m_idMember.isNull() &&
            QByteArrayView(m_text).sliced(m_name, m_nameSize) == m_idMember)
            m_id = QString::fromUtf8(value.data(), qsizetype(value.size()));
        return true;
    }
    bool scalar(QByteArrayView text)
    {
        if (m_depth == 0)
            return fail(u"the body is not an array"_qs);
        if (m_depth == 1)
            return fail(element() + u" is not an object"_qs);
        Node node;
        node.text = qint32(m_text.size());
        node.textSize = qint32(text.size());
        m_text.append(text);
        return add(node);
    }
    bool open(Node::Kind kind)
    {
        if (++m_depth > kMaxDepth)
            return fail(element() + u" nests deeper than %1 levels"_qs.arg(kMaxDepth));
        if (m_depth == 1)
            return kind == Node::Array || fail(u"the body is not an array"_qs);
        if (m_depth == 2) {
            if (kind != Node::Object)
                return fail(element() + u" is not an object"_qs);
            m_begin = at('{');
        }
        Node node;
        node.kind = kind;
        add(node);
        m_open.append(qint32(m_nodes.size() - 1));
        m_last.append(-1);
        return true;
    }
    bool close(char c)
    {
        if (--m_depth == 0) // the array itself
            return true;
        m_open.removeLast();
        m_last.removeLast();
        if (m_depth > 1)
            return true;
        RawJsonObject object;
        object.raw = m_json.sliced(m_begin - m_base, at(c) + 1 - m_begin).toByteArray();
        if (!write(0, object.canonical))
            return false;
        object.id = std::move(m_id);
        elements.append(std::move(object));
        m_nodes.clear();
        m_open.clear();
        m_last.clear();
        m_text.resize(0);
        m_id = QString();
        return true;
    }
    std::string_view nameOf(const Node &n) const
    {
        return {m_text.constData() + n.name, size_t(n.nameSize)};
    }
    // The canonical text of node `n` and its children (members sorted by name), onto `out`.
    // Recursion is as deep as the element's nesting, which open() bounds.
    bool write(qint32 n, QByteArray &out)
    {
        const Node &node = m_nodes.at(n);
        if (node.kind == Node::Scalar) {
            out.append(m_text.constData() + node.text, node.textSize);
            return true;
        }
        QVarLengthArray<qint32, 8> children;
        for (qint32 c = node.first; c >= 0; c = m_nodes.at(c).next)
            children.append(c);
        const bool object = node.kind == Node::Object;
        if (object) {
            // Code point order (UTF-8's byte order), as QJsonObject keeps its members.
            std::sort(children.begin(), children.end(), [this](qint32 a, qint32 b) {
                return nameOf(m_nodes.at(a)) < nameOf(m_nodes.at(b));
            });
            const auto twice =
                std::adjacent_find(children.begin(), children.end(), [this](qint32 a, qint32 b) {
                    return nameOf(m_nodes.at(a)) == nameOf(m_nodes.at(b));
                });
            if (twice != children.end()) {
                const std::string_view name = nameOf(m_nodes.at(*twice));
                QByteArray quoted;
                appendQuoted(quoted, name.substr(0, 64));
                return fail(element() + u" names the member %1 twice in one object"_qs.arg(
                                            QString::fromUtf8(quoted)));
            }
        }
        out += object ? '{' : '[';
        for (qsizetype i = 0; i < children.size(); ++i) {
            if (i)
                out += ',';
            if (object) {
                appendQuoted(out, nameOf(m_nodes.at(children[i])));
                out += ':';
            }
            if (!write(children[i], out))
                return false;
        }
        out += object ? '}' : ']';
        return true;
    }

    const rapidjson::MemoryStream &m_stream;
    QByteArrayView m_json;
    qsizetype m_base; // m_json's offset in the document (past a byte order mark)
    int m_depth = 0;
    qsizetype m_begin = 0;             // the open element's '{'
    QList<Node> m_nodes;               // the open element's values, itself first
    QList<qint32> m_open;              // its open objects and arrays, innermost last
    QList<qint32> m_last;              // the last child of each, -1 for none yet
    QByteArray m_text;                 // member names (decoded) and scalars' canonical text
    qint32 m_name = 0, m_nameSize = 0; // the member name just read
    QByteArrayView m_idMember;
    QString m_id; // the open element's
};

} // namespace

Result<QList<RawJsonObject>> rawJsonObjects(QByteArrayView json, QByteArrayView idMember)
{
    if (json.size() > qsizetype(1) << 30) // max_body_bytes' bound: every offset fits 32 bits
        return makeError(ErrorCode::TooLarge, u"the JSON body is over 1 GiB"_qs);
    const qsizetype base = json.startsWith("\xEF\xBB\xBF") ? 3 : 0;
    const QByteArrayView text = json.sliced(base);
    rapidjson::MemoryStream stream(text.data(), size_t(text.size()));
    Elements handler(stream, text, base, idMember);
    rapidjson::Reader reader;
    constexpr unsigned kFlags = rapidjson::kParseIterativeFlag |
                                rapidjson::kParseValidateEncodingFlag |
                                rapidjson::kParseNumbersAsStringsFlag;
    if (reader.Parse<kFlags>(stream, handler).IsError()) {
        if (!handler.error.isEmpty())
            return makeError(ErrorCode::Invalid, handler.error);
        return makeError(
            ErrorCode::Invalid,
            u"not JSON at byte %1: %2"_qs.arg(base + qsizetype(reader.GetErrorOffset()))
                .arg(QString::fromUtf8(rapidjson::GetParseError_En(reader.GetParseErrorCode()))));
    }
    return std::move(handler.elements);
}

} // namespace idem
