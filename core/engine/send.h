#pragma once

#include "config/config.h"
#include "providers/provider.h"
#include "util/result.h"

#include <optional>

namespace idem {

// Send test event (the window's dialog and `idemdesk send`): one delivery composed from a
// provider's template, or a body the user wrote, signed exactly as the provider signs, sent to
// a running receiver once or N times (identical copies: duplicates of one event).

// A new event of `templateName` (empty: the provider's first) for `endpoint`, unsigned; with a
// `body` that replaces the template's (the id headers stay, fresh). Invalid for an unknown
// provider or template.
Result<OutgoingDelivery> composeTestEvent(const EndpointConfig &endpoint,
                                          const QString &templateName,
                                          const std::optional<QByteArray> &body = std::nullopt);

struct SentAnswer
{
    int status = 0;     // 0: no answer (error says why)
    QByteArray outcome; // Idempotency-Outcome
    QByteArray key;     // Idempotency-Key
    QByteArray body;
    QString error;
    // The desk refused it or the processing failed: no answer, 4xx but a duplicate's 409, 5xx.
    bool rejected() const { return status == 0 || (status >= 400 && status != 409); }
};

struct SendTarget
{
    QByteArray host = "127.0.0.1"; // IPv4
    quint16 port = 8787;
    int timeoutMs = 35000; // above the default forward timeout
};

// Signs `delivery` now and sends it `copies` times, one after the other, to /hooks/<endpoint>.
// Blocks: run it on a worker thread (or the CLI's), never the GUI thread. Invalid when it
// cannot be signed. `onAnswer` hears each answer as it comes (copy index from 0).
Result<QList<SentAnswer>>
sendTestEvent(const SendTarget &target, const EndpointConfig &endpoint, OutgoingDelivery delivery,
              int copies, const std::function<void(int copy, const SentAnswer &)> &onAnswer = {});

} // namespace idem
