// The job token: the secret a process must hold to get into its job's TCP store (the handshake is
// in store_auth.h). Where a process finds it, in this order:
//   CHORUS_JOB_TOKEN_FILE  a file readable by its owner only (mode 0600 or 0400), as ssh demands of
//                          a private key; what chorusrun passes its workers (a path in the
//                          environment, not the secret itself)
//   CHORUS_JOB_TOKEN       the secret itself (for launchers that cannot write a file)
// Both set is an error (which one was meant?). Neither: no token, and the store lets in whoever
// reaches it, as before. Leading and trailing whitespace (a file's last newline) is not part of it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace chorus::distributed {

inline constexpr const char* kJobTokenEnv = "CHORUS_JOB_TOKEN";
inline constexpr const char* kJobTokenFileEnv = "CHORUS_JOB_TOKEN_FILE";
inline constexpr size_t kMaxJobTokenBytes = 4096;

// The token in the file at `path`. chorus::Error naming the path, what was found and what is
// expected when the file cannot be opened, is not a regular file, may be read or written by group
// or others, is empty (or whitespace only), or is longer than kMaxJobTokenBytes.
std::string read_job_token_file(const std::string& path);

// The token the environment names (see the top of this file); "" when none.
std::string job_token_from_env();

// `n` bytes from the kernel's random source (getrandom); chorus::Error if it fails.
std::vector<uint8_t> random_bytes(size_t n);

// A new token: 32 random bytes as 64 hex digits.
std::string new_job_token();

}  // namespace chorus::distributed
