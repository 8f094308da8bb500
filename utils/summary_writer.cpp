#include "utils/summary_writer.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <exception>

#include "tensor/error.h"

namespace chorus::utils {

namespace {

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// PyTorch: os.path.join("runs", datetime.now().strftime("%b%d_%H-%M-%S") + "_" + hostname + comment).
std::string default_log_dir(const std::string& comment) {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  ::localtime_r(&now, &local);
  char date[64];
  std::strftime(date, sizeof(date), "%b%d_%H-%M-%S", &local);
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) std::snprintf(host, sizeof(host), "localhost");
  return std::string("runs/") + date + "_" + host + comment;
}

}  // namespace

SummaryWriter::SummaryWriter(std::string log_dir, SummaryWriterOptions options)
    : log_dir_(log_dir.empty() ? default_log_dir(options.comment) : std::move(log_dir)), options_(std::move(options)) {
  // As PyTorch, the log_dir's file is created at once (so a bad directory fails here).
  std::lock_guard lock(mutex_);
  file_writer();
}

SummaryWriter::~SummaryWriter() {
  try {
    close();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "SummaryWriter: closing %s: %s\n", log_dir_.c_str(), e.what());
  }
}

EventFileWriter& SummaryWriter::sub_writer(const std::string& dir) {
  auto& slot = writers_[dir];
  if (!slot) {
    slot = std::make_unique<EventFileWriter>(dir, options_.max_queue, options_.flush_secs, options_.filename_suffix);
  }
  return *slot;
}

EventFileWriter& SummaryWriter::file_writer() { return sub_writer(log_dir_); }

std::string SummaryWriter::event_file_path() {
  std::lock_guard lock(mutex_);
  return file_writer().path();
}

void SummaryWriter::add_scalar(const std::string& tag, double scalar_value, int64_t global_step,
                               std::optional<double> walltime) {
  const std::string event = summary_event(walltime.value_or(unix_seconds()), global_step, scalar_summary(tag, scalar_value));
  std::lock_guard lock(mutex_);
  file_writer().add_event(event);
}

void SummaryWriter::add_scalars(const std::string& main_tag, const std::map<std::string, double>& tag_scalar_dict,
                                int64_t global_step, std::optional<double> walltime) {
  const double wall_time = walltime.value_or(unix_seconds());  // one time for all keys, as PyTorch
  std::string dir_prefix = main_tag;
  for (char& c : dir_prefix) {
    if (c == '/') c = '_';
  }
  std::lock_guard lock(mutex_);
  for (const auto& [key, value] : tag_scalar_dict) {
    sub_writer(log_dir_ + "/" + dir_prefix + "_" + key).add_event(summary_event(wall_time, global_step, scalar_summary(main_tag, value)));
  }
}

void SummaryWriter::add_histogram(const std::string& tag, std::span<const double> values, int64_t global_step,
                                  std::span<const double> bins, std::optional<double> walltime) {
  const std::string event =
      summary_event(walltime.value_or(unix_seconds()), global_step, histogram_summary(tag, make_histogram(values, bins)));
  std::lock_guard lock(mutex_);
  file_writer().add_event(event);
}

void SummaryWriter::add_text(const std::string& tag, const std::string& text_string, int64_t global_step,
                             std::optional<double> walltime) {
  const std::string event = summary_event(walltime.value_or(unix_seconds()), global_step, text_summary(tag, text_string));
  std::lock_guard lock(mutex_);
  file_writer().add_event(event);
}

void SummaryWriter::add_hparams(const std::map<std::string, HParamValue>& hparam_dict,
                                const std::map<std::string, double>& metric_dict, const std::string& run_name,
                                int64_t global_step) {
  const HParamsSummaries summaries = hparams_summaries(hparam_dict, metric_dict);
  // PyTorch: run_name = str(time.time()); fmt's "{}" is the same shortest round-trip form.
  const std::string run = run_name.empty() ? fmt::format("{}", unix_seconds()) : run_name;
  std::string dir;
  {
    std::lock_guard lock(mutex_);
    dir = file_writer().log_dir() + "/" + run;
  }
  // A writer of its own, closed at once, as PyTorch's `with SummaryWriter(log_dir=logdir) as w_hp`.
  SummaryWriterOptions sub_options = options_;
  sub_options.comment.clear();
  SummaryWriter session(dir, sub_options);
  const double now = unix_seconds();
  {
    std::lock_guard lock(session.mutex_);
    EventFileWriter& w = session.file_writer();
    w.add_event(summary_event(now, global_step, summaries.experiment));
    w.add_event(summary_event(now, global_step, summaries.session_start_info));
    w.add_event(summary_event(now, global_step, summaries.session_end_info));
  }
  for (const auto& [tag, value] : metric_dict) session.add_scalar(tag, value, global_step);
  session.close();
}

void SummaryWriter::flush() {
  std::lock_guard lock(mutex_);
  for (auto& [dir, writer] : writers_) writer->flush();
}

void SummaryWriter::close() {
  std::lock_guard lock(mutex_);
  // Every file is closed even when one fails; the first failure is thrown after.
  std::exception_ptr first_error;
  for (auto& [dir, writer] : writers_) {
    try {
      writer->close();
    } catch (...) {
      if (!first_error) first_error = std::current_exception();
    }
  }
  writers_.clear();
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace chorus::utils
