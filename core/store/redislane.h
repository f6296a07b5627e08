#pragma once

#include "store/redisprotocol.h"
#include "store/redisstore.h"
#include "store/storelane.h"
#include "store/storeurl.h"

#include <QHash>
#include <QObject>
#include <QSocketNotifier>
#include <QTimer>

#include <deque>

struct redisAsyncContext;

namespace idem {

class StorePool;

// Claim and finish on Redis from the receiver thread's event loop (hiredis's asynchronous API
// on QSocketNotifiers): what the receiver asks in one turn of its loop goes to Redis in one
// write, the answers come back in one read, and no thread is woken in between. Speaks the same
// scripts as RedisStore (redisprotocol.h), which write the records' index entries too. A lost
// connection fails what was in flight (in doubt: nothing is retried) and the next call connects
// again; a call unanswered within the command timeout drops the connection. Claims are refused past
// maxInFlight; finishes never are. Health goes to the pool (/healthz, the status bar). Lives on,
// and is used from, one thread.
class RedisLane final : public QObject, public StoreLane
{
public:
    RedisLane(StoreUrl url, RedisOptions options, StorePool &health, int maxInFlight = 20000);
    ~RedisLane() override;

    void claim(const ClaimRequest &request, std::function<void(Result<ClaimResult>)> done) override;
    void finish(const FinishRequest &request,
                std::function<void(Result<FinishVerdict>)> done) override;

    struct Call;

private:
    using Answer = std::function<void(const redisReply *reply, const Error *error)>;
    void send(const char *script, QList<QByteArray> args, bool refusedWhenBusy, Answer answer);
    bool write(Call *call);
    bool connectIfNeeded(QString *error);
    void answered(Call *call, const redisReply *reply, const char *contextError);
    void fail(Call *call, const Error &error);
    void checkTimeouts();
    void dropConnection(const QString &why);

    // hiredis's event hooks: a notifier per direction, made on first use, enabled on demand.
    void watch(QSocketNotifier *RedisLane::*slot, QSocketNotifier::Type type,
               void (*handle)(redisAsyncContext *), bool on);
    static void onReply(redisAsyncContext *ac, void *reply, void *privdata);
    static void onSetupReply(redisAsyncContext *ac, void *reply, void *privdata);
    static void addRead(void *self);
    static void delRead(void *self);
    static void addWrite(void *self);
    static void delWrite(void *self);
    static void cleanup(void *self);

    StoreUrl m_url;
    RedisOptions m_options;
    StorePool &m_health;
    int m_maxInFlight;
    redis::Layout m_layout; // a single Redis: one bucket
    QHash<QByteArray, redis::Script> m_scripts;
    QString m_scriptError;
    redisAsyncContext *m_ac = nullptr;
    QSocketNotifier *m_read = nullptr;
    QSocketNotifier *m_write = nullptr;
    std::deque<Call *> m_inFlight; // in the order sent: Redis answers in that order
    QTimer m_timeouts;
    QString m_failure; // why the connection is being dropped, for the calls it fails
    bool m_closing = false;
};

} // namespace idem
