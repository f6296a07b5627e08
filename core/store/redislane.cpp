#include "store/redislane.h"

#include "store/storepool.h"
#include "util/clock.h"

#include <QSocketNotifier>

#include <async.h>
#include <hiredis.h>

#include <algorithm>
#include <vector>

namespace idem {

struct RedisLane::Call
{
    RedisLane *lane;
    const char *script;
    QList<QByteArray> args; // the script's ARGV
    Answer answer;
    qint64 sentUs = 0;
    bool withSource = false; // sent again as EVAL after NOSCRIPT
};

RedisLane::RedisLane(StoreUrl url, RedisOptions options, StorePool &health, int maxInFlight)
    : m_url(std::move(url)), m_options(options), m_health(health), m_maxInFlight(maxInFlight),
      m_layout(m_url.prefix.toUtf8(), 1)
{
    if (auto scripts = redis::scripts())
        m_scripts = *scripts;
    else
        m_scriptError = scripts.error().message;
    m_timeouts.setInterval(100);
    connect(&m_timeouts, &QTimer::timeout, this, &RedisLane::checkTimeouts);
}

RedisLane::~RedisLane()
{
    m_closing = true; // what is in flight is dropped: its askers are going away with us
    if (m_ac)
        redisAsyncFree(m_ac);
}

void RedisLane::claim(const ClaimRequest &request, std::function<void(Result<ClaimResult>)> done)
{
    send("claim", redis::claimArgs(m_layout, request), true,
         [this, request, done = std::move(done)](const redisReply *reply, const Error *error) {
             if (error)
                 return done(*error);
             auto result = redis::claimResult(reply, request);
             if (result && !result->uncounted.isEmpty())
                 m_health.reportRefusedWrite(result->uncounted);
             done(std::move(result));
         });
}

void RedisLane::finish(const FinishRequest &request,
                       std::function<void(Result<FinishVerdict>)> done)
{
    // Never refused for load: what already ran must be recorded (else it runs again later).
    send("finish", redis::finishArgs(m_layout, request), false,
         [done = std::move(done)](const redisReply *reply, const Error *error) {
             if (error)
                 return done(*error);
             done(redis::finishVerdict(reply));
         });
}

void RedisLane::send(const char *script, QList<QByteArray> args, bool refusedWhenBusy,
                     Answer answer)
{
    auto *call = new Call{this, script, std::move(args), std::move(answer)};
    QString why = m_scriptError;
    if (why.isEmpty() && refusedWhenBusy && qsizetype(m_inFlight.size()) >= m_maxInFlight)
        why = u"the store is overloaded (%1 operations in flight)"_qs.arg(m_maxInFlight);
    if (why.isEmpty() && connectIfNeeded(&why)) {
        if (write(call))
            return;
        // Refused by hiredis: the connection is being torn down (a timeout, a lost server).
        why = !m_failure.isEmpty() ? m_failure
              : m_ac && m_ac->errstr && *m_ac->errstr
                  ? QString::fromUtf8(m_ac->errstr)
                  : u"the connection is closing; the next call connects again"_qs;
    }
    // Nothing was sent. The answer comes from the event loop, never from inside the asker's call.
    const Error error =
        makeError(ErrorCode::Unavailable, u"Redis %1: %2"_qs.arg(m_url.display(), why));
    QTimer::singleShot(0, this, [this, call, error] { fail(call, error); });
}

bool RedisLane::write(Call *call)
{
    const redis::Script &script = *m_scripts.constFind(call->script);
    std::vector<const char *> argv;
    std::vector<size_t> lengths;
    argv.reserve(size_t(call->args.size()) + 2);
    lengths.reserve(argv.capacity());
    const QByteArray &body = call->withSource ? script.source : script.sha;
    argv.push_back(call->withSource ? "EVAL" : "EVALSHA");
    lengths.push_back(call->withSource ? 4 : 7);
    argv.push_back(body.constData());
    lengths.push_back(size_t(body.size()));
    for (const QByteArray &a : call->args) {
        argv.push_back(a.constData());
        lengths.push_back(size_t(a.size()));
    }
    if (redisAsyncCommandArgv(m_ac, &RedisLane::onReply, call, int(argv.size()), argv.data(),
                              lengths.data()) != REDIS_OK)
        return false;
    call->sentUs = monotonicUs();
    m_inFlight.push_back(call);
    if (!m_timeouts.isActive())
        m_timeouts.start();
    return true;
}

bool RedisLane::connectIfNeeded(QString *error)
{
    if (m_ac)
        return true;
    redisAsyncContext *ac = redisAsyncConnect(m_url.host.toUtf8().constData(), m_url.port);
    if (!ac) {
        *error = u"out of memory"_qs;
        return false;
    }
    if (ac->err) {
        *error = u"cannot connect: %1"_qs.arg(QString::fromUtf8(ac->errstr));
        redisAsyncFree(ac);
        return false;
    }
    redis::guardReader(ac->c.reader);
    m_ac = ac;
    m_failure.clear();
    ac->data = this;
    ac->ev.data = this;
    ac->ev.addRead = &RedisLane::addRead;
    ac->ev.delRead = &RedisLane::delRead;
    ac->ev.addWrite = &RedisLane::addWrite;
    ac->ev.delWrite = &RedisLane::delWrite;
    ac->ev.cleanup = &RedisLane::cleanup;
    // Sent first, so answered before any script.
    QList<QList<QByteArray>> setup;
    if (!m_url.password.isEmpty()) {
        QList<QByteArray> auth{"AUTH"};
        if (!m_url.user.isEmpty())
            auth << m_url.user.toUtf8();
        setup << (auth << m_url.password.toUtf8());
    }
    if (m_url.database != u"0"_qs && !m_url.database.isEmpty())
        setup << QList<QByteArray>{"SELECT", m_url.database.toUtf8()};
    for (const auto &command : setup) {
        redis::Argv a(command);
        redisAsyncCommandArgv(ac, &RedisLane::onSetupReply, this, a.count(), a.argv.data(),
                              a.lengths.data());
    }
    return true;
}

void RedisLane::onReply(redisAsyncContext *ac, void *reply, void *privdata)
{
    auto *call = static_cast<Call *>(privdata);
    call->lane->answered(call, static_cast<const redisReply *>(reply), ac->errstr);
}

void RedisLane::answered(Call *call, const redisReply *reply, const char *contextError)
{
    std::unique_ptr<Call> owned(call);
    if (auto it = std::find(m_inFlight.begin(), m_inFlight.end(), call); it != m_inFlight.end())
        m_inFlight.erase(it);
    if (m_closing)
        return;
    if (!reply) {
        // The connection went away with the call in flight: it may or may not have run.
        const QString why = !m_failure.isEmpty()            ? m_failure
                            : contextError && *contextError ? QString::fromUtf8(contextError)
                                                            : u"connection lost"_qs;
        const Error error =
            makeError(ErrorCode::InDoubt, u"Redis %1: %2"_qs.arg(m_url.display(), why));
        m_health.reportHealth(false, error.message, true); // claims and finishes: writes
        return call->answer(nullptr, &error);
    }
    if (reply->type == REDIS_REPLY_ERROR) {
        const QByteArray message(reply->str, qsizetype(reply->len));
        // The server lost its script cache (restart, SCRIPT FLUSH): the script did not run;
        // sending its source runs it and caches it again.
        if (message.startsWith("NOSCRIPT") && !call->withSource) {
            call->withSource = true;
            if (write(call)) {
                owned.release();
                return;
            }
        }
        const Error error =
            makeError(ErrorCode::Unavailable,
                      u"Redis %1: %2"_qs.arg(m_url.display(), QString::fromUtf8(message)));
        m_health.reportHealth(false, error.message, true); // claims and finishes: writes
        return call->answer(nullptr, &error);
    }
    m_health.reportHealth(true, {}, true);
    call->answer(reply, nullptr);
}

void RedisLane::fail(Call *call, const Error &error)
{
    std::unique_ptr<Call> owned(call);
    m_health.reportHealth(false, error.message, true); // claims and finishes: writes
    call->answer(nullptr, &error);
}

void RedisLane::onSetupReply(redisAsyncContext *, void *reply, void *privdata)
{
    auto *lane = static_cast<RedisLane *>(privdata);
    const auto *r = static_cast<const redisReply *>(reply);
    if (!r || r->type != REDIS_REPLY_ERROR || lane->m_closing)
        return;
    // Wrong password or database: what follows fails with Redis's own error; the connection is
    // dropped (outside hiredis's callback) so that the next call tries again.
    const QString why =
        u"connection set-up refused: %1"_qs.arg(QString::fromUtf8(r->str, int(r->len)));
    QTimer::singleShot(0, lane, [lane, why] { lane->dropConnection(why); });
}

void RedisLane::checkTimeouts()
{
    if (m_inFlight.empty()) {
        m_timeouts.stop();
        return;
    }
    if (monotonicUs() - m_inFlight.front()->sentUs > qint64(m_options.commandTimeoutMs) * 1000)
        dropConnection(u"no answer within %1 ms"_qs.arg(m_options.commandTimeoutMs));
}

void RedisLane::dropConnection(const QString &why)
{
    if (!m_ac)
        return;
    m_failure = why;
    redisAsyncFree(m_ac); // fails what is in flight, then cleanup() forgets the context
    m_ac = nullptr;
}

void RedisLane::watch(QSocketNotifier *RedisLane::*slot, QSocketNotifier::Type type,
                      void (*handle)(redisAsyncContext *), bool on)
{
    QSocketNotifier *&notifier = this->*slot;
    if (!on) {
        if (notifier)
            notifier->setEnabled(false);
        return;
    }
    if (!notifier) {
        notifier = new QSocketNotifier(qintptr(m_ac->c.fd), type, this);
        connect(notifier, &QSocketNotifier::activated, this, [this, handle] {
            if (m_ac)
                handle(m_ac);
        });
    }
    notifier->setEnabled(true);
}

void RedisLane::addRead(void *self)
{
    static_cast<RedisLane *>(self)->watch(&RedisLane::m_read, QSocketNotifier::Read,
                                          redisAsyncHandleRead, true);
}

void RedisLane::delRead(void *self)
{
    static_cast<RedisLane *>(self)->watch(&RedisLane::m_read, QSocketNotifier::Read,
                                          redisAsyncHandleRead, false);
}

void RedisLane::addWrite(void *self)
{
    static_cast<RedisLane *>(self)->watch(&RedisLane::m_write, QSocketNotifier::Write,
                                          redisAsyncHandleWrite, true);
}

void RedisLane::delWrite(void *self)
{
    static_cast<RedisLane *>(self)->watch(&RedisLane::m_write, QSocketNotifier::Write,
                                          redisAsyncHandleWrite, false);
}

void RedisLane::cleanup(void *self)
{
    // hiredis is done with the context (it closes the socket next): forget it. The notifiers may
    // be the ones whose signal is running, so they go from the event loop.
    auto *lane = static_cast<RedisLane *>(self);
    for (QSocketNotifier **n : {&lane->m_read, &lane->m_write}) {
        if (*n) {
            (*n)->setEnabled(false);
            (*n)->deleteLater();
            *n = nullptr;
        }
    }
    lane->m_ac = nullptr;
}

} // namespace idem
