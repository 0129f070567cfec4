// Errors as values. C++20 has no std::expected, so kpleg carries its own small Result:
// either a value or an Error (an errno-style or gRPC-style code plus a message that says
// what failed and why). Exceptions stay for programmer errors.
#pragma once

#include <cerrno>
#include <cstring>
#include <string>
#include <system_error>
#include <utility>
#include <variant>

namespace kpleg {

struct Error {
  int code = 0;         // errno value, or a grpc::StatusCode for CRI errors
  std::string message;  // human-readable, names the operation and the cause

  static Error from_errno(int err, const std::string& what) {
    return Error{err, what + ": " + std::strerror(err)};
  }
  std::system_error to_system_error() const {
    return std::system_error(code, std::generic_category(), message);
  }
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT(google-explicit-constructor)
  Result(Error error) : v_(std::move(error)) {}     // NOLINT(google-explicit-constructor)

  bool ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return ok(); }

  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &std::get<T>(v_); }
  const T* operator->() const { return &std::get<T>(v_); }
  T& operator*() & { return std::get<T>(v_); }
  const T& operator*() const& { return std::get<T>(v_); }

  const Error& error() const { return std::get<Error>(v_); }

 private:
  std::variant<T, Error> v_;
};

// Result<void>: success or an Error.
template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : err_(std::move(error)), ok_(false) {}  // NOLINT

  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const { return err_; }

 private:
  Error err_;
  bool ok_ = true;
};

using Status = Result<void>;

}  // namespace kpleg
