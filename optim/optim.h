// Everything in optim/: optimizers, learning-rate schedulers, gradient clipping.
#pragma once

#include "optim/clip_grad.h"
#include "optim/foreach.h"
#include "optim/lbfgs.h"
#include "optim/more_optimizers.h"
#include "optim/optimizer.h"
#include "optim/schedulers.h"
