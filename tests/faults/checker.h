#pragma once

#include "faults/driver.h"
#include "support/recordingdownstream.h"

#include <QHash>
#include <QStringList>

namespace idem::test {

// A key as the store holds it after the run (`idemdesk keys show KEY --json`).
struct StoredKey
{
    bool found = false;
    QString state;
    qint64 token = 0;
    int resultStatus = 0;
    QByteArray resultBody;
};

// A fault the schedule injected; times like every other in the suite (monotonicUs() / 1000).
struct InjectedFault
{
    QString kind;   // "proxy delay", "proxy blackhole", "proxy reset", "store SIGSTOP", "desk
                    // SIGKILL", "clock skew"
    QString target; // the desk(s) it hit, e.g. "a1" or "a, b"
    qint64 atMs = 0;
    qint64 durationMs = 0;
};

// Everything one run of the suite observed, for the checker.
struct FaultHistory
{
    QString store;
    QString endpoint;
    qint64 originMs = 0; // the driver's start: times print relative to it
    qint64 leaseMs = 0;  // the endpoint's lease_seconds, in ms
    qint64 forwardTimeoutMs = 0; // its forward_timeout_seconds: at most this from claim to run
    int keys = 0;
    int deliveries = 0;
    QList<SenderLog> senders;
    QList<DownstreamRun> runs;
    QHash<QString, StoredKey> stored; // by stored key, <endpoint>:k<N>
    QList<InjectedFault> faults; // SIGKILLs among them: "desk SIGKILL" with the instance as target
};

// A key that broke a promise: what it broke, and everything that happened to it.
struct KeyFailure
{
    QString key;
    QStringList problems;
    QString history; // its runs, the answers its senders got (by time), its stored record
};

struct CheckOutcome
{
    QList<KeyFailure> failures;
    QString summary; // deliveries, faults by kind, runs, second runs by cause
};

// The suite's promises, checked against the history:
//  - no two runs of a key overlap, and each run after a key's first is explained by the run
//    before it: it failed (the downstream answered 5xx, or the desk cut it at its forward
//    timeout: on_failed reprocesses), or its desk was killed (SIGKILL) while it held the lease;
//    a run the desk cut is not run again before its lease ended (the app may still be at it);
//    fencing tokens grow from run to run;
//  - every key a sender got a 2xx for is `completed` in the store with that status and body;
//  - a 503 is only answered to a delivery that ran nothing;
//  - every sender ends with a 2xx (the desk recovers from every fault within the senders'
//  patience).
CheckOutcome checkHistory(const FaultHistory &history);

} // namespace idem::test
