#include "util/privatefile.h"

#include <QFileInfo>
#include <QTemporaryFile>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace idem {

namespace {

Error refused(const QString &path, const QString &why)
{
    return makeError(ErrorCode::Invalid, u"%1: %2"_qs.arg(path, why));
}

bool writtenInPlace(mode_t mode)
{
    return S_ISFIFO(mode) || S_ISCHR(mode);
}

} // namespace

PrivateFile::PrivateFile() = default;
PrivateFile::~PrivateFile() = default;

Result<void> PrivateFile::open(const QString &path)
{
    m_path = path;
    if (path.isEmpty())
        return makeError(ErrorCode::Invalid, u"names no file"_qs);
    const QByteArray name = QFile::encodeName(path);
    struct stat entry = {};
    bool exists = true;
    if (::lstat(name.constData(), &entry) != 0) {
        if (errno != ENOENT)
            return refused(path, QString::fromLocal8Bit(std::strerror(errno)));
        exists = false;
    }
    if (exists && S_ISLNK(entry.st_mode)) {
        struct stat target = {};
        if (::stat(name.constData(), &target) != 0 || !writtenInPlace(target.st_mode))
            return refused(path, u"is a symbolic link: not followed (give the file's own path)"_qs);
        entry = target;
    }
    if (exists && writtenInPlace(entry.st_mode)) {
        // Opened without O_CREAT or O_TRUNC and checked again once open: what was swapped in
        // since is refused untouched.
        const int fd = ::open(name.constData(), O_WRONLY | O_NOCTTY | O_CLOEXEC);
        struct stat opened = {};
        if (fd < 0)
            return refused(path, QString::fromLocal8Bit(std::strerror(errno)));
        if (::fstat(fd, &opened) != 0 || !writtenInPlace(opened.st_mode)) {
            ::close(fd);
            return refused(path, u"changed while it was opened"_qs);
        }
        if (!m_inPlace.open(fd, QIODevice::WriteOnly, QFileDevice::AutoCloseHandle)) {
            ::close(fd);
            return refused(path, m_inPlace.errorString());
        }
        return Ok{};
    }
    if (exists && S_ISDIR(entry.st_mode))
        return refused(path, u"is a directory"_qs);
    if (exists && !S_ISREG(entry.st_mode))
        return refused(path, u"is not a regular file, a FIFO or a character device"_qs);
    // QTemporaryFile creates its file with O_EXCL, mode 0600.
    m_replacement = std::make_unique<QTemporaryFile>(path + u".XXXXXX"_qs);
    if (!m_replacement->open())
        return refused(path, m_replacement->errorString());
    return Ok{};
}

QIODevice *PrivateFile::device()
{
    return m_replacement ? static_cast<QIODevice *>(m_replacement.get()) : &m_inPlace;
}

Result<void> PrivateFile::commit()
{
    if (!m_replacement) {
        if (!m_inPlace.flush() || m_inPlace.error() != QFileDevice::NoError)
            return refused(m_path, m_inPlace.errorString());
        return Ok{};
    }
    if (!m_replacement->flush() || m_replacement->error() != QFileDevice::NoError ||
        ::fsync(m_replacement->handle()) != 0)
        return refused(m_path, m_replacement->errorString());
    if (::rename(QFile::encodeName(m_replacement->fileName()).constData(),
                 QFile::encodeName(m_path).constData()) != 0)
        return refused(m_path, QString::fromLocal8Bit(std::strerror(errno)));
    m_replacement->setAutoRemove(false);
    m_replacement.reset();
    return Ok{};
}

} // namespace idem
