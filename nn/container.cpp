#include "nn/container.h"

#include <fmt/format.h>

#include <algorithm>

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

ModuleDict::ModuleDict(std::initializer_list<Item> items) : Module("ModuleDict") {
  for (const auto& [key, module] : items) insert(key, module);
}

std::vector<ModuleDict::Item>::const_iterator ModuleDict::find(const std::string& key) const {
  return std::find_if(items_.begin(), items_.end(), [&](const Item& i) { return i.first == key; });
}

void ModuleDict::insert(const std::string& key, std::shared_ptr<Module> module) {
  if (!module) fail("ModuleDict: the module for key '{}' is null", key);
  auto it = find(key);
  if (it != items_.end()) {
    replace_module(key, module);
    items_[static_cast<size_t>(it - items_.begin())].second = std::move(module);
    return;
  }
  register_module(key, module);
  items_.emplace_back(key, std::move(module));
}

void ModuleDict::update(const std::vector<Item>& items) {
  for (const auto& [key, module] : items) insert(key, module);
}

std::shared_ptr<Module> ModuleDict::pop(const std::string& key) {
  auto it = find(key);
  if (it == items_.end()) fail("ModuleDict::pop: no key '{}' (keys: {})", key, fmt::join(keys(), ", "));
  std::shared_ptr<Module> m = it->second;
  unregister_module(key);
  items_.erase(it);
  return m;
}

void ModuleDict::clear() {
  for (const auto& [key, module] : items_) unregister_module(key);
  items_.clear();
}

bool ModuleDict::contains(const std::string& key) const { return find(key) != items_.end(); }

std::shared_ptr<Module> ModuleDict::operator[](const std::string& key) const {
  auto it = find(key);
  if (it == items_.end()) fail("ModuleDict: no key '{}' (keys: {})", key, fmt::join(keys(), ", "));
  return it->second;
}

std::vector<std::string> ModuleDict::keys() const {
  std::vector<std::string> out;
  for (const auto& [key, module] : items_) out.push_back(key);
  return out;
}

std::vector<std::shared_ptr<Module>> ModuleDict::values() const {
  std::vector<std::shared_ptr<Module>> out;
  for (const auto& [key, module] : items_) out.push_back(module);
  return out;
}

}  // namespace chorus::nn
