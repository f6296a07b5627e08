#pragma once

#include "util/result.h"

#include <QFile>
#include <QString>

#include <memory>

class QTemporaryFile;

namespace idem {

// A file an export writes (`keys export --output`, the window's Export): whole or not at all,
// and readable by its owner alone (0600, as the stores' own files are), since it holds every
// stored request and result.
//
// A regular file at the path, or none, is replaced on commit() by a new 0600 file written beside
// it under a temporary name and renamed over it: rename(2) replaces a symbolic link put there
// meanwhile, never the file the link points to. An existing FIFO (`--output >(gzip > f)`) or
// character device (/dev/null, a terminal) is written in place, through a symbolic link too.
// Refused with the reason: a symbolic link to a regular file or to nothing (an export never
// writes through a link planted where its file was expected), a directory, a block device,
// anything else. Not thread-safe; one file per object.
class PrivateFile final
{
public:
    PrivateFile();
    ~PrivateFile(); // without commit(): nothing is replaced, the temporary file removed
    PrivateFile(const PrivateFile &) = delete;
    PrivateFile &operator=(const PrivateFile &) = delete;

    Result<void> open(const QString &path);
    QIODevice *device(); // after open() succeeded
    // Everything written reached the file (fsync), then the file took the path's place.
    Result<void> commit();

private:
    QString m_path;
    std::unique_ptr<QTemporaryFile> m_replacement;
    QFile m_inPlace;
};

} // namespace idem
