#pragma once

#include "config/config.h"
#include "model/keyrecord.h"

#include <QObject>

#include <functional>
#include <memory>

class QNetworkAccessManager;

namespace idem {

struct ProcessResult
{
    bool success = false; // 2xx from the downstream (or the simulation)
    StoredResult response; // what the sender gets, and what is stored for replays
    QString error;         // for failures: what went wrong
};

// Runs the real work of a claimed delivery, asynchronously, on the thread it lives on.
class Processor : public QObject
{
    Q_OBJECT
public:
    using Done = std::function<void(ProcessResult)>;
    using QObject::QObject;
    virtual void run(const QString &key, const StoredRequest &request, Done done) = 0;
};

// POSTs the original headers and body plus Idempotency-Key to forward_to. 2xx: completed with
// the downstream's answer; other statuses: failed with it; unreachable: 502; timeout: 504.
class ForwardProcessor final : public Processor
{
    Q_OBJECT
public:
    ForwardProcessor(QUrl target, qint64 timeoutMs, QObject *parent = nullptr);
    ~ForwardProcessor() override;
    void run(const QString &key, const StoredRequest &request, Done done) override;

private:
    QUrl m_target;
    qint64 m_timeoutMs;
    QNetworkAccessManager *m_network;
};

// The built-in processor: answers 200 after delay_ms, or fails with 500 at fail_rate.
class SimulatedProcessor final : public Processor
{
    Q_OBJECT
public:
    SimulatedProcessor(SimulateSpec spec, QObject *parent = nullptr);
    void run(const QString &key, const StoredRequest &request, Done done) override;

private:
    SimulateSpec m_spec;
};

std::unique_ptr<Processor> makeProcessor(const EndpointConfig &endpoint);

bool isHopByHopHeader(QByteArrayView name);

} // namespace idem
