#pragma once

#include <QRegularExpression>
#include <QSyntaxHighlighter>

namespace idem {

// Keys, strings, numbers and literals of pretty-printed JSON in distinct colours.
class JsonHighlighter final : public QSyntaxHighlighter
{
    Q_OBJECT
public:
    using QSyntaxHighlighter::QSyntaxHighlighter;

protected:
    void highlightBlock(const QString &text) override;
};

// Pretty JSON when the body is JSON; otherwise the text, or a note for binary data.
QString prettyBody(const QByteArray &body, bool raw);

} // namespace idem
