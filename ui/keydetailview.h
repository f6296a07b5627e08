#pragma once

#include "model/keyrecord.h"

#include <QWidget>

class QCheckBox;
class QLabel;
class QPlainTextEdit;
class QTabWidget;
class QTableView;
class QTableWidget;

namespace idem {

class TimelineModel;

// The selected key: its summary, stored request (headers masked; body as highlighted JSON or
// raw), stored result, error, history (the audit trail of operator actions too), the delivery
// timeline, and for a 422 the difference between the stored and the refused payload.
class KeyDetailView final : public QWidget
{
    Q_OBJECT
public:
    explicit KeyDetailView(QWidget *parent = nullptr);

    void showKey(const KeyRecord &record, const QList<DeliveryEvent> &newestFirst);
    // The store's clock minus this machine's: TTL and lease are shown on the store's clock.
    void setClockOffsetMs(qint64 offset) { m_clockOffsetMs = offset; }
    // Both messages are plain text (they quote keys and store errors), shown as such.
    void showNothing(const QString &message);
    void showActionResult(const QString &message, bool ok);
    QString currentKey() const { return m_key; }
    QString summaryText() const; // the header above the tabs, as shown (rich text)
    const KeyRecord &current() const { return m_record; }
    TimelineModel *timeline() const { return m_timeline; }
    QTabWidget *tabs() const { return m_tabs; }
    QString historyText() const;
    QString diffText() const;
    QPlainTextEdit *requestBodyView() const { return m_requestBody; }

private:
    void renderBodies();
    static void fillHeaders(QTableWidget *table, const HeaderList &headers);

    QString m_key;
    KeyRecord m_record;
    QByteArray m_mismatchPayload;
    QString m_historyText;
    QList<DeliveryEvent> m_events; // as the timeline shows them
    QLabel *m_title;
    QLabel *m_summary;
    QLabel *m_banner;
    QTabWidget *m_tabs;
    QTableWidget *m_requestHeaders;
    QPlainTextEdit *m_requestBody;
    QLabel *m_resultStatus;
    QTableWidget *m_resultHeaders;
    QPlainTextEdit *m_resultBody;
    QPlainTextEdit *m_history;
    TimelineModel *m_timeline;
    QTableView *m_timelineView;
    QPlainTextEdit *m_diff;
    QCheckBox *m_raw;
    int m_diffTab = -1;
    qint64 m_clockOffsetMs = 0;
};

} // namespace idem
