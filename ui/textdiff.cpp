#include "textdiff.h"

#include <vector>

namespace idem {

QStringList lineDiff(const QStringList &a, const QStringList &b)
{
    // Bodies are capped at 64 KB; beyond a few thousand lines show them whole instead.
    if (qint64(a.size()) * b.size() > 4'000'000) {
        QStringList out;
        for (const QString &l : a)
            out << u"- "_qs + l;
        for (const QString &l : b)
            out << u"+ "_qs + l;
        return out;
    }
    const size_t n = size_t(a.size()), m = size_t(b.size());
    std::vector<std::vector<int>> lcs(n + 1, std::vector<int>(m + 1, 0));
    for (size_t i = n; i-- > 0;)
        for (size_t j = m; j-- > 0;)
            lcs[i][j] = a[qsizetype(i)] == b[qsizetype(j)] ? lcs[i + 1][j + 1] + 1 : std::max(lcs[i + 1][j], lcs[i][j + 1]);
    QStringList out;
    size_t i = 0, j = 0;
    while (i < n && j < m) {
        if (a[qsizetype(i)] == b[qsizetype(j)]) {
            out << u"  "_qs + a[qsizetype(i++)];
            ++j;
        } else if (lcs[i + 1][j] >= lcs[i][j + 1]) {
            out << u"- "_qs + a[qsizetype(i++)];
        } else {
            out << u"+ "_qs + b[qsizetype(j++)];
        }
    }
    while (i < n)
        out << u"- "_qs + a[qsizetype(i++)];
    while (j < m)
        out << u"+ "_qs + b[qsizetype(j++)];
    return out;
}

} // namespace idem
