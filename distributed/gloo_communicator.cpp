// GlooStreamCommunicator: see gloo_communicator.h.
#include "distributed/gloo_communicator.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <string>
#include <thread>
#include <utility>

#include "distributed/stream_group.h"
#include "tensor/fault.h"
#include "tensor/ops.h"

namespace chorus::distributed {


struct GlooStreamCommunicator::State {
  std::mutex mutex;
  std::condition_variable cv;
  uint64_t submitted = 0, issued = 0;  // stream tasks queued / that have issued their collectives
  // [Collectives reach Gloo in the order they were issued] The last ordered group posted (see
  // LaneWorker::wait_turn), and how many lane workers wait for their turn now (for tests).
  uint64_t ordered_posted = 0;
  int waiting_turn = 0;
  // [sim runs a device's groups one after another, as NCCL] The last group of each sim device's
  // order that has finished (see LaneWorker::wait_turn).
  std::map<int, uint64_t> device_finished;
  std::string aborted;                 // why, once abort() ran
};

// Whether sim's groups follow NCCL's order ([sim runs a device's groups one after another, as NCCL],
// group_end): CHORUS_SIM_NCCL_ORDER unset or 1 (the default), 0 off; a test may remove it.
bool sim_nccl_order() {
  static const bool on = [] {
    const char* v = std::getenv("CHORUS_SIM_NCCL_ORDER");
    if (v == nullptr || std::string(v) == "1") return true;
    if (std::string(v) == "0") return false;
    fail("CHORUS_SIM_NCCL_ORDER={}: expected 0 or 1", v);
  }();
  return on && !fault::removed(fault::Point::kSimNcclOrder);
}

// Page-locked host memory for the staged copies and the lanes' flag words, kept for the
// communicator's life and reused: allocating page-locked memory waits for all device work (CUDA
// makes it an implicit synchronization), which may wait for a collective whose peer waits for this
// process's next one. So it is allocated rarely, in chunks of at least kMinChunk bytes (the first
// before any collective of the communicator is in flight), and carved first-fit into blocks.
class GlooStreamCommunicator::PinnedPool {
 public:
  static constexpr size_t kMinChunk = size_t(16) << 20;
  explicit PinnedPool(DeviceRuntime& rt) : rt_(rt) {}
  // Destroyed at exit too (a default group lives in a static): the runtime may have unloaded by
  // then (DeviceUnloading), or the device failed; the process's end returns the memory either way.
  ~PinnedPool() {
    for (Chunk& c : chunks_) {
      try {
        rt_.host_free(c.base);
      } catch (const Error&) {
      }
    }
  }
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  Block take(size_t bytes) {
    const size_t n = round_up(std::max<size_t>(bytes, 1), 64);
    std::lock_guard<std::mutex> lock(mutex_);
    for (Chunk& c : chunks_)
      if (char* p = c.take(n)) return {p, n};
    const size_t size = std::max(kMinChunk, round_up(2 * n, size_t(1) << 20));
    chunks_.push_back({static_cast<char*>(rt_.host_malloc(size)), size, {{0, size}}});
    return {chunks_.back().take(n), n};
  }
  void give(const Block& b) {
    if (!b.ptr) return;
    std::lock_guard<std::mutex> lock(mutex_);
    for (Chunk& c : chunks_) {
      if (b.ptr >= c.base && b.ptr < c.base + c.size) return c.give(static_cast<size_t>(b.ptr - c.base), b.size);
    }
  }

