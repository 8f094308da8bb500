#include "utils/event_file_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "tensor/error.h"
#include "utils/summary.h"
#include "utils/tfrecord.h"

namespace chorus::utils {

namespace {

std::atomic<uint64_t> files_opened{0};

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

}  // namespace

EventFileWriter::EventFileWriter(std::string log_dir, int max_queue, double flush_secs,
                                 const std::string& filename_suffix)
    : log_dir_(std::move(log_dir)), max_queue_(max_queue < 1 ? 1 : max_queue), flush_interval_(flush_secs) {
  CHORUS_CHECK(!log_dir_.empty(), "SummaryWriter: empty log directory");
  std::error_code ec;
  std::filesystem::create_directories(log_dir_, ec);
  if (ec) fail("SummaryWriter: cannot create the log directory '{}': {}", log_dir_, ec.message());
  const double now = unix_seconds();
  path_ = fmt::format("{}/events.out.tfevents.{:010d}.{}.{}.{}{}", log_dir_, static_cast<int64_t>(now), host_name(),
                      ::getpid(), files_opened.fetch_add(1), filename_suffix);
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("SummaryWriter: cannot create the event file '{}': {}", path_, std::strerror(errno));
  add_event(file_version_event(now));
  flush();
}

EventFileWriter::~EventFileWriter() {
  try {
    close();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "SummaryWriter: closing %s: %s\n", path_.c_str(), e.what());
  }
}

void EventFileWriter::add_event(std::string_view event) {
  CHORUS_CHECK(fd_ >= 0, "SummaryWriter: '{}' is closed", path_);
  const auto now = std::chrono::steady_clock::now();
  if (buffered_records_ == 0) oldest_buffered_ = now;
  buffer_ += tfrecord::frame(event);
  ++buffered_records_;
  if (buffered_records_ >= max_queue_ || now - oldest_buffered_ >= flush_interval_) write_buffer();
}

void EventFileWriter::write_buffer() {
  // Only whole records are in the buffer, and it is appended in one call where the kernel allows
  // (a short write continues at once), so the file holds whole records unless the process dies
  // inside the write.
  size_t done = 0;
  while (done < buffer_.size()) {
    const ssize_t n = ::write(fd_, buffer_.data() + done, buffer_.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const std::string why = std::strerror(errno);
      buffer_.erase(0, done);
      fail("SummaryWriter: writing '{}' failed: {}", path_, why);
    }
    done += static_cast<size_t>(n);
  }
  buffer_.clear();
  buffered_records_ = 0;
}

void EventFileWriter::flush() {
  if (fd_ >= 0) write_buffer();
}

void EventFileWriter::close() {
  if (fd_ < 0) return;
  const int fd = fd_;
  try {
    write_buffer();
  } catch (...) {
    fd_ = -1;
    ::close(fd);
    throw;
  }
  fd_ = -1;
  if (::close(fd) != 0) fail("SummaryWriter: closing '{}' failed: {}", path_, std::strerror(errno));
}

}  // namespace chorus::utils
