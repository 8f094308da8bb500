// Published weights into chorus's models: Hugging Face's GPT2LMHeadModel and BertForMaskedLM
// (a folder with config.json and model.safetensors, as save_pretrained writes it and the hub
// serves it), and torchvision's ResNet state dicts saved as safetensors.
//
// chorus's models already use those formats' names and layouts (GPT-2's Conv1D weights are
// [in, out], BERT's and torchvision's Linear weights [out, in]), so loading is by name. What the
// loaders add to load_state_dict:
// - both layouts the hub uses for GPT-2: names with the head model's prefix ("transformer.h.0...")
//   and the bare GPT2Model's ("h.0..."); BERT's files name "bert." themselves or not, but must
//   have the masked-LM head (cls.predictions.*: a bare BertModel file is refused as incomplete);
// - tied weights: the LM heads are the token embeddings in chorus; a file that holds the head's
//   copy (lm_head.weight, cls.predictions.decoder.weight / .bias) must hold the same values;
// - buffers chorus computes instead of storing (GPT-2's attn.bias / attn.masked_bias causal masks,
//   BERT's embeddings.position_ids) are skipped; TensorFlow-era BERT names (LayerNorm.gamma /
//   .beta) are read as weight / bias;
// - BertForMaskedLM has no pooler and no next-sentence head: those keep their initial values and
//   are named in the report (as Hugging Face's "newly initialized" warning);
// - anything else missing or extra, a shape that differs, or integer data for a float parameter is
//   a chorus::Error naming the file, the tensors and what the model expected. float16 / bfloat16
//   files load into float32 parameters.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "examples/models/bert.h"
#include "examples/models/gpt.h"
#include "examples/models/resnet.h"

namespace chorus::models {

struct LoadReport {
  std::vector<std::string> initialized;  // model tensors the file did not have (kept as they were)
  std::vector<std::string> skipped;      // file tensors chorus does not store (buffers it computes)
};

// GPT-2's config.json (Hugging Face GPT2Config: vocab_size, n_positions, n_embd, n_layer, n_head,
// layer_norm_epsilon, resid_pdrop, activation_function "gelu_new" or "gelu_pytorch_tanh", n_inner
// null or 4 n_embd, tied embeddings). Another model_type or an option chorus does not implement is
// an error; chorus has one dropout rate, so embd_pdrop and attn_pdrop are read as resid_pdrop.
GPTConfig gpt2_config_from_json(const std::string& path);
// BertConfig's config.json (hidden_act "gelu", position_embedding_type "absolute").
BertConfig bert_config_from_json(const std::string& path);

// Loads a safetensors file into an existing model (its sizes must match the file's).
LoadReport load_gpt2_weights(GPT2LMHeadModel& model, const std::string& safetensors_path);
LoadReport load_bert_weights(BertForPreTraining& model, const std::string& safetensors_path);
// torchvision's resnet18/34/50 state_dict (running statistics and num_batches_tracked included).
LoadReport load_resnet_weights(ResNet& model, const std::string& safetensors_path);

// A model built from DIR/config.json with DIR/model.safetensors loaded into it, on the CPU in float32.
std::shared_ptr<GPT2LMHeadModel> gpt2_from_pretrained(const std::string& dir, LoadReport* report = nullptr);
std::shared_ptr<BertForPreTraining> bert_from_pretrained(const std::string& dir, LoadReport* report = nullptr);

}  // namespace chorus::models
