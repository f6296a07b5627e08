#pragma once

#include <QString>
#include <QStringList>

namespace idem {

// A line diff (longest common subsequence): unchanged lines start with "  ", removed "- ",
// added "+ ". For the 422 view: the stored payload against the one that was refused.
QStringList lineDiff(const QStringList &before, const QStringList &after);

} // namespace idem
