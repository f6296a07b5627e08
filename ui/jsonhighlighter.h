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

} // namespace idem
