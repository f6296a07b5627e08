#include "util/clock.h"

#include <QDateTime>
#include <QElapsedTimer>

namespace idem {

qint64 monotonicUs()
{
    static const QElapsedTimer clock = [] {
        QElapsedTimer t;
        t.start();
        return t;
    }();
    return clock.nsecsElapsed() / 1000;
}

qint64 wallMs()
{
    return QDateTime::currentMSecsSinceEpoch();
}

} // namespace idem
