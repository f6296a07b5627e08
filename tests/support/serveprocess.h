#pragma once

#include <QByteArray>
#include <QProcess>
#include <QStringList>

#include <functional>
#include <memory>

namespace idem::test {

// `idemdesk serve --listen 127.0.0.1:0 ARGS…` as a child process; `port` is read from its first
// stderr line (0 when it did not start; what it printed is in `stderrText`). Its stdout is
// discarded unless `keepStdout`. A non-empty `environment` replaces the inherited one (e.g. to
// run it under libfaketime). A non-zero `openFiles` is its open-file limit, soft and hard (ulimit
// -n). A `stdoutFd` of 0 or more is its stdout instead (a pipe the test holds, read or not).
std::unique_ptr<QProcess> startServe(const QString &binary, const QStringList &args, quint16 &port,
                                     QByteArray *stderrText = nullptr, bool keepStdout = false,
                                     const QProcessEnvironment &environment = {}, int openFiles = 0,
                                     int stdoutFd = -1);

// Key i's request body and event type (empty: none), when the generators below are given one;
// else every key has `body` and no type.
using KeyVariation = std::function<void(int i, QByteArray &body, QByteArray &type)>;

// One million (or `count`) keys written straight into a SQLite store's file, for the dashboard's
// scale test and benchmark: three completed for every failed one, newest last.
void generateSqliteKeys(const QString &path, int count, const QByteArray &body = {},
                        const KeyVariation &vary = {});

// `count` keys of Redis layout v4 written straight into the Redis or Redis Cluster of `url` (its
// prefix), as claim.lua + finish.lua leave them (records with their Redis expiry, their buckets'
// k, s:<ep>:failed and eps, layout "4"), pipelined to each master: a million in seconds,
// where the scripts through the desk take minutes. Spread over `endpoints` endpoints ("big" for
// one, "big0"…); three completed for every failed one, newest last; the oldest `expiredPercent`
// past their expiry but not yet purged. Returns the error, empty when all were written.
QString generateRedisKeys(const QString &url, int count, int endpoints = 1, int expiredPercent = 0,
                          const QByteArray &body = {}, const KeyVariation &vary = {});

} // namespace idem::test
