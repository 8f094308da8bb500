// Containers: Sequential (runs its modules in order), ModuleList (holds modules, indexable) and
// ModuleDict (modules by name, in insertion order). Children are registered under "0", "1", ...
// (ModuleDict: under their keys) as in PyTorch, so state-dict names match.
#pragma once

#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
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

// Ordered as inserted; assigning to an existing key replaces the module in its place (PyTorch's
// __setitem__). Keys are submodule names: non-empty, without '.'. No forward, as PyTorch's.
class ModuleDict : public Module {
 public:
  using Item = std::pair<std::string, std::shared_ptr<Module>>;
  ModuleDict() : Module("ModuleDict") {}
  ModuleDict(std::initializer_list<Item> items);
  void insert(const std::string& key, std::shared_ptr<Module> module);
  void update(const std::vector<Item>& items);
  // Removes and returns the module under key.
  std::shared_ptr<Module> pop(const std::string& key);
  void clear();
  bool contains(const std::string& key) const;
  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  std::shared_ptr<Module> operator[](const std::string& key) const;
  // Typed access: dict.at<Linear>("fc")->weight.
  template <typename M>
  std::shared_ptr<M> at(const std::string& key) const {
    auto m = std::dynamic_pointer_cast<M>((*this)[key]);
    if (!m) fail("ModuleDict::at: '{}' is a {}, not the requested type", key, (*this)[key]->type_name());
    return m;
  }
  std::vector<std::string> keys() const;
  std::vector<std::shared_ptr<Module>> values() const;
  const std::vector<Item>& items() const { return items_; }
  std::vector<Item>::const_iterator begin() const { return items_.begin(); }
  std::vector<Item>::const_iterator end() const { return items_.end(); }

 private:
  std::vector<Item>::const_iterator find(const std::string& key) const;
  std::vector<Item> items_;
};

}  // namespace chorus::nn
