#include "jsonhighlighter.h"

#include "colours.h"

namespace idem {

void JsonHighlighter::highlightBlock(const QString &text)
{
    static const QRegularExpression key(u"\"(?:[^\"\\\\]|\\\\.)*\"(?=\\s*:)"_qs);
    static const QRegularExpression string(u"\"(?:[^\"\\\\]|\\\\.)*\""_qs);
    static const QRegularExpression number(u"\\b-?\\d+(?:\\.\\d+)?(?:[eE][+-]?\\d+)?\\b"_qs);
    static const QRegularExpression literal(u"\\b(?:true|false|null)\\b"_qs);
    QTextCharFormat keyFormat, stringFormat, numberFormat, literalFormat;
    keyFormat.setForeground(jsonColour(JsonPart::Key));
    stringFormat.setForeground(jsonColour(JsonPart::String));
    numberFormat.setForeground(jsonColour(JsonPart::Number));
    literalFormat.setForeground(jsonColour(JsonPart::Literal));
    for (const auto &[re, format] : {std::pair{&number, numberFormat}, {&literal, literalFormat},
                                     {&string, stringFormat}, {&key, keyFormat}}) {
        auto it = re->globalMatch(text);
        while (it.hasNext()) {
            const auto m = it.next();
            setFormat(int(m.capturedStart()), int(m.capturedLength()), format);
        }
    }
}

} // namespace idem
