// Everything in data/: datasets, samplers, the DataLoader, MNIST / Fashion-MNIST, WordPiece and
// masked-LM text data.
#pragma once

#include "data/dataloader.h"
#include "data/dataset.h"
#include "data/mnist.h"
#include "data/sampler.h"
#include "data/bpe.h"
#include "data/gpt2_tokenizer.h"
#include "data/tokenizer.h"
#include "data/mlm.h"
