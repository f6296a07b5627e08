#include "store/idempotencystore.h"

#include <algorithm>
#include <array>

namespace idem {

namespace {

// One pass over a key glob: `any` for '*', `one` for '?', `set(negated, members)` for a
// bracket expression (members as written, a leading ']' included), `literal` for the rest.
template <typename Any, typename One, typename Set, typename Literal>
void walkGlob(const QString &glob, Any any, One one, Set set, Literal literal)
{
    for (qsizetype i = 0; i < glob.size(); ++i) {
        const QChar c = glob.at(i);
        if (c == u'*') {
            any();
        } else if (c == u'?') {
            one();
        } else if (c == u'[') {
            qsizetype first = i + 1;
            const bool negated =
                first < glob.size() && (glob.at(first) == u'!' || glob.at(first) == u'^');
            if (negated)
                ++first;
            const qsizetype close = glob.indexOf(u']', first + 1); // a ']' first is a member
            if (first >= glob.size() || close < 0) {
                literal(c);
                continue;
            }
            set(negated, QStringView(glob).mid(first, close - first));
            i = close;
        } else {
            literal(c);
        }
    }
}

bool plainAscii(QChar c)
{
    return (c >= u'a' && c <= u'z') || (c >= u'A' && c <= u'Z') || (c >= u'0' && c <= u'9');
}

} // namespace

QString keyGlobToRegex(const QString &glob)
{
    // A backslash before any other ASCII character than a letter or digit makes it literal in
    // both dialects, in a bracket expression too.
    const auto escaped = [](QChar c) {
        return plainAscii(c) || c.unicode() > 0x7f ? QString(c) : u"\\"_qs + c;
    };
    QString re;
    walkGlob(
        glob, [&] { re += u".*"_qs; }, [&] { re += u'.'; },
        [&](bool negated, QStringView members) {
            re += negated ? u"[^"_qs : u"["_qs;
            for (qsizetype i = 0; i < members.size(); ++i) {
                const QChar c = members.at(i);
                // a range's '-' stays one, a '-' first or last is literal either way
                re += c == u'-' ? QString(c) : escaped(c);
            }
            re += u']';
        },
        [&](QChar c) { re += escaped(c); });
    return re;
}

QString keyGlobToSqlite(const QString &glob)
{
    QString pattern;
    walkGlob(
        glob, [&] { pattern += u'*'; }, [&] { pattern += u'?'; },
        [&](bool negated, QStringView members) {
            pattern += (negated ? u"[^"_qs : u"["_qs) + members.toString() + u']';
        },
        [&](QChar c) {
            if (c == u'*' || c == u'?' || c == u'[')
                pattern += u'[' + QString(c) + u']';
            else
                pattern += c;
        });
    return pattern;
}

KeyRecord claimedRecord(const KeyRecord *current, const ClaimRequest &req, const ClaimDecision &decision,
                        qint64 token, qint64 nowMs)
{
    const bool fresh = decision.action == ClaimAction::Create;
    KeyRecord r = fresh || !current ? KeyRecord{} : *current; // a reclaim keeps created, attempts, history
    r.key = req.key;
    r.endpoint = req.endpoint;
    r.provider = req.provider;
    r.type = req.type;
    r.state = KeyState::Processing;
    r.fingerprint = req.fingerprint;
    r.token = token;
    r.attempts = fresh ? 1 : r.attempts + 1;
    if (fresh)
        r.createdMs = nowMs;
    r.updatedMs = nowMs;
    r.leaseUntilMs = nowMs + req.policy.leaseMs;
    r.expiresAtMs = nowMs + req.policy.ttlMs;
    r.request = req.request;
    r.result = {};
    r.error.clear();
    const QString event = decision.outcome == Outcome::Recovered     ? u"recovered"_qs
                          : decision.outcome == Outcome::Reprocessed ? u"reprocessed"_qs
                                                                     : u"claimed"_qs;
    appendHistory(r.history, {nowMs, event, token, {}});
    return r;
}

std::optional<ListPosition> ListPosition::parse(const QString &text)
{
    const qsizetype colon = text.indexOf(u':');
    bool ok = false;
    const qint64 updated = text.left(colon).toLongLong(&ok);
    if (colon < 0 || !ok)
        return std::nullopt;
    return ListPosition{updated, text.mid(colon + 1)};
}

Error badListPosition(const QString &after)
{
    return makeError(ErrorCode::Invalid,
                     u"'%1' is not where a page of this store's keys stopped (give what the last "
                     u"page said to go on from)"_qs.arg(after.left(80)));
}

QByteArray searchNeedle(const QString &text)
{
    QByteArray needle = text.toUtf8();
    for (char &c : needle)
        if (c >= 'A' && c <= 'Z')
            c = char(c - 'A' + 'a');
    return needle;
}

bool bodyContains(QByteArrayView body, QByteArrayView needle)
{
    // Boyer-Moore-Horspool on ASCII-folded bytes: a page of a search reads megabytes of bodies.
    const qsizetype m = needle.size(), n = body.size();
    if (m == 0)
        return true;
    if (m > n)
        return false;
    const auto fold = [](char c) { return c >= 'A' && c <= 'Z' ? char(c - 'A' + 'a') : c; };
    std::array<qsizetype, 256> skip;
    skip.fill(m);
    for (qsizetype i = 0; i + 1 < m; ++i) {
        const uchar c = uchar(needle[i]);
        skip[c] = m - 1 - i;
        if (c >= 'a' && c <= 'z')
            skip[c - 'a' + 'A'] = m - 1 - i;
    }
    for (qsizetype at = 0; at <= n - m; at += skip[uchar(body[at + m - 1])]) {
        qsizetype i = m - 1;
        while (i >= 0 && fold(body[at + i]) == needle[i])
            --i;
        if (i < 0)
            return true;
    }
    return false;
}

Result<KeyPage> IdempotencyStore::findKeys(const KeyQuery &query)
{
    if (!query.search.isEmpty())
        return makeError(ErrorCode::Invalid, u"this store cannot search the stored bodies"_qs);
    KeyQuery q = query;
    bool ok = query.after.isEmpty();
    q.offset = ok ? 0 : query.after.toInt(&ok);
    if (!ok || q.offset < 0)
        return badListPosition(query.after);
    q.limit = query.limit + 1; // one more says whether there is a next page
    auto page = listKeys(q);
    if (!page)
        return page.error();
    KeyPage found;
    found.scanned = page->size();
    if (page->size() > query.limit) {
        page->removeLast();
        found.next = QString::number(q.offset + query.limit);
    }
    found.records = std::move(*page);
    return found;
}

Result<qint64> resetFailedKeys(IdempotencyStore &store, const QString &endpoint, const QString &detail,
                               const std::function<void(const QString &)> &onReset)
{
    qint64 reset = 0;
    KeyQuery q;
    q.state = KeyState::Failed;
    q.endpoint = endpoint;
    q.limit = 500;
    for (;;) {
        auto page = store.listKeys(q);
        if (!page)
            return page.error();
        const qint64 before = reset;
        for (const KeyRecord &r : *page) {
            auto verdict = store.applyOperator(r.key, OperatorAction::Reset, false, detail);
            if (!verdict)
                return verdict.error();
            if (*verdict == OperatorVerdict::Accept) {
                ++reset;
                if (onReset)
                    onReset(r.key);
            }
        }
        // Reset keys leave the failed list; a page with none reset (all taken by others) ends it.
        if (page->isEmpty() || reset == before)
            return reset;
    }
}

Result<QList<ClaimResult>> IdempotencyStore::claimBatch(const QList<ClaimRequest> &requests)
{
    QList<ClaimResult> results;
    for (const ClaimRequest &request : requests) {
        auto r = claim(request);
        if (!r)
            return r.error();
        results.append(std::move(*r));
    }
    return results;
}

Result<QList<FinishVerdict>> IdempotencyStore::finishBatch(const QList<FinishRequest> &requests)
{
    QList<FinishVerdict> verdicts;
    for (const FinishRequest &request : requests) {
        auto v = finish(request);
        if (!v)
            return v.error();
        verdicts.append(*v);
    }
    return verdicts;
}

Result<ClaimResult> IdempotencyStore::answerUnwritten(const ClaimRequest &request,
                                                      const Error &refused)
{
    // InDoubt (the connection lost during the write): the read would go the same way.
    if (refused.code != ErrorCode::Unavailable)
        return refused;
    auto current = key(request.key);
    auto now = clockMs(); // after the read: a lease that ended in between is not in progress
    if (!current || !now)
        return refused;
    ClaimResult result;
    result.storeNowMs = *now;
    result.decision = decideClaim(current->has_value() ? &current->value() : nullptr,
                                  request.fingerprint, *now, request.policy);
    if (result.claimed()) // taking the key is a write
        return refused;
    result.record = std::move(current->value());
    if (result.decision.action != ClaimAction::Mismatch) // a mismatch is never counted
        result.uncounted = refused.message;
    return result;
}

Result<QList<ClaimResult>> IdempotencyStore::answerUnwritten(const QList<ClaimRequest> &requests,
                                                             const Error &refused)
{
    QList<ClaimResult> results;
    for (const ClaimRequest &request : requests) {
        auto r = answerUnwritten(request, refused);
        if (!r)
            return r.error();
        results.append(std::move(*r));
    }
    return results;
}

namespace {

// Each distinct ref once, its content made by `content` from the first request naming it.
template <typename Request, typename Ref, typename Content, typename Ttl>
QList<SharedContent> distinctShared(const QList<Request> &requests, Ref ref, Content content,
                                    Ttl ttl)
{
    QList<SharedContent> shared;
    for (const Request &r : requests) {
        const QByteArray &name = ref(r);
        if (name.isEmpty())
            continue;
        const qint64 ttlMs = ttl(r) + kSharedGraceMs;
        const auto same = std::find_if(shared.begin(), shared.end(),
                                       [&](const SharedContent &s) { return s.ref == name; });
        if (same != shared.end())
            same->ttlMs = std::max(same->ttlMs, ttlMs);
        else
            shared.append({name, content(r), ttlMs});
    }
    return shared;
}

} // namespace

StoredResult storedForm(const StoredResult &result, bool shared)
{
    if (!shared || result.ref.isEmpty())
        return result;
    return {result.status, {}, {}, result.ref};
}

QList<SharedContent> sharedContentOf(const QList<ClaimRequest> &requests)
{
    return distinctShared(
        requests, [](const ClaimRequest &r) -> const QByteArray & { return r.request.headersRef; },
        [](const ClaimRequest &r) { return headersJson(r.request.headers); },
        [](const ClaimRequest &r) { return r.policy.ttlMs; });
}

QList<SharedContent> sharedContentOf(const QList<FinishRequest> &requests)
{
    return distinctShared(
        requests, [](const FinishRequest &r) -> const QByteArray & { return r.result.ref; },
        [](const FinishRequest &r) { return sharedResultContent(r.result); },
        [](const FinishRequest &r) { return r.ttlMs; });
}

Result<std::optional<QByteArray>> IdempotencyStore::sharedContent(const QByteArray &ref,
                                                                  const SharedReader &read)
{
    for (const auto &[name, content] : std::as_const(m_sharedRead))
        if (name == ref)
            return std::optional<QByteArray>(content);
    auto content = read(ref);
    if (!content || !content->has_value())
        return content;
    constexpr qsizetype kRemembered = 4; // a batch's headers and its result, and the last batch's
    if (m_sharedRead.size() >= kRemembered)
        m_sharedRead.removeFirst();
    m_sharedRead.append({ref, **content});
    return content;
}

Result<void> IdempotencyStore::resolveShared(StoredResult &result, const SharedReader &read)
{
    if (result.ref.isEmpty())
        return {};
    auto content = sharedContent(result.ref, read);
    if (!content)
        return content.error();
    if (content->has_value())
        fillSharedResult(result, **content);
    return {};
}

Result<void> IdempotencyStore::fillReplayedFailures(QList<ClaimResult> &results,
                                                    const SharedReader &read)
{
    for (ClaimResult &r : results)
        if (r.decision.action == ClaimAction::Replay && r.record.state != KeyState::Completed)
            if (auto filled = resolveShared(r.record.result, read); !filled)
                return filled;
    return {};
}

Result<void> IdempotencyStore::resolveShared(KeyRecord &record, const SharedReader &read)
{
    StoredRequest &request = record.request;
    if (!request.headersRef.isEmpty()) {
        auto content = sharedContent(request.headersRef, read);
        if (!content)
            return content.error();
        if (content->has_value()) {
            request.headers = headersFromJson(parseJsonArray(**content));
            request.headersRef.clear();
        }
    }
    return resolveShared(record.result, read);
}

Result<void> IdempotencyStore::schemaCurrent(const QString &store, qint64 have, qint64 want)
{
    if (have != want)
        return makeError(
            ErrorCode::Internal,
            u"the %1 schema is at version %2, this desk reads and writes version %3"_qs.arg(store)
                .arg(have)
                .arg(want));
    return {};
}

} // namespace idem
