// Which sanitizer this file is compiled with: CHORUS_ASAN and CHORUS_TSAN are 1 or 0. g++ says it by
// defining __SANITIZE_ADDRESS__ / __SANITIZE_THREAD__; clang (14: the sanitizer builds of
// tools/test.sh --full, docs/build.md) defines neither and answers __has_feature instead.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define CHORUS_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CHORUS_ASAN 1
#endif
#endif
#ifndef CHORUS_ASAN
#define CHORUS_ASAN 0
#endif

#if defined(__SANITIZE_THREAD__)
#define CHORUS_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CHORUS_TSAN 1
#endif
#endif
#ifndef CHORUS_TSAN
#define CHORUS_TSAN 0
#endif
