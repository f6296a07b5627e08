#pragma once

#include "config/config.h"
#include "model/keyrecord.h"

#include <QHostAddress>
#include <QObject>

#include <functional>
#include <memory>

namespace idem {

struct ProcessResult
{
    bool success = false; // 2xx from the downstream (or the simulation)
    StoredResult response; // what the sender gets, and what is stored for replays
    QString error;         // for failures: what went wrong
    // False: the claim came too late to start the work (IdempotencyEngine::run): nothing ran,
    // and the key is finished as `reset`, so the next delivery processes it (stored as failed,
    // it was replayed for good under on_failed: reject; left leased, a duplicate was told
    // "in progress", a 2xx with in_progress_status 202, for an event nothing was running).
    bool started = true;
    // True: the request reached the app but no final status line came back (none by the
    // deadline, the connection broken or the bytes unreadable before it): the app may have
    // acted, and may still be acting. The key is not finished: it stays `processing` until its
    // lease ends (duplicates meanwhile are told "in progress"), then the next delivery recovers
    // it. Finished as failed, a sender's retry ran it again at once, beside the first run. Once a
    // final status is read the app is done: an answer unusable after it fails the key as before.
    bool outcomeUnknown = false;
};

// One run of the real work of a claimed delivery.
struct ProcessJob
{
    QString key;             // forwarded as Idempotency-Key (empty: a passthrough without a key)
    QByteArray fencingToken; // forwarded as Idempotency-Fencing-Token (empty: none)
    StoredRequest request;
    QHostAddress peer;       // the sender, appended to X-Forwarded-For
    QByteArray via;          // the endpoint's own Via entry, added (empty: none)
    qint64 deadlineMs = 30'000; // the whole answer must be in by then: a hard deadline, not an idle timeout
};

// Runs the real work of a claimed delivery, asynchronously, on the thread it lives on. `done` is
// called exactly once, at the latest when the job's deadline has passed.
class Processor : public QObject
{
    Q_OBJECT
public:
    using Done = std::function<void(ProcessResult)>;
    using QObject::QObject;
    virtual void run(const ProcessJob &job, Done done) = 0;
};

// POSTs the original headers (less hop-by-hop ones) and body plus Idempotency-Key,
// Idempotency-Fencing-Token, X-Forwarded-For and the endpoint's Via entry to forward_to
// (http/forwardclient.h: no header the sender did not send but these, Host, Content-Length,
// Connection: close, a default Content-Type and User-Agent, and Basic authentication from
// forward_to's user info when the sender sent no Authorization). 2xx: completed with the
// downstream's answer; other statuses (3xx included: no redirects followed): failed with it;
// unreachable, TLS refused, an answer broken off or malformed: 502; no whole answer by the
// deadline: 504; an answer over max_response_bytes: 502 — with ProcessResult::outcomeUnknown when
// the request went out and no final status line came back. No cookies, no cache.
class ForwardProcessor final : public Processor
{
    Q_OBJECT
public:
    ForwardProcessor(QUrl target, qint64 maxResponseBytes, QObject *parent = nullptr);
    ~ForwardProcessor() override;
    void run(const ProcessJob &job, Done done) override;

private:
    HeaderList requestHeaders(const ProcessJob &job) const;
    QUrl m_target;
    qint64 m_maxResponseBytes;
};

// The built-in processor: answers 200 after delay_ms, or fails with 500 at fail_rate; a delay
// past the deadline is a 504 like a downstream's.
class SimulatedProcessor final : public Processor
{
    Q_OBJECT
public:
    SimulatedProcessor(SimulateSpec spec, QObject *parent = nullptr);
    void run(const ProcessJob &job, Done done) override;

private:
    SimulateSpec m_spec;
};

std::unique_ptr<Processor> makeProcessor(const EndpointConfig &endpoint);

// RFC 9110 §7.6.1: never forwarded, nor any header the request's Connection header names.
bool isHopByHopHeader(QByteArrayView name);
// The headers a forwarded request carries from the original: no hop-by-hop ones, none that the
// desk sets itself (Idempotency-Key, Idempotency-Fencing-Token, X-Forwarded-For).
HeaderList forwardedHeaders(const HeaderList &original);

// A `Via` entry (RFC 9110 §7.6.3) for an endpoint of a receiver to add to what it forwards:
// "1.1 idemdesk-" and a random pseudonym, so that a delivery coming back to the endpoint that
// forwarded it (a forward_to that leads back to it, directly or through other endpoints, desks
// and proxies) is told apart from one passed on by another.
QByteArray newViaEntry();
// True when one of the request's `Via` entries is `entry`.
bool passedThrough(const HeaderList &headers, const QByteArray &entry);

} // namespace idem
