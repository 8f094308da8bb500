// F::pad: grows (or, with negative amounts, crops) the trailing dims of a tensor, as
// torch.nn.functional.pad. A composite of differentiable ops (cat/narrow for constant, one
// index_select per dim for the others), so every device runs it and autograd derives the backward.
#pragma once

#include <vector>

#include "tensor/tensor.h"

namespace chorus::nn::functional {

enum class PadMode { Constant, Reflect, Replicate, Circular };

// `pad` lists (before, after) pairs from the last dim backwards, PyTorch's order:
// {left, right} pads dim -1, {left, right, top, bottom} dims -1 and -2.
// Constant: any number of dims, negative amounts crop. Reflect (mirror without repeating the edge;
// each amount < the dim's size), Replicate (repeat the edge) and Circular (wrap; each amount <= the
// dim's size): 1 to 3 trailing dims of an input with one or two leading dims (unbatched or batched),
// as PyTorch; negative amounts crop there too.
Tensor pad(const Tensor& input, const std::vector<int64_t>& pad, PadMode mode = PadMode::Constant,
           double value = 0.0);

const char* pad_mode_name(PadMode mode);

}  // namespace chorus::nn::functional