 private:
  static size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }
  struct Chunk {
    char* base;
    size_t size;
    std::map<size_t, size_t> free;  // offset -> length of each free range
    char* take(size_t n) {
      for (auto it = free.begin(); it != free.end(); ++it) {
        if (it->second < n) continue;
        const size_t offset = it->first, length = it->second;
        free.erase(it);
        if (length > n) free.emplace(offset + n, length - n);
        return base + offset;
      }
      return nullptr;
    }
    void give(size_t offset, size_t n) {
      auto it = free.emplace(offset, n).first;
      if (auto next = std::next(it); next != free.end() && it->first + it->second == next->first) {
        it->second += next->second;
        free.erase(next);
      }
      if (it != free.begin()) {
        if (auto prev = std::prev(it); prev->first + prev->second == it->first) {
          prev->second += it->second;
          free.erase(it);
        }
      }
    }
  };
  DeviceRuntime& rt_;
  std::mutex mutex_;
  std::deque<Chunk> chunks_;
};

// The host side of one stream's staged groups, on a thread of its own, in the stream's order. Two
// flag words in page-locked memory connect it to the stream: the stream writes `ready` = the
// group's number once its copies to host memory are done; the worker waits for that, runs the
// collectives and stores `done` = the number; the stream waits for it before copying the results
// back. A group that reads nothing from the device (receives, a broadcast away from its root) has
// no `ready` on a GPU: the worker runs it when it comes to it (see group_end); on sim with NCCL's
// order modelled it has one, written when the stream reaches it ([A receive waits for its stream,
// as NCCL's], group_end). The worker makes no device
// call at all (see group_end), and releases nothing that owns device memory: a finished job (its works hold device tensors) goes back to the issuing thread,
// which lets it go in release_staging. Freeing device memory may record events, and on this thread
// that could deadlock (seen on sim with its driver lock under load: the worker's free waited for
// the lock of the main thread's blocking copy, whose stream waited for the worker's next `done`).
//
// A stream that never gets to its `ready` write (its device failed: CUDA's sticky error, sim's
// injected stream failure) must not hold the worker forever: the watchdog then aborts the
// communicator, and the worker stops polling and runs the job, which, aborted, notes the error on
// its works, fills the host copies of what it only writes (see `run` in group_end) and counts
// itself issued (so wait_until_issued returns). Destroying the
// communicator stops the polling too.
class GlooStreamCommunicator::LaneWorker {
 public:
  LaneWorker(Block flags, std::shared_ptr<State> state) : flags_(flags), state_(std::move(state)), thread_([this] { loop(); }) {}
  ~LaneWorker() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  uint32_t* ready_word() const { return reinterpret_cast<uint32_t*>(flags_.ptr); }
  uint32_t* done_word() const { return reinterpret_cast<uint32_t*>(flags_.ptr) + 1; }
  uint32_t next_sequence() { return ++sequence_; }  // the issuing thread only
  // `after_ready`: whether the job waits for the stream's `ready` word (a group that reads nothing
  // from the device does not: see group_end). `order`: the group's place among the communicator's
  // ordered groups (0: a group of sends and receives, which is not ordered; see wait_turn). The job
  // is called with whether the stream's copies to the host are done (its `ready` was seen, or it
  // has none): only then may it write over the host copies of what it reads.
  void push(uint32_t sequence, bool after_ready, Turn turn, std::function<void(bool)> job) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      jobs_.push_back({sequence, after_ready, turn, std::move(job)});
    }
    cv_.notify_all();
  }
  // The jobs run so far, to be destroyed by the caller (a thread that may make device calls).
  std::vector<std::function<void(bool)>> take_finished() {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::exchange(finished_, {});
  }

 private:
  struct Job {
    uint32_t sequence;
    bool after_ready;
    Turn turn;
    std::function<void(bool)> run;
  };
  void loop() {
    const NoDeviceCallsGuard no_device_calls("the Gloo lane worker");
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // stopped, and nothing left
        job = std::move(jobs_.front());
        jobs_.pop_front();
        // The communicator is going away with jobs its stream never finished (a failed device): hand
        // them back unrun, as the poll below does (a job without a `ready` word would otherwise be
        // posted to Gloo now, and the destructor wait in it up to Gloo's timeout).
        if (stop_) {
          finished_.push_back(std::move(job.run));
          return;
        }
      }
      // The stream reaches its `ready` write after the caller's work and the copies: poll for it
      // (spinning briefly, then sleeping 20 us at a time). fault::Point::kGlooReadyFlag removed (a
      // negative control, multiprocess_test): the group runs at once, on host copies not yet made.
      std::atomic_ref<uint32_t> ready(*ready_word());
      auto ready_seen = [&] { return static_cast<int32_t>(ready.load(std::memory_order_acquire) - job.sequence) >= 0; };
      bool stopped = false;
      const bool wait_for_ready = job.after_ready && !fault::removed(fault::Point::kGlooReadyFlag);
      for (int spins = 0; wait_for_ready && !ready_seen(); ++spins) {
        if (spins < 256) {
          std::this_thread::yield();
          continue;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(20));
        if (spins % 256 != 0) continue;  // every ~5 ms: has the group given up on this stream?
        if (aborted()) break;
        std::lock_guard<std::mutex> lock(mutex_);
        if (stop_) {
          stopped = true;
          break;
        }
      }
      if (!stopped && (job.turn.order != 0 || job.turn.device_order != 0)) stopped = !wait_turn(job.turn);
      if (stopped) {  // the communicator is going away: hand the job back unrun (it owns device tensors)
        std::lock_guard<std::mutex> lock(mutex_);
        finished_.push_back(std::move(job.run));
        return;
      }
      // An abort (or the removed flag) ends the poll early: the stream may still be copying into the
      // host copies of what the group reads.
      job.run(/*copies_done=*/!wait_for_ready || ready_seen());
      {
        std::lock_guard<std::mutex> lock(mutex_);
        finished_.push_back(std::move(job.run));
      }
      std::atomic_ref<uint32_t>(*done_word()).store(job.sequence, std::memory_order_release);
    }
  }
  bool aborted() {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return !state_->aborted.empty();
  }
  // [Collectives reach Gloo in the order they were issued] Gloo matches the collectives of its
  // ranks by the order each posts them (the process group's tag sequence), and the lanes of
  // different streams (each device's collective stream) reach their groups in the order their
  // streams get there, not the order the host issued them: rank 0's allreduce on sim:1, issued after
  // one on sim:0 whose stream was still busy, was posted first and summed with rank 1's first
  // allreduce (stream_group_test, 2026-12-04). So an ordered group (one with a collective) waits
  // until the one issued before it was posted. Sends and receives are matched by their tags and are
  // not ordered: a receive must be posted while an earlier send of a shared hardware queue still
  // waits (see group_end). A coalesced group that mixes sends or receives with a collective is
  // ordered as a whole, its sends and receives included. Returns false when the communicator is going away first; an abort ends
  // the wait (the aborted group then posts nothing). fault::Point::kGlooCollectiveOrder removed (a
  // negative control, stream_group_test): the group is posted at once.
  // [sim runs a device's groups one after another, as NCCL] A group with a device order (sim's
  // model of NCCL, see group_end) also waits until the group before it on its device has finished.
  bool wait_turn(const Turn& turn) {
    const uint64_t order = fault::removed(fault::Point::kGlooCollectiveOrder) ? 0 : turn.order;
    State& s = *state_;
    auto my_turn = [&] {
      if (!s.aborted.empty()) return true;
      if (order != 0 && s.ordered_posted + 1 < order) return false;
      if (turn.device_order == 0) return true;
      const auto it = s.device_finished.find(turn.device);
      return (it == s.device_finished.end() ? 0 : it->second) + 1 >= turn.device_order;
    };
    auto count_waiting = [&](int by) {
      std::lock_guard<std::mutex> lock(s.mutex);
      s.waiting_turn += by;
    };
    count_waiting(+1);
    bool go = true;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(s.mutex);
        if (s.cv.wait_for(lock, std::chrono::milliseconds(5), my_turn)) break;
      }
      std::lock_guard<std::mutex> own(mutex_);  // (not under the state's lock)
      if (stop_) {
        go = false;
        break;
      }
    }
    count_waiting(-1);
    return go;
  }
  const Block flags_;
  const std::shared_ptr<State> state_;
  uint32_t sequence_ = 0;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  std::vector<std::function<void(bool)>> finished_;
  bool stop_ = false;
  std::thread thread_;
};

