// BERT: Hugging Face BertForPreTraining's parameter names and counts, shapes, the padding mask,
// the tied decoder, and the masked-LM loss at initialization (≈ ln 30522).
#include <catch2/catch.hpp>

#include <cmath>
#include <map>

#include "examples/models/bert.h"
#include "tensor/ops.h"

namespace chorus {
namespace {

int64_t count_parameters(nn::Module& m) {
  int64_t n = 0;
  for (const Tensor& p : m.parameters()) n += p.numel();
  return n;
}

TEST_CASE("BERT-base has BertForPreTraining's parameter count and names", "[models][bert]") {
  models::BertForPreTraining m(models::BertConfig::named("base"));
  // BertModel 109,482,240 + transform 590,592 + its LayerNorm 1,536 + decoder bias 30,522 +
  // seq_relationship 1,538; the decoder weight is the (tied) word embedding matrix.
  CHECK(count_parameters(m) == 110106428);
  std::map<std::string, Shape> shapes;
  for (auto& [name, t] : m.state_dict()) shapes[name] = t.sizes();
  CHECK(shapes.at("bert.embeddings.word_embeddings.weight") == Shape{30522, 768});
  CHECK(shapes.at("bert.embeddings.position_embeddings.weight") == Shape{512, 768});
  CHECK(shapes.at("bert.embeddings.token_type_embeddings.weight") == Shape{2, 768});
  CHECK(shapes.at("bert.embeddings.LayerNorm.weight") == Shape{768});
  CHECK(shapes.at("bert.encoder.layer.0.attention.self.query.weight") == Shape{768, 768});
  CHECK(shapes.at("bert.encoder.layer.0.attention.output.dense.bias") == Shape{768});
  CHECK(shapes.at("bert.encoder.layer.0.attention.output.LayerNorm.weight") == Shape{768});
  CHECK(shapes.at("bert.encoder.layer.11.intermediate.dense.weight") == Shape{3072, 768});
  CHECK(shapes.at("bert.encoder.layer.11.output.dense.weight") == Shape{768, 3072});
  CHECK(shapes.at("bert.encoder.layer.11.output.LayerNorm.bias") == Shape{768});
  CHECK(shapes.at("bert.pooler.dense.weight") == Shape{768, 768});
  CHECK(shapes.at("cls.predictions.bias") == Shape{30522});
  CHECK(shapes.at("cls.predictions.transform.dense.weight") == Shape{768, 768});
  CHECK(shapes.at("cls.predictions.transform.LayerNorm.bias") == Shape{768});
  CHECK(shapes.at("cls.seq_relationship.weight") == Shape{2, 768});
  CHECK(shapes.count("bert.encoder.layer.12.output.dense.weight") == 0);
  CHECK_THROWS_WITH(models::BertConfig::named("huge"), Catch::Contains("tiny, mini, small or base"));
}

TEST_CASE("BERT-tiny: shapes, initialization, padding mask, masked-LM loss at init", "[models][bert]") {
  manual_seed(3);
  models::BertForPreTraining m(models::BertConfig::named("tiny"));
  m.eval();
  Tensor ids = randint(1000, 30000, {2, 16}, {.dtype = kInt64});
  models::BertOutputs out = m.forward(ids, Tensor(), Tensor());
  CHECK(out.prediction_logits.sizes() == Shape{2, 16, 30522});
  CHECK(out.seq_relationship_logits.sizes() == Shape{2, 2});
  // N(0, 0.02) weights; the [PAD] row of the word embeddings is zero.
  const Tensor& emb = m.bert->embeddings->word_embeddings->weight;
  CHECK(chorus::std(emb).item<float>() == Approx(0.02).epsilon(0.02));
  CHECK(emb[0].abs().max().item<float>() == 0.0f);
  // With random init the masked-LM loss starts near ln(vocab).
  const double loss = nn::functional::cross_entropy(out.prediction_logits.reshape({-1, 30522}), ids.reshape({-1})).item<float>();
  CHECK(loss == Approx(std::log(30522.0)).epsilon(0.02));
  // Padding: with the last 6 positions masked, changing their ids leaves the others' outputs alone.
  Tensor mask = ones({2, 16}, {.dtype = kInt64});
  mask.narrow(1, 10, 6).zero_();
  Tensor other = ids.clone();
  other.narrow(1, 10, 6).fill_(2000);
  Tensor a = m.bert->forward(ids, Tensor(), mask).narrow(1, 0, 10);
  Tensor b = m.bert->forward(other, Tensor(), mask).narrow(1, 0, 10);
  CHECK((a - b).abs().max().item<float>() < 1e-5);
  Tensor c = m.bert->forward(other, Tensor(), Tensor()).narrow(1, 0, 10);
  CHECK((a - c).abs().max().item<float>() > 1e-3);  // without the mask they do change
  // The decoder is tied: a gradient reaches the word embeddings through the output layer too.
  m.train();
  nn::functional::cross_entropy(m.forward(ids).reshape({-1, 30522}), ids.reshape({-1})).backward();
  CHECK(emb.grad().defined());
  CHECK_THROWS_WITH(m.forward(randint(0, 10, {1, 600}, {.dtype = kInt64})), Catch::Contains("max_position_embeddings"));
}

}  // namespace
}  // namespace chorus

