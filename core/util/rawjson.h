#pragma once

#include "util/result.h"

#include <QByteArray>
#include <QList>
#include <QString>

namespace idem {

// One object of a JSON array: the bytes the sender wrote, and a canonical form of them.
struct RawJsonObject
{
    QByteArray raw; // from its '{' to its '}', as sent
    // Members sorted by name (code point order) at every depth, no whitespace, strings escaped
    // as QJsonDocument::Compact escapes them, each number's text as written. The same object
    // sent with its members in another order or spaced otherwise has the same form; objects that
    // differ in any value, a digit of a number past 2^53 included, have different ones. For an
    // object whose numbers are all integers within 64 bits, written without fraction, exponent
    // or "-0", it is QJsonDocument's compact form byte for byte.
    QByteArray canonical;
    // Its top-level member named as rawJsonObjects' `idMember`: a string (decoded), a number (its
    // text as written) or a boolean ("true", "false"); empty for anything else or none.
    QString id;
};

// The elements of `json`, an array of objects, read by RapidJSON's SAX reader (RFC 8259, UTF-8,
// a leading byte order mark skipped as QJsonDocument skips it). Invalid, saying which element
// and why, when it is not such an array, when a string holds a lone high surrogate (a lone
// low one passes, as RapidJSON reads it), or when an object at any depth names a member twice:
// readers disagree on which of the two counts (QJsonDocument keeps the last, others the
// first), so such an object has no one meaning.
// Nesting deeper than QJsonDocument's 1024 levels is Invalid too.
Result<QList<RawJsonObject>> rawJsonObjects(QByteArrayView json, QByteArrayView idMember = {});

} // namespace idem
