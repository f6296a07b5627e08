#pragma once

#include <QtGlobal>

#include <algorithm>

namespace idem {

// A token bucket on the process's monotonic clock (milliseconds): `burst` takes at once, then
// `perMinute`. It starts full.
class TokenBucket
{
public:
    TokenBucket(double burst, double perMinute, qint64 nowMs)
        : m_burst(burst), m_perMs(perMinute / 60'000), m_tokens(burst), m_refillMs(nowMs)
    {}

    // Whether one more is allowed now; if so it is taken.
    bool take(qint64 nowMs)
    {
        if (nowMs > m_refillMs) { // a clock that does not move on adds nothing
            m_tokens = std::min(m_burst, m_tokens + double(nowMs - m_refillMs) * m_perMs);
            m_refillMs = nowMs;
        }
        if (m_tokens < 1)
            return false;
        m_tokens -= 1;
        return true;
    }

private:
    double m_burst;
    double m_perMs;
    double m_tokens;
    qint64 m_refillMs;
};

} // namespace idem