namespace chorus {
namespace {

TEST_CASE("BERT-tiny on the sim device equals the CPU model (position and type ids made on the device)",
          "[models][bert][sim]") {
  manual_seed(6);
  models::BertConfig c = models::BertConfig::named("tiny");
  c.hidden_dropout_prob = 0;
  c.attention_probs_dropout_prob = 0;
  c.vocab_size = 300;
  models::BertForPreTraining cpu(c);
  manual_seed(6);
  models::BertForPreTraining dev(c);
  dev.to(Device::sim(0));
  Tensor ids = randint(5, 300, {2, 9});
  Tensor a = cpu.forward(ids, Tensor(), Tensor()).prediction_logits;
  Tensor b = dev.forward(ids.to(Device::sim(0)), Tensor(), Tensor()).prediction_logits;
  CHECK(b.device() == Device::sim(0));
  CHECK(equal(a, b.cpu()));
}

TEST_CASE("masked_lm_loss on the labeled positions equals the full head with ignored labels", "[models][bert]") {
  manual_seed(4);
  models::BertConfig c = models::BertConfig::named("tiny");
  c.hidden_dropout_prob = 0;
  c.attention_probs_dropout_prob = 0;
  c.vocab_size = 500;
  models::BertForPreTraining m(c);
  Tensor ids = randint(5, 500, {3, 10});
  Tensor mask = ones({3, 10}, TensorOptions{.dtype = kInt64});
  Tensor labels = full({3, 10}, int64_t{-100}, TensorOptions{.dtype = kInt64});
  for (auto [i, j] : std::vector<std::pair<int, int>>{{0, 1}, {0, 7}, {1, 4}, {2, 0}, {2, 9}}) {
    labels[i][j].fill_(ids[i][j].item<int64_t>() + 1);
  }
  Tensor logits, targets;
  Tensor picked = m.masked_lm_loss(ids, mask, labels, &logits, &targets);
  CHECK(logits.sizes() == Shape{5, 500});
  CHECK(targets[3].item<int64_t>() == ids[2][0].item<int64_t>() + 1);
  picked.backward();
  std::map<std::string, Tensor> g1;
  for (auto& [name, p] : m.named_parameters()) {
    if (!p.grad().defined()) continue;  // the pooler and the NSP head take no part
    g1[name] = p.grad().clone();
    Tensor g = p.grad();
    g.zero_();
  }
  CHECK(g1.size() == m.named_parameters().size() - 4);
  Tensor full_logits = m.forward(ids, Tensor(), mask).prediction_logits;
  Tensor reference = nn::functional::cross_entropy(full_logits.reshape({-1, 500}), labels.reshape({-1}));
  CHECK(picked.item<double>() == Approx(reference.item<double>()).epsilon(1e-5));
  reference.backward();
  for (auto& [name, p] : m.named_parameters()) {
    if (!g1.count(name)) continue;
    INFO(name);
    CHECK(allclose(g1.at(name), p.grad(), 1e-4, 1e-6));
  }
  CHECK_THROWS_WITH(m.masked_lm_loss(ids, mask, full({3, 10}, int64_t{-100}, TensorOptions{.dtype = kInt64})),
                    Catch::Contains("no position has a label"));
  CHECK_THROWS_WITH(m.masked_lm_loss(ids, mask, labels.reshape({30})), Catch::Contains("must have the shape"));
}

}  // namespace
}  // namespace chorus
