// Config files, store URLs and listen addresses: any bytes give a config or an error, never a crash.
#include "config/config.h"
#include "store/storeurl.h"

#include <QJsonDocument>

#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const QByteArray bytes(reinterpret_cast<const char *>(data), qsizetype(size));
    auto config = idem::Config::parse(bytes, QStringLiteral("fuzz.json"));
    if (config) {
        // What parses must print and parse back the same.
        const QJsonObject json = config->toJson();
        auto again = idem::Config::parse(QJsonDocument(json).toJson(), QStringLiteral("again"));
        if (!again || again->toJson() != json)
            __builtin_trap();
    }
    const QString text = QString::fromUtf8(bytes);
    (void)idem::StoreUrl::parse(text);
    (void)idem::ListenAddress::parse(text);
    return 0;
}
