#include "support/pgdiskfull.h"

#include <QProcess>

#include <utility>

namespace idem::test {

namespace {
// psql on the test server: whether it succeeded (why not goes to stderr); its output in `out`.
bool psql(const QStringList &args, QByteArray *out = nullptr)
{
    QProcess p;
    p.start(u"psql"_qs, QStringList{qEnvironmentVariable("IDEM_TEST_POSTGRES_URL")} + args);
    if (!p.waitForFinished(20'000))
        return false;
    if (p.exitCode() != 0)
        qWarning("psql: %s", p.readAllStandardError().constData());
    if (out)
        *out = p.readAllStandardOutput();
    return p.exitCode() == 0;
}

bool run(const QString &statements)
{
    return psql({u"-v"_qs, u"ON_ERROR_STOP=1"_qs, u"-qc"_qs, statements});
}
} // namespace

PgDiskFull::PgDiskFull(const QString &endpoint, const QStringList &on, int perTransaction)
    : m_tag(u"idem_full_"_qs + endpoint)
{
    static constexpr const char16_t *kRefuse =
        u" RAISE EXCEPTION 'could not extend file: No space left on device'"
        u" USING ERRCODE = 'disk_full';";
    QString sql =
        u"CREATE TABLE %1_tx (xid bigint PRIMARY KEY, n int);"
        u" CREATE TABLE %1_mode (refuse boolean); INSERT INTO %1_mode VALUES (true);"
        u" CREATE FUNCTION %1() RETURNS trigger LANGUAGE plpgsql AS $$ DECLARE c int; BEGIN"
        u" IF (SELECT refuse FROM %1_mode) THEN%2 END IF;"
        u" INSERT INTO %1_tx VALUES (txid_current(), 1)"
        u" ON CONFLICT (xid) DO UPDATE SET n = %1_tx.n + 1 RETURNING n INTO c;"
        u" IF %3 > 0 AND c > %3 THEN%2 END IF;"
        u" RETURN NEW; END $$;"_qs.arg(m_tag, QString::fromUtf16(kRefuse))
            .arg(perTransaction);
    for (qsizetype i = 0; i < on.size(); ++i) {
        sql += u" CREATE TRIGGER %1_%2 BEFORE %3 FOR EACH ROW WHEN (NEW.endpoint = '%4')"
               u" EXECUTE FUNCTION %1();"_qs.arg(m_tag)
                   .arg(i)
                   .arg(on.at(i), endpoint);
        m_drop +=
            u"DROP TRIGGER %1_%2 ON %3; "_qs.arg(m_tag).arg(i).arg(on.at(i).section(u' ', -1));
    }
    m_drop += u"DROP FUNCTION %1(); DROP TABLE %1_tx, %1_mode;"_qs.arg(m_tag);
    m_ok = run(sql);
}

bool PgDiskFull::allow()
{
    return run(u"UPDATE %1_mode SET refuse = false"_qs.arg(m_tag));
}

void PgDiskFull::lift()
{
    if (std::exchange(m_ok, false))
        run(m_drop);
}

int PgDiskFull::logged(const QString &endpoint)
{
    QByteArray rows;
    psql({u"-Atc"_qs,
          u"SELECT count(*) FROM idem_deliveries WHERE endpoint = '%1'"_qs.arg(endpoint)},
         &rows);
    return rows.trimmed().toInt();
}

} // namespace idem::test
