// Everything in data/: datasets, samplers, the DataLoader, MNIST / Fashion-MNIST.
#pragma once

#include "data/dataloader.h"
#include "data/dataset.h"
#include "data/mnist.h"
#include "data/sampler.h"
#include "data/tokenizer.h"