GlooStreamCommunicator::GlooStreamCommunicator(std::shared_ptr<ProcessGroup> host)
    : host_(std::move(host)), state_(std::make_shared<State>()) {
  if (!host_) fail("GlooStreamCommunicator: the host process group is null");
}

GlooStreamCommunicator::~GlooStreamCommunicator() {
  try {
    release_staging(/*all=*/true);
  } catch (...) {  // a failed device at teardown: the buffers are lost, nothing else to do
  }
}

void GlooStreamCommunicator::release_staging(bool all) {
  std::vector<Staging> done;
  {
    std::lock_guard<std::mutex> lock(staging_mutex_);
    std::vector<Staging> still;
    for (Staging& st : staging_) {
      // fault::Point::kGlooStagingReuse removed (a negative control, stream_group_test): the blocks
      // go back to the pool while the stream may still copy into and out of them.
      if (all || st.done.query() || fault::removed(fault::Point::kGlooStagingReuse)) done.push_back(std::move(st));
      else still.push_back(std::move(st));
    }
    staging_.swap(still);
  }
  for (Staging& st : done) {
    if (all) st.done.synchronize();
    for (const Block& b : st.blocks) st.pool->give(b);
  }
  std::vector<std::function<void(bool)>> finished;
  {
    std::lock_guard<std::mutex> lock(workers_mutex_);
    for (auto& [stream, worker] : workers_) {
      for (auto& job : worker->take_finished()) finished.push_back(std::move(job));
    }
  }
  // `done` and `finished` go out of scope here, on this thread: the tensors and works the stream
  // no longer needs are let go.
}

