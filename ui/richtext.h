#pragma once

#include <QString>

namespace idem {

// Text from a sender or a store (a key, an endpoint, an error) on its way into rich text: a
// label, a tooltip, a desktop notification (whose body notification servers read as markup).
// Controls and bidi characters escaped as escapeControls does, then HTML's < > & ", so a key
// holding `<a href=…>` shows those characters and is never a link.
QString richTextEscaped(QStringView text);

// Plain text as a tooltip. Qt reads a tooltip as rich text when it looks like HTML
// (Qt::mightBeRichText), so it is always given as rich text, escaped, its line breaks kept.
// Empty stays empty (no tooltip).
QString plainToolTip(QStringView text);

} // namespace idem
