// Writes the seed corpus of every fuzz target (tests/fuzz/corpus/<target>/seed-*), from chorus's own
// writers where there is one, so the seeds are what real files look like:
//   bazel run -c opt //tests/fuzz:make_seeds -- $PWD/tests/fuzz/corpus
// Inputs that found bugs are added beside the seeds by hand (named after the finding) and never
// regenerated.
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "distributed/pipeline/plan.h"
#include "distributed/store_protocol.h"
#include "examples/common/example_util.h"
#include "tests/fuzz/checkpoint_model.h"

namespace {

namespace fs = std::filesystem;
using namespace chorus;

fs::path root;

void put(const std::string& target, const std::string& name, const std::string& bytes) {
  fs::create_directories(root / target);
  std::ofstream(root / target / ("seed-" + name), std::ios::binary) << bytes;
}

std::string read(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string gzip(const std::string& raw) {
  z_stream z{};
  deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);
  std::string out(deflateBound(&z, raw.size()) + 32, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(raw.data()));
  z.avail_in = static_cast<uInt>(raw.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

std::string be32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8), static_cast<char>(v)};
}

void checkpoint_seeds() {
  // The model, optimizer and scheduler of tests/fuzz/checkpoint.cpp, after two steps.
  fuzz::CheckpointModel state;
  for (int i = 0; i < 2; ++i) state.step();
  const fs::path tmp = fs::temp_directory_path() / "chorus-make-seeds.safetensors";
  examples::save_checkpoint(tmp, *state.model, *state.opt, *state.sched, 1, 2, {{"model", "fuzz"}, {"step_in_epoch", "0"}});
  put("checkpoint", "adam-mlp.safetensors", read(tmp));
  // A plain safetensors file with several dtypes (not a checkpoint: the reader accepts it, the
  // resume refuses it).
  nn::save_safetensors(tmp, {{"f64", randn({2, 2}, TensorOptions{.dtype = kFloat64})},
                             {"i64", randint(0, 9, {3})},
                             {"u8", randint(0, 255, {4}).to(kUInt8)},
                             {"scalar", tensor<float>({1.5f}).reshape({})}},
                       {{"note", "several dtypes"}});
  put("checkpoint", "dtypes.safetensors", read(tmp));
  fs::remove(tmp);
}

void idx_seeds() {
  std::string labels = be32(0x00000801) + be32(5);
  for (int i = 0; i < 5; ++i) labels.push_back(static_cast<char>(i * 2));
  std::string images = be32(0x00000803) + be32(2) + be32(3) + be32(4);
  for (int i = 0; i < 24; ++i) images.push_back(static_cast<char>(i * 10));
  put("idx", "labels", labels);
  put("idx", "images", images);
  put("idx", "images.gz", gzip(images));
  put("idx", "truncated", images.substr(0, 20));
}

void wordpiece_seeds() {
  put("wordpiece", "text", "The unaffable runners, running! caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 overs.");
  put("wordpiece", "vocab-and-text", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\n##s\nworld\n\x01hellos world hello!");
  put("wordpiece", "malformed-utf8", "caf\xc3 \xff\xfe ok \xe2\x82");
}

void store_frame_seeds() {
  namespace sp = distributed::store_protocol;
  auto b = [](const std::string& s) { return distributed::Bytes(s.begin(), s.end()); };
  auto str = [](const distributed::Bytes& v) { return std::string(v.begin(), v.end()); };
  std::string session = "\x07";  // chunks of 8 bytes
  session += str(sp::encode(sp::kSet, {b("rank0"), b("addr")}));
  session += str(sp::encode(sp::kAdd, {b("counter"), sp::i64_bytes(5)}));
  session += str(sp::encode(sp::kGet, {b("rank0")}));
  session += str(sp::encode(sp::kCompareSet, {b("k"), b(""), b("v")}));
  session += str(sp::encode(sp::kCheck, {b("rank0"), b("k")}));
  session += str(sp::encode(sp::kDelete, {b("k")}));
  session += str(sp::encode(sp::kNumKeys, {}));
  put("store_frames", "session", session);
  put("store_frames", "oversized", std::string("\x3f") + std::string("\xff\xff\xff\x7f", 4) + "x");
}

void file_store_seeds() {
  const fs::path tmp = fs::temp_directory_path() / "chorus-make-seeds.store";
  fs::remove(tmp);
  {
    distributed::FileStore store(tmp);
    store.set("a", std::string("1"));
    store.add("counter", 7);
    store.set("b", std::string("two"));
    store.delete_key("b");
  }
  put("file_store", "records", read(tmp));
  fs::remove(tmp);
}

void plan_seeds() {
  namespace pp = distributed::pipeline;
  put("plan_json", "hybrid", pp::plan_to_json(pp::uniform_plan(8, {4}, {2, 1}, 32, 4, "1f1b")));
  put("plan_json", "three-stages", pp::plan_to_json(pp::uniform_plan(6, {2, 4}, {1, 1, 1}, 12, 3, "gpipe")));
  pp::PipelinePlan predicted = pp::uniform_plan(4, {1}, {1, 2}, 16, 2, "1f1b");
  predicted.predicted = pp::PlanPrediction{12.25, {1000, 800}, 1};
  put("plan_json", "with-predictions", pp::plan_to_json(predicted));
  put("plan_json", "bad-layers",
      R"({"version":1,"num_layers":4,"global_batch":8,"micro_batches":2,"schedule":"1f1b",)"
      R"("stages":[{"layers":[0,3],"ranks":[0]},{"layers":[2,4],"ranks":[1]}]})");
}

void launch_env_seeds() {
  put("launch_env", "torchrun", "RANK=1\nWORLD_SIZE=4\nLOCAL_RANK=1\nMASTER_ADDR=10.0.0.1\nMASTER_PORT=29400\n");
  put("launch_env", "openmpi", "OMPI_COMM_WORLD_RANK=3\nOMPI_COMM_WORLD_SIZE=8\nOMPI_COMM_WORLD_LOCAL_RANK=1\nMASTER_ADDR=h1\n");
  put("launch_env", "slurm", "SLURM_PROCID=2\nSLURM_NTASKS=4\nSLURM_LOCALID=0\nSLURM_JOB_NODELIST=node[01-04,07],gpu5\n");
  put("launch_env", "bad", "RANK=two\nWORLD_SIZE=-2\nSLURM_NODELIST=n[008-010-ib\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds <corpus folder>\n");
    return 2;
  }
  root = argv[1];
  checkpoint_seeds();
  idx_seeds();
  wordpiece_seeds();
  store_frame_seeds();
  file_store_seeds();
  plan_seeds();
  launch_env_seeds();
  std::printf("seeds written under %s\n", root.c_str());
  return 0;
}