GlooStreamCommunicator::PinnedPool& GlooStreamCommunicator::pool_for(Device device) {
  std::lock_guard<std::mutex> lock(workers_mutex_);
  for (auto& [type, pool] : pools_)
    if (type == device.type) return *pool;
  pools_.emplace_back(device.type, std::make_unique<PinnedPool>(runtime_for(device, "ProcessGroup")));
  return *pools_.back().second;
}

GlooStreamCommunicator::LaneWorker& GlooStreamCommunicator::worker_for(const Stream& stream, PinnedPool& pool) {
  std::lock_guard<std::mutex> lock(workers_mutex_);
  for (auto& [s, w] : workers_)
    if (s == stream) return *w;
  Block flags = pool.take(64);  // its two flag words, alone on a cache line
  std::memset(flags.ptr, 0, flags.size);
  workers_.emplace_back(stream, std::make_unique<LaneWorker>(flags, state_));
  return *workers_.back().second;
}

void GlooStreamCommunicator::group_start() {
  if (depth_++ > 0) return;
  release_staging(/*all=*/false);
}

void GlooStreamCommunicator::add(const char* op, const std::vector<Operand>& operands, const Stream& stream,
                                 const std::shared_ptr<StreamWork>& work, Issue issue, bool ordered) {
  if (stream_ && !(*stream_ == stream)) fail("gloo {}: every op of a coalesced group must use one stream", op);
  // Every operand is checked before any is staged: a refused op leaves nothing in the group (an
  // operand staged for it would be copied back at the next group, from a block nobody filled), and
  // the ops added before it in a coalesced group are dropped with it at group_end (the caller gets
  // the error, not a work for half a group).
  for (const Operand& o : operands) {
    if (!o.tensor.is_contiguous()) {
      if (depth_ > 0) discard_ = true;
      fail("ProcessGroup gloo {}: a {} tensor goes to Gloo through host memory and must be contiguous (got strides "
           "{} for shape {}); call .contiguous() first",
           op, stream.device().str(), shape_str(o.tensor.strides()), shape_str(o.tensor.sizes()));
    }
  }
  const bool implicit = depth_ == 0;
  if (implicit) group_start();
  stream_ = stream;
  const size_t first = staged_.size();
  // Gloo works on a host copy in page-locked memory (made, filled and copied back in group_end).
  for (const Operand& o : operands) staged_.push_back({alias_without_history(o.tensor), Tensor(), o.read, o.written});
  jobs_.push_back({std::move(issue), first, operands.size(), work, ordered});
  if (implicit) group_end();
}

