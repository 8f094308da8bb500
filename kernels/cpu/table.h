// The cpu kernel table: every entry of CHORUS_KERNEL_LIST filled with the cpu kernel of that name.
#pragma once

#include "kernels/kernel_table.h"

namespace chorus::kernels::cpu {

const KernelTable& kernel_table();

}  // namespace chorus::kernels::cpu
