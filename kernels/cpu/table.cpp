// Fills the cpu kernel table from the cpu kernels (kernels.h, conv.h, nn_basic.h), and defines the
// explicit-Philox-position random fills the table uses.
#include "kernels/cpu/table.h"

#include "kernels/cpu/conv.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/nn_basic.h"

namespace chorus::kernels::cpu {

void uniform_at(const Tensor& out, double low, double high, uint64_t seed, uint64_t first_block) {
  Generator gen(seed);
  gen.set_state(seed, first_block);
  uniform(out, low, high, gen);
}
void normal_at(const Tensor& out, double mean, double std, uint64_t seed, uint64_t first_block) {
  Generator gen(seed);
  gen.set_state(seed, first_block);
  normal(out, mean, std, gen);
}
void random_int_at(const Tensor& out, int64_t low, int64_t high, uint64_t seed, uint64_t first_block) {
  Generator gen(seed);
  gen.set_state(seed, first_block);
  random_int(out, low, high, gen);
}

const KernelTable& kernel_table() {
  static const KernelTable table = [] {
    KernelTable t;
    t.device_name = "cpu";
#define CHORUS_CPU_ENTRY(name, params, args) t.name = &cpu::name;
    CHORUS_KERNEL_LIST(CHORUS_CPU_ENTRY)
#undef CHORUS_CPU_ENTRY
    return t;
  }();
  return table;
}

}  // namespace chorus::kernels::cpu