void GlooStreamCommunicator::group_end() {
  if (depth_ == 0) fail("GlooStreamCommunicator: group_end() without group_start()");
  if (--depth_ > 0) return;
  if (jobs_.empty() || discard_) {
    discard_ = false;
    jobs_.clear();
    stream_.reset();
    staged_.clear();
    return;
  }
  const Stream stream = *stream_;
  std::vector<Job> jobs;
  jobs.swap(jobs_);
  std::vector<StagedTensor> staged_tensors;
  staged_tensors.swap(staged_);
  stream_.reset();
  // Gloo's operands: host tensors over page-locked blocks of the pool (see the comment below).
  PinnedPool& pool = pool_for(stream.device());
  LaneWorker& worker = worker_for(stream, pool);
  std::vector<Block> blocks;
  TensorList aliases;
  for (StagedTensor& t : staged_tensors) {
    blocks.push_back(pool.take(static_cast<size_t>(t.device.nbytes())));
    t.host = from_blob(blocks.back().ptr, t.device.sizes(), {.dtype = t.device.dtype()});
    aliases.push_back(t.host);
  }

  std::shared_ptr<State> state = state_;  // the task may outlive the communicator
  auto host = host_;
  DeviceRuntime& rt = runtime_for(stream.device(), "ProcessGroup");
  // The works stay with the staging record until the stream has passed the group (see Staging).
  std::vector<std::shared_ptr<StreamWork>> works;
  for (const Job& job : jobs) works.push_back(job.work);
  // The host copies each job writes: a job that fails (or is aborted) leaves them all bits set (NaN
  // in every floating dtype, -1 in the signed integer ones; bool true) before they are copied
  // back, so that its outputs read as undefined rather than as some earlier group's numbers in a
  // reused block; one it also reads only once the stream has copied it out (else it comes back
  // unchanged). A work the watchdog failed whose Gloo op later ends well gets the op's results.
  // Its place among the ordered groups (see LaneWorker::wait_turn), taken when it is pushed (a group
  // that fails before that leaves its number to the next).
  bool ordered = false;
  for (const Job& job : jobs) ordered = ordered || job.ordered;
  const uint64_t order = ordered ? ordered_issued_ + 1 : 0;
  // [sim runs a device's groups one after another, as NCCL] On a GPU, chorus's NCCL communicator
  // of a device runs every operation in the order it was issued, whatever the stream (NCCL's
  // documented semantics: NVIDIA/nccl issues #574, #783), and a send may wait for its receive to be
  // posted (always, past NCCL's buffers): a send and then a receive as two groups, on two ranks
  // that both send first, hang there. The Gloo lanes would pass it (the receive lane posts at
  // once). So on sim, the judge of the GPU half, every group also waits until the group issued
  // before it on its device has finished: the same exchange hangs (the watchdog fails it at the
  // group's timeout), and needs what NCCL needs, one coalesced group. CHORUS_SIM_NCCL_ORDER=0 turns
  // the model off; fault::Point::kSimNcclOrder removes it in a test.
  const int device_index = stream.device().index;
  const bool nccl_order = stream.device().type == DeviceType::Sim && sim_nccl_order();
  const uint64_t device_order = nccl_order ? device_issued_[device_index] + 1 : 0;
  std::vector<bool> read, written;
  for (const StagedTensor& t : staged_tensors) {
    read.push_back(t.read);
    written.push_back(t.written);
  }
  // The collectives of the group, issued on the host copies and waited for.
  auto run = [jobs, host, aliases, read, written, state, order, device_index, device_order](bool copies_done) {
    std::string aborted;
    {
      std::lock_guard<std::mutex> lock(state->mutex);
      aborted = state->aborted;
    }
    // Issue every collective of the group before waiting for any (a send and a receive of one
    // group must both be posted), then wait for each.
    std::vector<std::shared_ptr<Work>> inner(jobs.size());
    std::vector<bool> failed(jobs.size(), false);
    for (size_t j = 0; j < jobs.size(); ++j) {
      if (!aborted.empty()) {
        jobs[j].work->note_error(std::make_exception_ptr(Error(fmt::format("the communicator was aborted: {}", aborted))));
        failed[j] = true;
        continue;
      }
      try {
        const auto b = aliases.begin() + static_cast<std::ptrdiff_t>(jobs[j].first);
        inner[j] = jobs[j].issue(*host, TensorList(b, b + static_cast<std::ptrdiff_t>(jobs[j].count)));
      } catch (...) {
        jobs[j].work->note_error(std::current_exception());
        failed[j] = true;
      }
    }
    {
      std::lock_guard<std::mutex> lock(state->mutex);
      ++state->issued;
      state->ordered_posted = std::max(state->ordered_posted, order);
    }
    state->cv.notify_all();
    for (size_t j = 0; j < jobs.size(); ++j) {
      if (!inner[j]) continue;
      try {
        inner[j]->wait();
      } catch (...) {
        jobs[j].work->note_error(std::current_exception());
        failed[j] = true;
      }
    }
    for (size_t j = 0; j < jobs.size(); ++j) {
      if (!failed[j]) continue;
      for (size_t i = jobs[j].first; i < jobs[j].first + jobs[j].count; ++i)
        // (A tensor it also reads, before the stream has copied it out (an abort), is left alone:
        // the stream's copy could land on either side of the fill; it comes back unchanged.)
        if (written[i] && (!read[i] || copies_done)) {  // (bool: true, the one value of all bits that a bool may hold)
          std::memset(aliases[i].raw_data_ptr(), aliases[i].dtype() == kBool ? 0x01 : 0xFF,
                      static_cast<size_t>(aliases[i].nbytes()));
        }
    }
    if (device_order != 0) {
      {
        std::lock_guard<std::mutex> lock(state->mutex);
        uint64_t& finished = state->device_finished[device_index];
        finished = std::max(finished, device_order);
      }
      state->cv.notify_all();
    }
  };
  // On the stream, after the caller's work: copy the tensors the collectives read into their
  // page-locked host copies, write the lane's `ready` word; the lane worker, polling it, runs the collectives and stores
  // `done`; the stream waits for that and copies the results back. Nothing on the host side calls
  // CUDA, and the stream waits with no host function. What the GPU runs taught (2026-11-26):
  // - a host function may make no CUDA call (cudaErrorNotPermitted), and CUDA may run the host
  //   functions of all streams on one thread: collectives inside one deadlocked a send/receive ring;
  // - a host function that waited for a thread making CUDA calls (the copies) deadlocked DDP on an
  //   H100: the main thread's blocking copy to pageable memory held a driver lock while it waited for
  //   the device, the device waited for the host function, and the thread's copy for the lock
  //   (docs/data/gloo_cuda_hang_stacks_rank0_2026-11-26.txt);
  // - allocating page-locked memory is an implicit device synchronization: the pool allocates
  //   rarely (PinnedPool), never per collective.
  //
  // Only what the collectives read goes to the host: an output they only write (a receive's tensor,
  // allgather's, reduce_scatter's and all_to_all's outputs, a broadcast's away from its root) is
  // written whole by Gloo and copied back, so copying it out first would only cost bandwidth (a
  // job that fails leaves its outputs all bits set: `run` above). A group that reads nothing
  // (receives, a broadcast away from its root) has nothing to wait for: its worker posts it as soon
  // as it comes to it, without a `ready` word. That matters where streams share a hardware queue
  // (sim's default of one; CUDA_DEVICE_MAX_CONNECTIONS on a GPU): the send lane's wait for its
  // `done` word stalls the queue, and a receive waiting for its lane's `ready` behind it would never
  // be posted, so a send/receive ring deadlocked with one queue.
  //
  // [A receive waits for its stream, as NCCL's] On a GPU a receive is a kernel of its stream: it is
  // posted (and a peer's send to it can finish) only once the stream has run the caller's earlier
  // work. Posting it at once, as the Gloo lanes do, lets a peer's send finish earlier than on a GPU,
  // so a wait cycle through this rank's compute (a receive behind a kernel that waits for what the
  // peer does only after its send) would pass here and hang there. So on sim with NCCL's order
  // modelled (sim_nccl_order), a group that reads nothing has a `ready` word too, written where the
  // stream reaches it. The ring above does not come back: with NCCL's order a receive issued after
  // a send runs only once that send has finished, on a GPU too (a ring needs one coalesced group,
  // which reads, and so always had its `ready`). fault::Point::kSimRecvReady removes it in a test.
  const bool recv_ready = nccl_order && !fault::removed(fault::Point::kSimRecvReady);
  const uint32_t sequence = worker.next_sequence();
  const StreamDeviceGuard on_device(stream);
  bool reads = false;
  for (const StagedTensor& t : staged_tensors) {
    if (!t.read) continue;
    reads = true;
    rt.memcpy_async(t.host.raw_data_ptr(), t.device.raw_data_ptr(), static_cast<size_t>(t.device.nbytes()),
                    CopyKind::DeviceToHost, stream.handle());
  }
  const bool after_ready = reads || recv_ready;
  if (after_ready) rt.stream_write_value(stream.handle(), worker.ready_word(), sequence);
  {
    std::lock_guard<std::mutex> lock(state->mutex);
    ++state->submitted;  // (here: a group that failed before reaching its worker is not waited for)
  }
  worker.push(sequence, after_ready, {order, device_index, device_order}, std::move(run));
  if (ordered) ordered_issued_ = order;
  if (nccl_order) device_issued_[device_index] = device_order;
  // fault::Point::kGlooDoneFlag removed (a negative control, multiprocess_test): the stream copies
  // the host copies back without waiting for the collectives to have written them.
  if (!fault::removed(fault::Point::kGlooDoneFlag)) rt.stream_wait_value(stream.handle(), worker.done_word(), sequence);
  for (const StagedTensor& t : staged_tensors) {
    if (!t.written) continue;
    rt.memcpy_async(t.device.raw_data_ptr(), t.host.raw_data_ptr(), static_cast<size_t>(t.device.nbytes()),
                    CopyKind::HostToDevice, stream.handle());
  }
  // The works and host blocks stay here until the stream has passed the group. The device tensors
  // do not: the copies hold raw pointers, as CUDA's do, and what keeps their memory from reuse is
  // the process group's record_stream on this stream (stream_group.cpp), as it must be on a GPU.
  Staging st{Event(), std::move(works), &pool, std::move(blocks)};
  st.done.record(stream);
  std::lock_guard<std::mutex> lock(staging_mutex_);
  staging_.push_back(std::move(st));
}

