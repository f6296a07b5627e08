#pragma once

#include <QString>

#include <optional>
#include <utility>
#include <variant>

namespace idem {

// What went wrong, as a value. Store errors are always Unavailable or InDoubt: the receiver
// answers 503 for both and never runs the processor.
enum class ErrorCode {
    Invalid,     // bad input: config, URL, argument
    NotFound,    // no such key / endpoint
    Conflict,    // a transition refused by the state machine (wrong state, stale token)
    Unavailable, // the store could not be reached or answered with an error
    InDoubt,     // the store may or may not have applied the change: never retried blindly
    TooLarge,    // over a configured bound (HTTP 413)
    Internal,
};

struct Error
{
    ErrorCode code = ErrorCode::Internal;
    QString message;
};

// Result<T> = expected<T, Error>, in the C++20 this project builds with.
template<typename T>
class [[nodiscard]] Result
{
public:
    Result(T value) : m_v(std::in_place_index<0>, std::move(value)) {}
    Result(Error error) : m_v(std::in_place_index<1>, std::move(error)) {}

    bool ok() const { return m_v.index() == 0; }
    explicit operator bool() const { return ok(); }
    T &value() { return std::get<0>(m_v); }
    const T &value() const { return std::get<0>(m_v); }
    T *operator->() { return &value(); }
    const T *operator->() const { return &value(); }
    T &operator*() { return value(); }
    const T &operator*() const { return value(); }
    const Error &error() const { return std::get<1>(m_v); }

private:
    std::variant<T, Error> m_v;
};

struct Ok
{};

template<>
class [[nodiscard]] Result<void>
{
public:
    Result() = default;
    Result(Ok) {}
    Result(Error error) : m_error(std::move(error)) {}
    bool ok() const { return !m_error; }
    explicit operator bool() const { return ok(); }
    const Error &error() const { return *m_error; }

private:
    std::optional<Error> m_error;
};

inline Error makeError(ErrorCode code, QString message)
{
    return Error{code, std::move(message)};
}

} // namespace idem
