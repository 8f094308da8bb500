// chorus::utils::SummaryWriter: logs scalars, histograms, text and hyperparameters to TensorBoard
// event files, with the names and behaviour of PyTorch's torch.utils.tensorboard.SummaryWriter, so
// `tensorboard --logdir runs` (or tools/plot.py, where TensorBoard is not installed) shows them.
//
//   chorus::utils::SummaryWriter writer("runs/mnist");
//   writer.add_scalar("loss/train", loss, step);
//   writer.add_scalars("loss", {{"train", train_loss}, {"val", val_loss}}, step);
//   writer.add_histogram("fc1.weight", weights, step);
//
// Like PyTorch's, it writes to several files: its log_dir's own event file, one per add_scalars key
// (in <log_dir>/<main_tag>_<key>/, so each key is a run of its own in TensorBoard) and one per
// add_hparams call (in <log_dir>/<run_name>/). docs/tensorboard.md has the format and its sources.
// Thread-safe: one mutex serializes every call.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "utils/event_file_writer.h"
#include "utils/summary.h"

namespace chorus::utils {

struct SummaryWriterOptions {
  std::string comment = "";     // appended to the default log_dir name (ignored with a log_dir)
  int max_queue = 10;           // records buffered per file before they are written
  double flush_secs = 120;      // a record arriving this long after the oldest buffered one writes them
  std::string filename_suffix = "";  // appended to every event file name
};

class SummaryWriter {
 public:
  // log_dir "" is PyTorch's default, runs/<Mon><DD>_<HH>-<MM>-<SS>_<hostname><comment> (local time),
  // relative to the working directory. The directory is created with its parents; one that cannot
  // be (a path under a regular file, no permission) is a chorus::Error naming it and the reason.
  explicit SummaryWriter(std::string log_dir = "", SummaryWriterOptions options = {});
  ~SummaryWriter();  // close()
  SummaryWriter(const SummaryWriter&) = delete;
  SummaryWriter& operator=(const SummaryWriter&) = delete;

  const std::string& get_logdir() const { return log_dir_; }
  // The log_dir's own event file (a new one after close() and a further add_*).
  std::string event_file_path();

  // walltime: seconds since the Unix epoch; now when not given. The value is stored as a float
  // (Summary.Value.simple_value), as PyTorch stores it.
  void add_scalar(const std::string& tag, double scalar_value, int64_t global_step = 0,
                  std::optional<double> walltime = std::nullopt);
  // Each key's value goes to <log_dir>/<main_tag with '/' as '_'>_<key>/ under the tag main_tag.
  void add_scalars(const std::string& main_tag, const std::map<std::string, double>& tag_scalar_dict,
                   int64_t global_step = 0, std::optional<double> walltime = std::nullopt);
  // bins: the bucket edges; PyTorch's bins="tensorflow" by default (make_histogram in summary.h).
  void add_histogram(const std::string& tag, std::span<const double> values, int64_t global_step = 0,
                     std::span<const double> bins = tensorflow_bins(),
                     std::optional<double> walltime = std::nullopt);
  void add_histogram(const std::string& tag, const std::vector<double>& values, int64_t global_step = 0,
                     std::span<const double> bins = tensorflow_bins(),
                     std::optional<double> walltime = std::nullopt) {
    add_histogram(tag, std::span<const double>(values), global_step, bins, walltime);
  }
  // Shown in TensorBoard's Text tab under "<tag>/text_summary" (Markdown).
  void add_text(const std::string& tag, const std::string& text_string, int64_t global_step = 0,
                std::optional<double> walltime = std::nullopt);
  // A session of the hparams plugin in the run <log_dir>/<run_name> (run_name "": the current Unix
  // time, as PyTorch's str(time.time())): the experiment, session-start (the values) and
  // session-end summaries, then each metric as a scalar of that run.
  void add_hparams(const std::map<std::string, HParamValue>& hparam_dict,
                   const std::map<std::string, double>& metric_dict, const std::string& run_name = "",
                   int64_t global_step = 0);

  void flush();  // writes every buffered record of every file
  void close();  // flushes and closes every file; a later add_* opens new ones

 private:
  EventFileWriter& file_writer();  // the log_dir's own file, reopened after close()
  EventFileWriter& sub_writer(const std::string& dir);

  std::string log_dir_;
  SummaryWriterOptions options_;
  std::mutex mutex_;
  std::map<std::string, std::unique_ptr<EventFileWriter>> writers_;  // by directory; log_dir_'s included
};

}  // namespace chorus::utils