void GlooStreamCommunicator::abort(const std::string& why) {
  // A collective already inside Gloo ends at Gloo's own timeout (the group's); later ones fail at once.
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (state_->aborted.empty()) state_->aborted = why;
}

uint64_t GlooStreamCommunicator::groups_posted() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->issued;
}

int GlooStreamCommunicator::lanes_waiting_turn() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->waiting_turn;
}

void GlooStreamCommunicator::wait_until_issued() {
  State& s = *state_;
  std::unique_lock<std::mutex> lock(s.mutex);
  if (s.issued == s.submitted) return;
  note_host_sync();
  s.cv.wait(lock, [&] { return s.issued == s.submitted; });
}

void GlooStreamCommunicator::allreduce(const TensorList& tensors, ReduceOp op, const Stream& stream,
                                       const std::shared_ptr<StreamWork>& work) {
  std::vector<Operand> operands;
  for (const Tensor& t : tensors) operands.push_back({t, true, true});
  add("allreduce", operands, stream, work,
      [op](ProcessGroup& g, const TensorList& t) { return g.allreduce(t, op); });
}

void GlooStreamCommunicator::broadcast(const TensorList& tensors, int root, const Stream& stream,
                                       const std::shared_ptr<StreamWork>& work) {
  // The root's tensors are only read, the others' only written.
  const bool root_here = host_->rank() == root;
  std::vector<Operand> operands;
  for (const Tensor& t : tensors) operands.push_back({t, root_here, !root_here});
  add("broadcast", operands, stream, work,
      [root](ProcessGroup& g, const TensorList& t) { return g.broadcast(t, root); });
}

