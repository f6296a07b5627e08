#pragma once

#include "util/result.h"

#include <QByteArray>

namespace idem {

// ECDSA P-256 with SHA-256 through OpenSSL's libcrypto (SendGrid's Event Webhook signature).
// Keys are PEM, or base64 DER (SubjectPublicKeyInfo for public keys, as SendGrid shows them).
Result<void> checkEcPublicKey(const QByteArray &key);
Result<void> checkEcPrivateKey(const QByteArray &pem);
// True when `derSignature` is a valid signature of `data` by `publicKey`.
bool ecdsaVerify(const QByteArray &publicKey, const QByteArray &data, const QByteArray &derSignature);
Result<QByteArray> ecdsaSign(const QByteArray &privateKeyPem, const QByteArray &data);

// SHA-256 of `data`, lower-case hex (as QCryptographicHash's toHex()), by libcrypto: on every
// delivery's path (the fingerprint), where Qt's own SHA-256 cost 8% of the receiver's CPU.
QByteArray sha256Hex(QByteArrayView data);

} // namespace idem
