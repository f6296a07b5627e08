#pragma once

#include "model/statemachine.h"
#include "store/idempotencystore.h"

// Readable names for QCOMPARE of the state machine's enums (QTest cannot print them: their
// toString() returns QString).
namespace idem::test {
inline QString name(ClaimAction a) { return toString(a); }
inline QString name(Outcome o) { return toString(o); }
inline QString name(KeyState s) { return toString(s); }
inline QString name(FinishVerdict v) { return toString(v); }
inline QString name(OperatorVerdict v)
{
    switch (v) {
    case OperatorVerdict::Accept: return QStringLiteral("accept");
    case OperatorVerdict::WrongState: return QStringLiteral("wrong-state");
    case OperatorVerdict::Missing: return QStringLiteral("missing");
    case OperatorVerdict::Leased:
        return QStringLiteral("leased");
    }
    return {};
}
inline QString name(ImportVerdict v)
{
    return v == ImportVerdict::Imported ? QStringLiteral("imported") : QStringLiteral("exists");
}
} // namespace idem::test
