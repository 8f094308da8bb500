// JSON for ModelProfile (see profile.h).
#include "distributed/pipeline/planner/profile.h"

#include <algorithm>

#include "distributed/pipeline/json_fields.h"

namespace chorus::distributed::pipeline::planner {

namespace jf = json_fields;

namespace {

// The measured points of a layer, sorted by batch size.
std::vector<BatchTiming> points(const LayerProfile& l, int64_t profile_batch) {
  std::vector<BatchTiming> p = l.timings;
  p.push_back({profile_batch, l.forward_ms, l.backward_ms});
  std::sort(p.begin(), p.end(), [](const BatchTiming& a, const BatchTiming& b) { return a.batch < b.batch; });
  return p;
}

}  // namespace

BatchTiming LayerProfile::time_at(double samples, int64_t profile_batch) const {
  const std::vector<BatchTiming> p = points(*this, profile_batch);
  auto scaled = [&](const BatchTiming& t) {
    const double k = samples / static_cast<double>(t.batch);
    return BatchTiming{0, t.forward_ms * k, t.backward_ms * k};
  };
  if (samples <= static_cast<double>(p.front().batch)) return scaled(p.front());
  if (samples >= static_cast<double>(p.back().batch)) return scaled(p.back());
  size_t hi = 1;
  while (static_cast<double>(p[hi].batch) < samples) ++hi;
  const BatchTiming &a = p[hi - 1], &b = p[hi];
  const double w = (samples - static_cast<double>(a.batch)) / static_cast<double>(b.batch - a.batch);
  return {0, a.forward_ms + w * (b.forward_ms - a.forward_ms), a.backward_ms + w * (b.backward_ms - a.backward_ms)};
}

std::pair<double, double> LayerProfile::min_ms_per_sample(int64_t profile_batch) const {
  // Between two points the time per sample (a + c s) / s is monotone in s, so its least value over
  // the interpolation is at a measured point.
  double f = forward_ms / static_cast<double>(profile_batch), b = backward_ms / static_cast<double>(profile_batch);
  for (const BatchTiming& t : timings) {
    f = std::min(f, t.forward_ms / static_cast<double>(t.batch));
    b = std::min(b, t.backward_ms / static_cast<double>(t.batch));
  }
  return {f, b};
}

ModelProfile profile_from_json(const std::string& text, const std::string& source) {
  const jf::Json j = jf::parse(text, source);
  jf::check_object(j, source, {"layers", "batch"}, {"model"});
  ModelProfile p;
  p.batch = jf::integer(j["batch"], source + ".batch", 1);
  if (j.contains("model")) p.model = jf::string(j["model"], source + ".model");
  const jf::Json& layers = jf::array(j["layers"], source + ".layers");
  if (layers.empty()) fail("{}.layers: got an empty array, expected at least one layer", source);
  for (size_t i = 0; i < layers.size(); ++i) {
    const std::string path = fmt::format("{}.layers[{}]", source, i);
    const jf::Json& l = layers[i];
    jf::check_object(l, path, {"name", "forward_ms", "backward_ms", "activation_bytes", "param_bytes"},
                     {"saved_bytes", "grad_accumulate_ms", "optimizer_ms", "timings"});
    LayerProfile lp;
    lp.name = jf::string(l["name"], path + ".name");
    lp.forward_ms = jf::number(l["forward_ms"], path + ".forward_ms");
    lp.backward_ms = jf::number(l["backward_ms"], path + ".backward_ms");
    lp.activation_bytes = jf::integer(l["activation_bytes"], path + ".activation_bytes");
    lp.param_bytes = jf::integer(l["param_bytes"], path + ".param_bytes");
    if (l.contains("saved_bytes")) lp.saved_bytes = jf::integer(l["saved_bytes"], path + ".saved_bytes");
    if (l.contains("grad_accumulate_ms"))
      lp.grad_accumulate_ms = jf::number(l["grad_accumulate_ms"], path + ".grad_accumulate_ms");
    if (l.contains("optimizer_ms")) lp.optimizer_ms = jf::number(l["optimizer_ms"], path + ".optimizer_ms");
    if (l.contains("timings")) {
      const jf::Json& timings = jf::array(l["timings"], path + ".timings");
      for (size_t k = 0; k < timings.size(); ++k) {
        const std::string tpath = fmt::format("{}.timings[{}]", path, k);
        jf::check_object(timings[k], tpath, {"batch", "forward_ms", "backward_ms"});
        BatchTiming t;
        t.batch = jf::integer(timings[k]["batch"], tpath + ".batch", 1);
        t.forward_ms = jf::number(timings[k]["forward_ms"], tpath + ".forward_ms");
        t.backward_ms = jf::number(timings[k]["backward_ms"], tpath + ".backward_ms");
        if (t.batch == p.batch) fail("{}.batch: got {}, the profile's own batch; expected another size", tpath, t.batch);
        for (const BatchTiming& other : lp.timings)
          if (other.batch == t.batch) fail("{}.batch: got {} twice, expected each size once", tpath, t.batch);
        lp.timings.push_back(t);
      }
    }
    p.layers.push_back(std::move(lp));
  }
  return p;
}

std::string profile_to_json(const ModelProfile& p) {
  nlohmann::ordered_json j;
  j["batch"] = p.batch;
  if (!p.model.empty()) j["model"] = p.model;
  j["layers"] = nlohmann::ordered_json::array();
  for (const LayerProfile& l : p.layers) {
    nlohmann::ordered_json e;
    e["name"] = l.name;
    e["forward_ms"] = l.forward_ms;
    e["backward_ms"] = l.backward_ms;
    e["activation_bytes"] = l.activation_bytes;
    e["param_bytes"] = l.param_bytes;
    if (l.saved_bytes >= 0) e["saved_bytes"] = l.saved_bytes;
    if (l.grad_accumulate_ms > 0) e["grad_accumulate_ms"] = l.grad_accumulate_ms;
    if (l.optimizer_ms > 0) e["optimizer_ms"] = l.optimizer_ms;
    if (!l.timings.empty()) {
      e["timings"] = nlohmann::ordered_json::array();
      for (const BatchTiming& t : l.timings)
        e["timings"].push_back({{"batch", t.batch}, {"forward_ms", t.forward_ms}, {"backward_ms", t.backward_ms}});
    }
    j["layers"].push_back(std::move(e));
  }
  return j.dump(2) + "\n";
}

ModelProfile load_profile(const std::string& path) {
  return profile_from_json(jf::read_file(path, "profile"), "profile " + path);
}

void save_profile(const ModelProfile& profile, const std::string& path) {
  jf::write_file(path, profile_to_json(profile), "profile");
}

}  // namespace chorus::distributed::pipeline::planner
