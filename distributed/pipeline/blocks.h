// A model as an ordered list of blocks, the unit a pipeline plan cuts (docs/pipeline.md). A block
// takes and returns several tensors (hidden states, an attention mask, labels that the last block
// needs), owns part of the model's parameters by their names in the whole model, and computes with
// the modules its forward captured:
//
//   BlockModel m;
//   m.model = gpt;                                           // the whole model: the names' root
//   m.blocks.push_back({"embeddings", {"transformer.wte", "transformer.wpe"},
//                       [wte, wpe](const TensorList& in) { ...; return TensorList{x}; }});
//   for (i ...) m.blocks.push_back({"h." + i, {"transformer.h." + i}, ...});
//   m.blocks.push_back({"head", {"transformer.ln_f", "transformer.wte.weight"}, ...});   // tied
//
// - `owns` lists module paths (every parameter and buffer below them) or single parameter or
//   buffer names of `model`. A block's forward must use only tensors its block owns or receives.
// - A parameter owned by blocks of two pipeline stages is tied (GPT's and BERT's word embedding,
//   which the output head reuses): each of those stages keeps a copy and its optimizer state, and
//   the runtime sums the stages' gradients before every optimizer step (as Megatron-LM does), so
//   the copies stay identical.
// - Forwards must capture only the modules they use, not the whole model: a pipeline stage keeps
//   its own blocks and drops the others, so that each rank holds its stage's parameters only.
// - A Sequential is a BlockModel whose blocks are its children (blocks_of), named "0", "1", ...
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nn/container.h"
#include "nn/module.h"
#include "tensor/tensor.h"

namespace chorus::distributed::pipeline {

using BlockFn = std::function<TensorList(const TensorList&)>;

struct Block {
  std::string name;                 // in errors, profiles and plans ("embeddings", "h.3", "head")
  std::vector<std::string> owns;    // module paths or tensor names in the whole model
  BlockFn forward;
};

struct BlockModel {
  std::shared_ptr<nn::Module> model;  // the whole model (names are relative to it)
  std::vector<Block> blocks;
  size_t size() const { return blocks.size(); }
};

// A Sequential's children as blocks of one tensor each, named by their index in the Sequential
// ("3", owning "3": parameter names "3.weight" as the Sequential's own).
BlockModel blocks_of(const std::shared_ptr<nn::Sequential>& model);

// The block's single input, refusing any other count (for blocks of one tensor).
const Tensor& single_input(const std::string& block, const TensorList& inputs);
// Refuses a list of other than `count` tensors, naming the block and what it expects.
void expect_inputs(const std::string& block, const TensorList& inputs, size_t count, const char* what);

}  // namespace chorus::distributed::pipeline
