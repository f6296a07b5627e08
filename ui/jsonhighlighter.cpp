#include "jsonhighlighter.h"


namespace idem {

void JsonHighlighter::highlightBlock(const QString &text)
{
    static const QRegularExpression key(u"\"(?:[^\"\\\\]|\\\\.)*\"(?=\\s*:)"_qs);
    static const QRegularExpression string(u"\"(?:[^\"\\\\]|\\\\.)*\""_qs);
    static const QRegularExpression number(u"\\b-?\\d+(?:\\.\\d+)?(?:[eE][+-]?\\d+)?\\b"_qs);
    static const QRegularExpression literal(u"\\b(?:true|false|null)\\b"_qs);
    QTextCharFormat keyFormat, stringFormat, numberFormat, literalFormat;
    keyFormat.setForeground(QColor(0x88, 0x22, 0x88));
    stringFormat.setForeground(QColor(0x1b, 0x7f, 0x3b));
    numberFormat.setForeground(QColor(0x1f, 0x5f, 0xb0));
    literalFormat.setForeground(QColor(0xb0, 0x6a, 0x00));
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
