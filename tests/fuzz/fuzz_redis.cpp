// Every parser of a Redis answer on arbitrary replies, as a hostile or broken server (a shared
// store, a man in the middle) could send them. Input: one byte choosing the parser, then RESP
// bytes, read into replies by hiredis's own reader.
#include "store/rediscluster.h"
#include "store/redisprotocol.h"

#include <hiredis.h>

#include <cstddef>
#include <cstdint>

namespace {
idem::ClaimRequest claimRequest()
{
    idem::ClaimRequest c;
    c.key = QStringLiteral("ep:fuzz");
    c.endpoint = QStringLiteral("ep");
    c.provider = QStringLiteral("generic");
    c.fingerprint = "f";
    c.request = {"POST", "/hooks/ep", {{"X-A", "1"}}, "{}"};
    return c;
}

void parse(uint8_t which, const redisReply *reply)
{
    static const idem::ClaimRequest claim = claimRequest();
    switch (which % 6) {
    case 0:
        (void)idem::redis::claimResult(reply, claim);
        break;
    case 1:
        (void)idem::redis::finishVerdict(reply);
        (void)idem::redis::operatorVerdict(reply);
        (void)idem::redis::importVerdict(reply);
        break;
    case 2:
        (void)idem::redis::deliveryFrom(reply);
        for (size_t i = 0; reply->type == REDIS_REPLY_ARRAY && i < reply->elements; ++i)
            (void)idem::redis::deliveryFrom(reply->element[i]);
        break;
    case 3: {
        QHash<QByteArray, QByteArray> meta;
        (void)idem::redis::metaFrom(idem::redis::text(reply), meta);
        (void)idem::redis::recordFrom(claim.key, idem::redis::fieldsFrom(reply));
        break;
    }
    case 4:
        (void)idem::redis::SlotMap::fromClusterSlots(reply);
        break;
    case 5:
        (void)idem::redis::SlotMoves::fromClusterNodes(idem::redis::text(reply));
        break;
    }
}
} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    redisReader *reader = redisReaderCreate();
    idem::redis::guardReader(reader); // as the desk's links read
    redisReaderFeed(reader, reinterpret_cast<const char *>(data + 1), size - 1);
    void *reply = nullptr;
    for (int i = 0; i < 16 && redisReaderGetReply(reader, &reply) == REDIS_OK && reply; ++i) {
        parse(data[0], static_cast<const redisReply *>(reply));
        freeReplyObject(reply);
        reply = nullptr;
    }
    redisReaderFree(reader);
    return 0;
}
