// Error handling for kvstack: absl::Status everywhere, plus the two macros that keep
// call sites short. Library code never throws; the CLI turns a Status into one line.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define KVS_STATUS_CONCAT_INNER(a, b) a##b
#define KVS_STATUS_CONCAT(a, b) KVS_STATUS_CONCAT_INNER(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define KVS_RETURN_IF_ERROR(expr)                                                 \
  do {                                                                            \
    if (absl::Status kvs_status_ = (expr); !kvs_status_.ok()) return kvs_status_; \
  } while (0)

// `lhs = value of expr` (an absl::StatusOr<T>), or returns its error.
#define KVS_ASSIGN_OR_RETURN(lhs, expr) \
  KVS_ASSIGN_OR_RETURN_IMPL(KVS_STATUS_CONCAT(kvs_statusor_, __LINE__), lhs, expr)
#define KVS_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return std::move(tmp).status();  \
  lhs = std::move(tmp).value()
