// One TensorBoard event file: created in its log directory under the name TensorBoard's writer
// gives it, opened with the file_version record, then appended to record by record (TFRecord
// framing, utils/tfrecord.h). It is what PyTorch's FileWriter / tensorboard's EventFileWriter is.
//
// Records are buffered and written with whole-buffer write(2) calls: after max_queue records, when a
// record arrives flush_secs after the oldest buffered one, on flush() and on close(). A process
// killed between two writes loses at most the buffered records; one killed inside a write leaves
// a partial last record, which utils/event_file_reader.h and tools/plot.py skip.
//
// Not thread-safe: SummaryWriter serializes calls with its mutex.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

namespace chorus::utils {

class EventFileWriter {
 public:
  // Creates log_dir (and its parents) and the file
  //   <log_dir>/events.out.tfevents.<unix seconds, 10 digits>.<hostname>.<pid>.<n><filename_suffix>
  // (tensorboard/summary/writer/event_file_writer.py's name; n counts the files this process
  // opened), then writes and flushes the file_version record. An unusable directory or file is a
  // chorus::Error naming the path and the OS's reason.
  EventFileWriter(std::string log_dir, int max_queue, double flush_secs, const std::string& filename_suffix);
  ~EventFileWriter();  // close(); an error there is printed, not thrown
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  const std::string& log_dir() const { return log_dir_; }
  const std::string& path() const { return path_; }

  // Appends one serialized Event.
  void add_event(std::string_view event);
  void flush();
  void close();  // flush and close the file; later calls do nothing

 private:
  void write_buffer();

  std::string log_dir_;
  std::string path_;
  int fd_ = -1;
  int max_queue_;
  std::chrono::duration<double> flush_interval_;
  std::string buffer_;  // whole framed records, not yet written
  int buffered_records_ = 0;
  std::chrono::steady_clock::time_point oldest_buffered_;
};

}  // namespace chorus::utils
