#include "nn/container.h"

namespace chorus::nn {

Sequential::Sequential(std::initializer_list<std::shared_ptr<Module>> modules) : Module("Sequential") {
  for (const auto& m : modules) push_back(m);
}

void Sequential::push_back(std::shared_ptr<Module> module) {
  register_module(std::to_string(modules_.size()), module);
  modules_.push_back(std::move(module));
}

Tensor Sequential::forward(const Tensor& input) {
  Tensor x = input;
  for (auto& m : modules_) x = m->forward(x);
  return x;
}

std::shared_ptr<Module> Sequential::operator[](size_t i) const {
  if (i >= modules_.size()) fail("Sequential: index {} is out of range for {} modules", i, modules_.size());
  return modules_[i];
}

ModuleList::ModuleList(std::initializer_list<std::shared_ptr<Module>> modules) : Module("ModuleList") {
  for (const auto& m : modules) push_back(m);
}

void ModuleList::push_back(std::shared_ptr<Module> module) {
  register_module(std::to_string(modules_.size()), module);
  modules_.push_back(std::move(module));
}

std::shared_ptr<Module> ModuleList::operator[](size_t i) const {
  if (i >= modules_.size()) fail("ModuleList: index {} is out of range for {} modules", i, modules_.size());
  return modules_[i];
}

}  // namespace chorus::nn
