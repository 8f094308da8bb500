// CPU kernels for fused nn ops that are not plain elementwise or reductions: layer norm and
// cross-entropy, each forward with its backward. Contiguous inputs: float32 or float64, or float16/
// bfloat16 storage whose statistics, weight, bias, losses and parameter gradients are float32 (the
// math at float; kernels/cpu/loops.h, widened_row).
#pragma once

#include "tensor/tensor.h"

namespace chorus::kernels::cpu {

// x viewed as [rows, cols]; normalizes each row. Writes out, and per-row mean and rstd (float
// tensors [rows]). weight/bias [cols] or undefined.
void layer_norm(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& x, const Tensor& weight,
                const Tensor& bias, int64_t rows, int64_t cols, double eps);
// grad_x [rows, cols]; grad_weight/grad_bias [cols] (undefined when not wanted).
void layer_norm_backward(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& g,
                         const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& weight, int64_t rows,
                         int64_t cols);

// logits [rows, C] (contiguous), target int64 [rows]. Writes per-row losses [rows] (0 for ignored
// rows), per-row target weight [rows] (w[y], 0 when ignored: the mean's denominator), and the
// softmax probabilities [rows, C] saved for backward. class_weight [C] or undefined.
void cross_entropy(const Tensor& losses, const Tensor& row_weight, const Tensor& probs, const Tensor& logits,
                   const Tensor& target, const Tensor& class_weight, int64_t ignore_index, double label_smoothing);
// grad_logits[r, k] = row_scale[r] * ((1-eps) w_y (p_k - [k==y]) + eps/C (W p_k - w_k)), rows with
// ignored targets get 0.
void cross_entropy_backward(const Tensor& grad_logits, const Tensor& row_scale, const Tensor& probs,
                            const Tensor& target, const Tensor& class_weight, int64_t ignore_index,
                            double label_smoothing);

}  // namespace chorus::kernels::cpu
