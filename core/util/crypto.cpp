#include "util/crypto.h"

#include <openssl/bio.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <memory>

namespace idem {

namespace {

using Key = std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)>;

Key loadPublic(const QByteArray &text)
{
    const QByteArray trimmed = text.trimmed();
    if (trimmed.startsWith("-----BEGIN")) {
        std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new_mem_buf(trimmed.constData(), int(trimmed.size())), BIO_free);
        return Key(PEM_read_bio_PUBKEY(bio.get(), nullptr, nullptr, nullptr), EVP_PKEY_free);
    }
    const QByteArray der = QByteArray::fromBase64(trimmed);
    const unsigned char *p = reinterpret_cast<const unsigned char *>(der.constData());
    return Key(d2i_PUBKEY(nullptr, &p, long(der.size())), EVP_PKEY_free);
}

// No pass phrase: OpenSSL's default callback would prompt on the terminal and wait (in the
// window, on the GUI thread). An encrypted key is simply not read.
int noPassphrase(char *, int, int, void *)
{
    return -1;
}

Key loadPrivate(const QByteArray &pem)
{
    std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new_mem_buf(pem.constData(), int(pem.size())), BIO_free);
    return Key(PEM_read_bio_PrivateKey(bio.get(), nullptr, noPassphrase, nullptr), EVP_PKEY_free);
}

bool isP256(EVP_PKEY *key)
{
    char group[64] = {};
    size_t length = 0;
    return EVP_PKEY_base_id(key) == EVP_PKEY_EC
           && EVP_PKEY_get_utf8_string_param(key, "group", group, sizeof group, &length) == 1
           && (QByteArrayView(group) == "prime256v1" || QByteArrayView(group) == "P-256");
}

} // namespace

Result<void> checkEcPublicKey(const QByteArray &key)
{
    Key k = loadPublic(key);
    if (!k)
        return makeError(ErrorCode::Invalid, u"not a public key (PEM, or base64 DER as SendGrid shows it)"_qs);
    if (!isP256(k.get()))
        return makeError(ErrorCode::Invalid, u"not an ECDSA P-256 public key"_qs);
    return {};
}

Result<void> checkEcPrivateKey(const QByteArray &pem)
{
    Key k = loadPrivate(pem);
    if (!k)
        return makeError(ErrorCode::Invalid,
                         u"not a PEM private key (or one encrypted with a pass phrase)"_qs);
    if (!isP256(k.get()))
        return makeError(ErrorCode::Invalid, u"not an ECDSA P-256 private key"_qs);
    return {};
}

bool ecdsaVerify(const QByteArray &publicKey, const QByteArray &data, const QByteArray &derSignature)
{
    Key key = loadPublic(publicKey);
    if (!key || derSignature.isEmpty())
        return false;
    std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
    if (EVP_DigestVerifyInit(ctx.get(), nullptr, EVP_sha256(), nullptr, key.get()) != 1)
        return false;
    return EVP_DigestVerify(ctx.get(), reinterpret_cast<const unsigned char *>(derSignature.constData()),
                            size_t(derSignature.size()), reinterpret_cast<const unsigned char *>(data.constData()),
                            size_t(data.size()))
           == 1;
}

Result<QByteArray> ecdsaSign(const QByteArray &privateKeyPem, const QByteArray &data)
{
    Key key = loadPrivate(privateKeyPem);
    if (!key)
        return makeError(ErrorCode::Invalid,
                         u"not a PEM private key (or one encrypted with a pass phrase)"_qs);
    std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
    size_t length = 0;
    if (EVP_DigestSignInit(ctx.get(), nullptr, EVP_sha256(), nullptr, key.get()) != 1
        || EVP_DigestSign(ctx.get(), nullptr, &length, reinterpret_cast<const unsigned char *>(data.constData()),
                          size_t(data.size())) != 1)
        return makeError(ErrorCode::Internal, u"ECDSA signing failed"_qs);
    QByteArray signature(qsizetype(length), Qt::Uninitialized);
    if (EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char *>(signature.data()), &length,
                       reinterpret_cast<const unsigned char *>(data.constData()), size_t(data.size())) != 1)
        return makeError(ErrorCode::Internal, u"ECDSA signing failed"_qs);
    signature.resize(qsizetype(length));
    return signature;
}

QByteArray sha256Hex(QByteArrayView data)
{
    // Fetched once: an implicit fetch (EVP_sha256()) on every call costs a provider lookup.
    static EVP_MD *const sha256 = EVP_MD_fetch(nullptr, "SHA256", nullptr);
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int length = 0;
    if (!sha256 ||
        EVP_Digest(data.data(), size_t(data.size()), digest, &length, sha256, nullptr) != 1)
        qFatal("idemdesk: SHA-256 is not available from libcrypto");
    return QByteArray(reinterpret_cast<const char *>(digest), qsizetype(length)).toHex();
}

} // namespace idem
