#include "richtext.h"

#include "util/format.h"

namespace idem {

QString richTextEscaped(QStringView text)
{
    return escapeControls(text).toHtmlEscaped();
}

QString plainToolTip(QStringView text)
{
    if (text.isEmpty())
        return {};
    return u"<p style='white-space:pre'>%1</p>"_qs.arg(escapeControls(text, true).toHtmlEscaped());
}

} // namespace idem
