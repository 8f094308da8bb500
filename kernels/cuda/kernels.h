// The CUDA kernels of the table (kernels/kernel_table.h), one .cu file per op family; each has the
// signature and semantics of its cpu twin (kernels/cpu/kernels.h, nn_basic.h, conv.h). Plain C++:
// table.cpp (g++) fills every entry of the cuda KernelTable from the kernels the .cu files define.
#pragma once

#include "kernels/kernel_table.h"

namespace chorus::kernels::cuda_impl {

#define CHORUS_CUDA_DECLARE(name, params, args) void name params;
CHORUS_KERNEL_LIST(CHORUS_CUDA_DECLARE)
#undef CHORUS_CUDA_DECLARE

}  // namespace chorus::kernels::cuda_impl
