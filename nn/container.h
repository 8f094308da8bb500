// Containers: Sequential (runs its modules in order) and ModuleList (holds modules, indexable).
// Children are registered under "0", "1", ... as in PyTorch, so state-dict names match.
#pragma once

#include <initializer_list>
#include <memory>
#include <vector>

#include "nn/module.h"

namespace chorus::nn {

class Sequential : public Module {
 public:
  Sequential() : Module("Sequential") {}
  Sequential(std::initializer_list<std::shared_ptr<Module>> modules);
  void push_back(std::shared_ptr<Module> module);
  Tensor forward(const Tensor& input) override;
  size_t size() const { return modules_.size(); }
  std::shared_ptr<Module> operator[](size_t i) const;

 private:
  std::vector<std::shared_ptr<Module>> modules_;
};

class ModuleList : public Module {
 public:
  ModuleList() : Module("ModuleList") {}
  ModuleList(std::initializer_list<std::shared_ptr<Module>> modules);
  void push_back(std::shared_ptr<Module> module);
  size_t size() const { return modules_.size(); }
  std::shared_ptr<Module> operator[](size_t i) const;
  // Typed access: list.at<Linear>(0)->weight.
  template <typename M>
  std::shared_ptr<M> at(size_t i) const {
    auto m = std::dynamic_pointer_cast<M>((*this)[i]);
    if (!m) fail("ModuleList::at: element {} is a {}, not the requested type", i, (*this)[i]->type_name());
    return m;
  }
  std::vector<std::shared_ptr<Module>>::const_iterator begin() const { return modules_.begin(); }
  std::vector<std::shared_ptr<Module>>::const_iterator end() const { return modules_.end(); }

 private:
  std::vector<std::shared_ptr<Module>> modules_;
};

}  // namespace chorus::nn
