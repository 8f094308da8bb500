#include "distributed/pipeline/blocks.h"

#include "tensor/error.h"

namespace chorus::distributed::pipeline {

BlockModel blocks_of(const std::shared_ptr<nn::Sequential>& model) {
  if (!model) fail("pipeline: the model is null");
  BlockModel m;
  m.model = model;
  for (auto& [name, child] : model->named_children()) {
    std::shared_ptr<nn::Module> layer = child;
    const std::string block = name;
    m.blocks.push_back({name, {name}, [layer, block](const TensorList& in) {
                          return TensorList{layer->forward(single_input(block, in))};
                        }});
  }
  return m;
}

void expect_inputs(const std::string& block, const TensorList& inputs, size_t count, const char* what) {
  if (inputs.size() != count) {
    fail("pipeline: block '{}' was given {} tensor(s); expected {} ({})", block, inputs.size(), count, what);
  }
}

const Tensor& single_input(const std::string& block, const TensorList& inputs) {
  expect_inputs(block, inputs, 1, "one tensor");
  return inputs[0];
}

}  // namespace chorus::distributed::pipeline