void GlooStreamCommunicator::allgather(const TensorList& outputs, const Tensor& input, const Stream& stream,
                                       const std::shared_ptr<StreamWork>& work) {
  std::vector<Operand> operands;
  for (const Tensor& o : outputs) operands.push_back({o, false, true});
  operands.push_back({input, true, false});
  const size_t n = outputs.size();
  add("allgather", operands, stream, work, [n](ProcessGroup& g, const TensorList& t) {
    return g.allgather(TensorList(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(n)), t[n]);
  });
}

void GlooStreamCommunicator::reduce_scatter(const Tensor& output, const TensorList& inputs, ReduceOp op,
                                            const Stream& stream, const std::shared_ptr<StreamWork>& work) {
  std::vector<Operand> operands{{output, false, true}};
  for (const Tensor& i : inputs) operands.push_back({i, true, false});
  add("reduce_scatter", operands, stream, work, [op](ProcessGroup& g, const TensorList& t) {
    return g.reduce_scatter(t[0], TensorList(t.begin() + 1, t.end()), op);
  });
}

void GlooStreamCommunicator::all_to_all(const TensorList& outputs, const TensorList& inputs, const Stream& stream,
                                        const std::shared_ptr<StreamWork>& work) {
  std::vector<Operand> operands;
  for (const Tensor& o : outputs) operands.push_back({o, false, true});
  for (const Tensor& i : inputs) operands.push_back({i, true, false});
  const size_t n = outputs.size();
  add("all_to_all", operands, stream, work, [n](ProcessGroup& g, const TensorList& t) {
    const auto mid = t.begin() + static_cast<std::ptrdiff_t>(n);
    return g.all_to_all(TensorList(t.begin(), mid), TensorList(mid, t.end()));
  });
}

void GlooStreamCommunicator::send(const Tensor& tensor, int dst, int tag, const Stream& stream,
                                  const std::shared_ptr<StreamWork>& work) {
  add("send", {{tensor, true, false}}, stream, work,
      [dst, tag](ProcessGroup& g, const TensorList& t) { return g.send(t[0], dst, tag); }, /*ordered=*/false);
}

void GlooStreamCommunicator::recv(const Tensor& tensor, int src, int tag, const Stream& stream,
                                  const std::shared_ptr<StreamWork>& work) {
  add("recv", {{tensor, false, true}}, stream, work,
      [src, tag](ProcessGroup& g, const TensorList& t) { return g.recv(t[0], src, tag); }, /*ordered=*/false);
}

}  // namespace chorus::distributed
