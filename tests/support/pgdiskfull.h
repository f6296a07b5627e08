#pragma once

#include <QString>
#include <QStringList>

namespace idem::test {

// A full disk on the test PostgreSQL (IDEM_TEST_POSTGRES_URL), for one endpoint's rows only
// (other tests share the tables): each of its rows written as `on` says ("INSERT OR UPDATE ON
// idem_keys") is refused as PostgreSQL refuses it when it cannot extend a file, until allow();
// then, with `perTransaction`, still a transaction's rows past that many (room for some rows, not
// all). Undone when it goes.
class PgDiskFull
{
public:
    PgDiskFull(const QString &endpoint, const QStringList &on, int perTransaction = 0);
    ~PgDiskFull() { lift(); }
    PgDiskFull(const PgDiskFull &) = delete;
    PgDiskFull &operator=(const PgDiskFull &) = delete;
    bool ok() const { return m_ok; }
    bool allow();
    void lift(); // the fault gone
    // The endpoint's entries in the delivery log.
    static int logged(const QString &endpoint);

private:
    QString m_tag;
    QString m_drop;
    bool m_ok = false;
};

} // namespace idem::test
