// The kernel-table registry behind kernels/dispatch.h. The cpu table is always present; other
// backends register theirs at static initialization.
#include "kernels/dispatch.h"

#include <mutex>

#include "kernels/cpu/table.h"
#include "kernels/shared/philox.h"

namespace chorus::kernels {
namespace {

struct Tables {
  std::mutex mutex;
  const KernelTable* tables[3] = {nullptr, nullptr, nullptr};
};

Tables& tables() {
  static Tables* t = [] {
    auto* r = new Tables();
    r->tables[static_cast<int>(DeviceType::CPU)] = &cpu::kernel_table();
    return r;
  }();
  return *t;
}

}  // namespace

void register_kernel_table(DeviceType type, const KernelTable* table) {
  Tables& t = tables();
  std::lock_guard<std::mutex> lock(t.mutex);
  t.tables[static_cast<int>(type)] = table;
}

bool has_kernels(DeviceType type) {
  Tables& t = tables();
  std::lock_guard<std::mutex> lock(t.mutex);
  return t.tables[static_cast<int>(type)] != nullptr;
}

const KernelTable& kernel_table(Device device, const char* kernel) {
  if (device.is_cpu()) return cpu::kernel_table();  // the common case, without the lock
  Tables& t = tables();
  const KernelTable* table;
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    table = t.tables[static_cast<int>(device.type)];
  }
  if (table == nullptr) {
    fail("{}: no {} device: this build of chorus has no kernels for {} (CUDA needs chorus built where a CUDA "
         "toolkit is installed)",
         kernel, device_type_name(device.type), device.str());
  }
  return *table;
}

uint64_t philox_blocks(RandomKind kind, DType dtype, int64_t numel) {
  // Values per 128-bit block, as the draws of kernels/shared/philox.h take them.
  namespace sm = ::chorus::kernels::shared;
  int64_t per_block = 0;
  switch (kind) {
    case RandomKind::Uniform:
      per_block = dtype == DType::Float64 ? sm::UniformDoubleDraw::kPerBlock : sm::UniformFloatDraw::kPerBlock;
      break;
    case RandomKind::Normal:
      per_block = dtype == DType::Float64 ? sm::NormalDoubleDraw::kPerBlock : sm::NormalFloatDraw::kPerBlock;
      break;
    case RandomKind::Int: per_block = sm::RandintDraw::kPerBlock; break;
  }
  return static_cast<uint64_t>((numel + per_block - 1) / per_block);
}

namespace detail {
void missing_kernel(const char* kernel, Device device) {
  // Every table chorus registers is complete (each backend's tests check it); this guards a backend
  // that registers a partial table.
  fail("{}: the kernel table registered for {} has no '{}' kernel (this tensor is on {}); move the tensors "
       "to the CPU with .cpu()",
       kernel, device_type_name(device.type), kernel, device.str());
}
}  // namespace detail

}  // namespace chorus::kernels
