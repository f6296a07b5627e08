#include "support/recordingdownstream.h"

#include "util/clock.h"

#include <QJsonDocument>
#include <QJsonObject>
#include <QPointer>
#include <QTcpServer>
#include <QTcpSocket>
#include <QTimer>

#include <cerrno>
#include <sys/socket.h>

namespace idem::test {

namespace {

qint64 nowMs()
{
    return monotonicUs() / 1000;
}

struct ParsedRequest
{
    QByteArray path;
    QList<QPair<QByteArray, QByteArray>> headers;

    QByteArray header(QByteArrayView name) const
    {
        for (const auto &[n, v] : headers)
            if (QByteArrayView(n).compare(name, Qt::CaseInsensitive) == 0)
                return v;
        return {};
    }
};

// Takes one whole request off the front of `buffer`; false while it has not all arrived.
bool takeRequest(QByteArray &buffer, ParsedRequest &request)
{
    const qsizetype headerEnd = buffer.indexOf("\r\n\r\n");
    if (headerEnd < 0)
        return false;
    const QList<QByteArray> lines = buffer.left(headerEnd).split('\n');
    ParsedRequest parsed;
    const QList<QByteArray> requestLine = lines.first().trimmed().split(' ');
    parsed.path = requestLine.value(1);
    for (qsizetype i = 1; i < lines.size(); ++i) {
        const qsizetype colon = lines.at(i).indexOf(':');
        if (colon > 0)
            parsed.headers.append(
                {lines.at(i).left(colon).trimmed(), lines.at(i).mid(colon + 1).trimmed()});
    }
    const qsizetype length = parsed.header("Content-Length").toLongLong();
    if (buffer.size() < headerEnd + 4 + length)
        return false;
    buffer.remove(0, headerEnd + 4 + length);
    request = std::move(parsed);
    return true;
}

QByteArray statusLine(int status)
{
    const QByteArray reason = status == 200   ? "OK"
                              : status == 500 ? "Internal Server Error"
                                              : "Status";
    return "HTTP/1.1 " + QByteArray::number(status) + ' ' + reason + "\r\n";
}

// True when the peer closed the connection, as far as the kernel knows now: more precise than
// waiting for the disconnected() signal, which may come after other sockets' events.
bool peerClosed(const QTcpSocket *socket)
{
    if (socket->state() != QAbstractSocket::ConnectedState)
        return true;
    char byte;
    const ssize_t n = ::recv(int(socket->socketDescriptor()), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

constexpr int kTrickleBytes = 4; // per step of a trickled body

} // namespace

// Lives on the downstream's thread. One Session per connection from the desk; a connection
// carries one run at a time (the desk's forwarder does not pipeline).
class RecordingServer final : public QObject
{
public:
    RecordingServer(RecordingDownstream &owner, RecordingDownstream::Planner planner)
        : m_owner(owner), m_planner(std::move(planner)), m_server(this)
    {
        connect(&m_server, &QTcpServer::newConnection, this, [this] {
            while (QTcpSocket *socket = m_server.nextPendingConnection())
                new Session(*this, socket);
        });
    }

    quint16 listen()
    {
        m_server.listen(QHostAddress::LocalHost, 0);
        return m_server.serverPort();
    }

private:
    class Session final : public QObject
    {
    public:
        Session(RecordingServer &server, QTcpSocket *socket)
            : QObject(&server), m_server(server), m_socket(socket), m_timer(this)
        {
            socket->setParent(this);
            connect(socket, &QTcpSocket::readyRead, this, [this] {
                m_buffer += m_socket->readAll();
                startRuns();
            });
            connect(socket, &QTcpSocket::disconnected, this, [this] {
                cut();
                deleteLater();
            });
            connect(&m_timer, &QTimer::timeout, this, [this] { answerStep(); });
        }

        bool peerClosed() const { return idem::test::peerClosed(m_socket); }

        // The desk gave up on this run (its timeout, or it died): the run ends now.
        void cut()
        {
            if (m_run < 0)
                return;
            m_timer.stop();
            m_server.endRun(m_run, true, m_answer.left(m_bodySent));
            m_server.m_open.remove(m_run);
            m_run = -1;
        }

    private:
        void startRuns()
        {
            ParsedRequest request;
            while (m_run < 0 && takeRequest(m_buffer, request)) {
                DownstreamRun run;
                run.key = request.header("Idempotency-Key");
                run.token = request.header("Idempotency-Fencing-Token").toLongLong();
                run.instance = request.path.mid(request.path.lastIndexOf('/') + 1);
                run.delivery = request.header("Delivery-Attempt");
                m_run = m_server.startRun(run, this);
                m_plan = run.plan;
                m_answer =
                    QJsonDocument(QJsonObject{{QStringLiteral("key"), QString::fromLatin1(run.key)},
                                              {QStringLiteral("run"), m_run},
                                              {QStringLiteral("token"), run.token},
                                              {QStringLiteral("instance"),
                                               QString::fromLatin1(run.instance)}})
                        .toJson(QJsonDocument::Compact);
                m_bodySent = 0;
                const QByteArray head = statusLine(m_plan.status) +
                                        "Content-Type: application/json\r\nContent-Length: " +
                                        QByteArray::number(m_answer.size()) + "\r\n\r\n";
                if (m_plan.kind == RunPlan::Kind::Trickle) {
                    m_socket->write(head); // the status line at once, the body piece by piece
                    m_head.clear();
                } else {
                    m_head = head;
                }
                m_timer.setSingleShot(m_plan.kind == RunPlan::Kind::Answer);
                m_timer.start(m_plan.delayMs);
            }
        }

        // Sends the answer, or the next piece of a trickled one. The run ends as its last byte
        // leaves: recorded first, so whoever reads that byte finds the run ended.
        void answerStep()
        {
            if (m_run < 0)
                return;
            const qsizetype step =
                m_plan.kind == RunPlan::Kind::Answer ? m_answer.size() : kTrickleBytes;
            const QByteArray piece = m_head + m_answer.mid(m_bodySent, step);
            m_head.clear();
            m_bodySent = std::min(m_answer.size(), m_bodySent + step);
            if (m_bodySent == m_answer.size()) {
                m_timer.stop();
                m_server.endRun(m_run, false, m_answer);
                m_server.m_open.remove(m_run);
                m_run = -1;
            }
            m_socket->write(piece);
            m_socket->flush();
            if (m_run < 0)
                startRuns(); // a request that came while this one was answered
        }

        RecordingServer &m_server;
        QTcpSocket *m_socket;
        QTimer m_timer;
        QByteArray m_buffer;
        int m_run = -1; // index into the recorded runs; -1 between runs
        RunPlan m_plan;
        QByteArray m_head;
        QByteArray m_answer;
        qsizetype m_bodySent = 0;
    };

    int startRun(DownstreamRun &run, Session *session)
    {
        // Earlier runs of this key whose desk has already let go of them end before this one
        // starts, even when their sockets' close events have not been handled yet.
        QList<Session *> released;
        {
            std::lock_guard lock(m_owner.m_mutex);
            for (auto it = m_open.cbegin(); it != m_open.cend(); ++it)
                if (it.value() && m_owner.m_runs.at(it.key()).key == run.key &&
                    it.value()->peerClosed())
                    released.append(it.value());
        }
        for (Session *other : released)
            other->cut();
        std::lock_guard lock(m_owner.m_mutex);
        int earlier = 0;
        for (const DownstreamRun &r : m_owner.m_runs)
            earlier += r.key == run.key;
        run.plan = m_planner(run.key, earlier);
        run.startMs = nowMs();
        m_owner.m_runs.append(run);
        const int index = int(m_owner.m_runs.size() - 1);
        m_open.insert(index, session);
        return index;
    }

    void endRun(int index, bool cut, const QByteArray &body)
    {
        std::lock_guard lock(m_owner.m_mutex);
        DownstreamRun &run = m_owner.m_runs[index];
        run.endMs = nowMs();
        run.cut = cut;
        run.body = body;
    }

    RecordingDownstream &m_owner;
    RecordingDownstream::Planner m_planner;
    QTcpServer m_server;
    QHash<int, QPointer<Session>> m_open; // run index → the session answering it
};

RecordingDownstream::RecordingDownstream(Planner planner)
{
    m_server = new RecordingServer(*this, std::move(planner));
    m_server->moveToThread(&m_thread);
    m_thread.setObjectName(QStringLiteral("recording downstream"));
    m_thread.start();
    QMetaObject::invokeMethod(
        m_server, [this] { m_port = m_server->listen(); }, Qt::BlockingQueuedConnection);
}

RecordingDownstream::~RecordingDownstream()
{
    QMetaObject::invokeMethod(
        m_server, [this] { delete m_server; }, Qt::BlockingQueuedConnection);
    m_thread.quit();
    m_thread.wait();
}

QUrl RecordingDownstream::url(const QString &instance) const
{
    return QUrl(QStringLiteral("http://127.0.0.1:%1/run/%2").arg(m_port).arg(instance));
}

QList<DownstreamRun> RecordingDownstream::runs() const
{
    std::lock_guard lock(m_mutex);
    return m_runs;
}

int RecordingDownstream::openRuns(const QByteArray &instance) const
{
    std::lock_guard lock(m_mutex);
    int open = 0;
    for (const DownstreamRun &r : m_runs)
        open += r.instance == instance && r.endMs < 0;
    return open;
}

} // namespace idem::test
