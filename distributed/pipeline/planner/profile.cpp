// JSON for ModelProfile (see profile.h).
#include "distributed/pipeline/planner/profile.h"

#include "distributed/pipeline/planner/json_fields.h"

namespace chorus::distributed::pipeline::planner {

namespace jf = json_fields;

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
                     {"saved_bytes"});
    LayerProfile lp;
    lp.name = jf::string(l["name"], path + ".name");
    lp.forward_ms = jf::number(l["forward_ms"], path + ".forward_ms");
    lp.backward_ms = jf::number(l["backward_ms"], path + ".backward_ms");
    lp.activation_bytes = jf::integer(l["activation_bytes"], path + ".activation_bytes");
    lp.param_bytes = jf::integer(l["param_bytes"], path + ".param_bytes");
    if (l.contains("saved_bytes")) lp.saved_bytes = jf::integer(l["saved_bytes"], path + ".saved_bytes");
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
