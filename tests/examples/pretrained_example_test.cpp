// --init-from: examples/gpt and examples/bert fine-tune from published-format folders made at test
// time (tests/models/make_pretrained.py with Debian's python3-torch; GPT-2's tokenizer files from
// tests/data/gpt2_bpe_reference.py), as a user fine-tunes a downloaded checkpoint; and refuse
// folders that do not fit with a message naming what is wrong. Whether the weights load to
// PyTorch's outputs is tests/models:pretrained_test's part.
#include <catch2/catch.hpp>

#include <filesystem>

#include "tests/examples/example_runs.h"

namespace {

using namespace chorus::testing::examples;
namespace fs = std::filesystem;

std::string script(const std::string& path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  return "python3 " + (srcdir ? std::string(srcdir) + "/chorus/" : std::string()) + path;
}

// A GPT-2 folder (3 layers, 48 wide, 32 positions) with GPT-2-format tokenizer files of 657 tokens.
const std::string& gpt2_folder() {
  static const std::string dir = [] {
    const std::string root = scratch("gpt2_pretrained");
    Run tok = run(script("tests/data/gpt2_bpe_reference.py") + " " + root + "/tok");
    INFO(tok.output);
    REQUIRE(tok.code == 0);
    Run made = run(script("tests/models/make_pretrained.py") + " " + root + " --only gpt2 --gpt2-vocab 657");
    INFO(made.output);
    REQUIRE(made.code == 0);
    for (const char* f : {"vocab.json", "merges.txt"}) fs::copy_file(root + "/tok/" + f, root + "/gpt2/" + f);
    return root + "/gpt2";
  }();
  return dir;
}

// A BertForMaskedLM folder (2 layers, 32 wide) over `vocab` word pieces.
std::string bert_folder(int vocab) {
  const std::string root = scratch("bert_pretrained_" + std::to_string(vocab));
  Run made = run(script("tests/models/make_pretrained.py") + " " + root + " --only bert --bert-vocab " + std::to_string(vocab));
  INFO(made.output);
  REQUIRE(made.code == 0);
  return root + "/bert";
}

const std::string kGptFlags = " --steps 6 --seq-len 16 --batch-size 8 --eval-sequences 16 --threads 1 --log-every 100";

}  // namespace

TEST_CASE("gpt --init-from fine-tunes a Hugging Face GPT-2 folder with GPT-2's tokenizer", "[examples][pretrained]") {
  const std::string dir = gpt2_folder();
  // Two seeds: initialization comes from the file, so the held-out loss before training is the same.
  Run a = run(binary("examples/gpt/gpt") + " --init-from " + dir + kGptFlags + " --seed 1 --sample 6 --temperature 0");
  Run b = run(binary("examples/gpt/gpt") + " --init-from " + dir + kGptFlags + " --seed 2");
  INFO(a.output << "\n---\n" << b.output);
  REQUIRE(a.code == 0);
  REQUIRE(b.code == 0);
  CHECK(a.summary["init_from"] == dir);
  CHECK(a.summary["tokenizer"] == "gpt2");
  CHECK(a.summary["vocab_size"] == 657);
  CHECK(a.summary["parameters"] == 657 * 48 + 32 * 48 + 3 * (2 * 48 + 48 * 144 + 144 + 48 * 48 + 48 + 2 * 48 + 48 * 192 + 192 + 192 * 48 + 48) + 2 * 48);
  CHECK(a.output.find("weights: 40 tensors from " + dir + "/model.safetensors") != std::string::npos);
  CHECK(a.summary["heldout_loss_before"].get<double>() == b.summary["heldout_loss_before"].get<double>());
  CHECK(a.summary["heldout_loss"].get<double>() < a.summary["heldout_loss_before"].get<double>());
  CHECK(!a.summary["sample"].get<std::string>().empty());
}

TEST_CASE("bert --init-from fine-tunes a Hugging Face BertForMaskedLM folder", "[examples][pretrained]") {
  const std::string dir = bert_folder(30522);  // the installed bert-base-uncased vocabulary's size
  Run r = run(binary("examples/bert/bert") + " --init-from " + dir +
              " --steps 2 --seq-len 32 --batch-size 4 --eval-sequences 8 --threads 1");
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK(r.summary["init_from"] == dir);
  CHECK(r.output.find("4 tensors kept as initialized: bert.pooler.dense.weight, bert.pooler.dense.bias, "
                      "cls.seq_relationship.weight, cls.seq_relationship.bias") != std::string::npos);
  CHECK(r.output.find("BERT " + dir + ": 1027964 parameters") != std::string::npos);
}

TEST_CASE("--init-from refuses folders that do not fit, naming what is wrong", "[examples][pretrained]") {
  const std::string gpt = gpt2_folder();
  Run both = run(binary("examples/gpt/gpt") + " --init-from " + gpt + " --config mini");
  CHECK(both.code != 0);
  CHECK(both.output.find("--config excludes --init-from") != std::string::npos);
  // A model folder without GPT-2's tokenizer files.
  const std::string bare = scratch("gpt2_no_tokenizer");
  fs::create_directories(bare);
  for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(gpt + "/" + f, bare + "/" + f);
  Run no_tok = run(binary("examples/gpt/gpt") + " --init-from " + bare + kGptFlags);
  CHECK(no_tok.code != 0);
  CHECK(no_tok.output.find("cannot open " + bare + "/vocab.json") != std::string::npos);
  // A GPT-2 folder given to BERT.
  Run family = run(binary("examples/bert/bert") + " --init-from " + gpt + " --steps 2 --seq-len 32 --batch-size 4");
  CHECK(family.code != 0);
  CHECK(family.output.find(gpt + "/config.json: model_type is \"gpt2\", expected \"bert\"") != std::string::npos);
  // A BERT whose vocabulary is smaller than the word pieces it would be fed.
  const std::string small = bert_folder(101);
  Run vocab = run(binary("examples/bert/bert") + " --init-from " + small + " --steps 2 --seq-len 32 --batch-size 4");
  CHECK(vocab.code != 0);
  CHECK(vocab.output.find("has 30522 word pieces, more than the model's vocab_size 101") != std::string::npos);
  // A folder that does not exist.
  Run none = run(binary("examples/gpt/gpt") + " --init-from /nonexistent/gpt2" + kGptFlags);
  CHECK(none.code != 0);
  CHECK(none.output.find("/nonexistent/gpt2/config.json: cannot open it") != std::string::npos);
}
