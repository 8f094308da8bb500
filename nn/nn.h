// Everything in nn: Module, layers, containers, functional forms, init.
#pragma once

#include "autograd/grad_mode.h"
#include "nn/activation.h"
#include "nn/batchnorm.h"
#include "nn/container.h"
#include "nn/conv.h"
#include "nn/conv_transpose.h"
#include "nn/functional.h"
#include "nn/init.h"
#include "nn/layers.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/module.h"
#include "nn/normalization.h"
#include "nn/padding.h"
#include "nn/transformer.h"
#include "nn/upsample.h"
