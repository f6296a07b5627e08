#pragma once

#include "config/config.h"
#include "util/result.h"

#include <QStringList>

namespace idem::cli {

// Options shared by every command (SPEC §1).
struct CommonOptions
{
    Config config;
    QString storeUrl;
    bool allowRemote = false;
};

// Loads --config (or the built-in config) and applies --store / --listen; errors are usage
// errors (exit 2).
Result<CommonOptions> loadCommon(const QString &configPath, const QString &store,
                                 const QString &listen, bool allowRemote);

int serve(const QStringList &arguments);
int gui(int argc, char **argv, const QStringList &arguments);

} // namespace idem::cli
