/* SPDX-License-Identifier: Apache-2.0 */
/* The checks of the C API's tests: each failed check prints where and why, and counts. */
#ifndef TPCOMM_TESTS_C_CHECK_H
#define TPCOMM_TESTS_C_CHECK_H

#include <stdio.h>

#include "tpcomm/tpcomm.h"

static int failures = 0;

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                              \
    }                                                                          \
  } while (0)

#define CHECK_OK(call)                                                          \
  do {                                                                          \
    const tpcomm_status s_ = (call);                                            \
    if (s_ != TPCOMM_OK) {                                                      \
      fprintf(stderr, "%s:%d: %s returned %s: %s\n", __FILE__, __LINE__, #call, \
              tpcomm_status_string(s_), tpcomm_last_error());                   \
      ++failures;                                                               \
    }                                                                           \
  } while (0)

#endif /* TPCOMM_TESTS_C_CHECK_H */
