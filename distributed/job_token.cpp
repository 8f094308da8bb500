#include "distributed/job_token.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "distributed/sha256.h"
#include "tensor/error.h"

namespace chorus::distributed {
namespace {

std::string trim_whitespace(const std::string& s) {
  const char* space = " \t\r\n\v\f";
  const size_t b = s.find_first_not_of(space);
  if (b == std::string::npos) return {};
  return s.substr(b, s.find_last_not_of(space) - b + 1);
}

const char* kMakeOne = "e.g. head -c 32 /dev/urandom | base64 > FILE; chmod 600 FILE";

}  // namespace

std::string read_job_token_file(const std::string& path) {
  // Opened once and checked through its descriptor: what is checked is what is read.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    fail("job token file '{}': cannot open it: {} (expected a file with the job's secret, mode 0600: readable by its "
         "owner only; {})",
         path, std::strerror(errno), kMakeOne);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail("job token file '{}': cannot stat it: {}", path, std::strerror(err));
  }
  const unsigned mode = st.st_mode & 07777;
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("job token file '{}' is not a regular file (mode {:o}): expected a file with the job's secret ({})", path,
         static_cast<unsigned>(st.st_mode), kMakeOne);
  }
  if ((mode & 077) != 0) {
    ::close(fd);
    fail("job token file '{}' has mode {:04o}: group and others may {} it; expected mode 0600 or 0400 (only its owner "
         "may read it): chmod 600 '{}'",
         path, mode, (mode & 044) != 0 ? "read" : "write or execute", path);
  }
  if (st.st_uid != ::geteuid()) {
    ::close(fd);
    fail("job token file '{}' belongs to user id {}, not to this process's user ({}): expected this user's own file, "
         "as ssh expects of a private key",
         path, static_cast<unsigned>(st.st_uid), static_cast<unsigned>(::geteuid()));
  }
  if (static_cast<size_t>(st.st_size) > kMaxJobTokenBytes) {
    ::close(fd);
    fail("job token file '{}' is {} bytes: expected a short secret of at most {} bytes (is it the right file?)", path,
         static_cast<long long>(st.st_size), kMaxJobTokenBytes);
  }
  std::string content;
  char buf[1024];
  for (;;) {
    const ssize_t k = ::read(fd, buf, sizeof(buf));
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) {
      const int err = errno;
      ::close(fd);
      fail("job token file '{}': cannot read it: {}", path, std::strerror(err));
    }
    if (k == 0 || content.size() > kMaxJobTokenBytes) break;
    content.append(buf, static_cast<size_t>(k));
  }
  ::close(fd);
  const std::string token = trim_whitespace(content);
  if (token.empty()) {
    fail("job token file '{}' is empty{}: expected the job's secret ({})", path,
         content.empty() ? " (0 bytes)" : fmt::format(" (only {} bytes of whitespace)", content.size()), kMakeOne);
  }
  if (token.size() > kMaxJobTokenBytes) {
    fail("job token file '{}' holds more than {} bytes: expected a short secret (is it the right file?)", path,
         kMaxJobTokenBytes);
  }
  return token;
}

std::string job_token_from_env() {
  const char* file = std::getenv(kJobTokenFileEnv);
  const char* value = std::getenv(kJobTokenEnv);
  const bool has_file = file != nullptr && *file != '\0', has_value = value != nullptr && *value != '\0';
  if (has_file && has_value) {
    fail("both {} and {} are set: set one (chorusrun passes its workers {}; unset {} for them)", kJobTokenFileEnv,
         kJobTokenEnv, kJobTokenFileEnv, kJobTokenEnv);
  }
  if (has_file) return read_job_token_file(file);
  if (!has_value) return {};
  const std::string token = trim_whitespace(value);
  if (token.empty()) fail("{} is set but holds only whitespace: expected the job's secret", kJobTokenEnv);
  return token;
}

std::vector<uint8_t> random_bytes(size_t n) {
  std::vector<uint8_t> out(n);
  size_t got = 0;
  while (got < n) {
    const ssize_t k = ::getrandom(out.data() + got, n - got, 0);
    if (k < 0) {
      if (errno == EINTR) continue;
      fail("getrandom failed: {} (the job token's challenges need the kernel's random source)", std::strerror(errno));
    }
    got += static_cast<size_t>(k);
  }
  return out;
}

std::string new_job_token() {
  const std::vector<uint8_t> bytes = random_bytes(32);
  return to_hex(bytes.data(), bytes.size());
}

}  // namespace chorus::distributed
