// All of nn's functional forms: `namespace F = chorus::nn::functional;`.
#pragma once

#include "nn/functional/attention.h"
#include "nn/functional/basic.h"
#include "nn/functional/conv.h"
#include "nn/functional/embedding_bag.h"
#include "nn/functional/loss.h"
#include "nn/functional/normalization.h"
#include "nn/functional/pad.h"
#include "nn/functional/upsample.h"
