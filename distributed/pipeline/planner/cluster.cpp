// Cluster: validation and JSON (see cluster.h).
#include "distributed/pipeline/planner/cluster.h"

#include <utility>

#include "distributed/pipeline/json_fields.h"

namespace chorus::distributed::pipeline::planner {

namespace jf = json_fields;

void Cluster::validate() const {
  if (nodes < 1) fail("cluster: got nodes = {}, expected at least 1", nodes);
  if (devices_per_node < 1) fail("cluster: got devices_per_node = {}, expected at least 1", devices_per_node);
  if (!(intra_node_bytes_per_s > 0))
    fail("cluster: got intra_node_bytes_per_s = {}, expected a bandwidth > 0 bytes/s", intra_node_bytes_per_s);
  if (!(inter_node_bytes_per_s > 0))
    fail("cluster: got inter_node_bytes_per_s = {}, expected a bandwidth > 0 bytes/s", inter_node_bytes_per_s);
  if (memory_bytes_per_device <= 0)
    fail("cluster: got memory_bytes_per_device = {}, expected > 0", memory_bytes_per_device);
  if (intra_node_latency_us < 0 || inter_node_latency_us < 0)
    fail("cluster: got latencies {} / {} us (intra / inter node), expected >= 0", intra_node_latency_us,
         inter_node_latency_us);
}

double Cluster::allreduce_bytes_per_s(bool inter_node) const {
  const double own = inter_node ? inter_node_allreduce_bytes_per_s : intra_node_allreduce_bytes_per_s;
  return own > 0 ? own : (inter_node ? inter_node_bytes_per_s : intra_node_bytes_per_s);
}

double Cluster::allreduce_latency_us(bool inter_node) const {
  const double own = inter_node ? inter_node_allreduce_latency_us : intra_node_allreduce_latency_us;
  return own >= 0 ? own : (inter_node ? inter_node_latency_us : intra_node_latency_us);
}

Cluster cluster_from_json(const std::string& text, const std::string& source) {
  const jf::Json j = jf::parse(text, source);
  jf::check_object(j, source,
                   {"nodes", "devices_per_node", "intra_node_bytes_per_s", "inter_node_bytes_per_s",
                    "memory_bytes_per_device"},
                   {"intra_node_latency_us", "inter_node_latency_us", "intra_node_allreduce_bytes_per_s",
                    "inter_node_allreduce_bytes_per_s", "intra_node_allreduce_latency_us",
                    "inter_node_allreduce_latency_us", "communication_overlaps_compute"});
  Cluster c;
  c.nodes = static_cast<int>(jf::integer(j["nodes"], source + ".nodes", 1, 1 << 20));
  c.devices_per_node = static_cast<int>(jf::integer(j["devices_per_node"], source + ".devices_per_node", 1, 1 << 20));
  c.intra_node_bytes_per_s = jf::number(j["intra_node_bytes_per_s"], source + ".intra_node_bytes_per_s");
  c.inter_node_bytes_per_s = jf::number(j["inter_node_bytes_per_s"], source + ".inter_node_bytes_per_s");
  c.memory_bytes_per_device = jf::integer(j["memory_bytes_per_device"], source + ".memory_bytes_per_device", 1);
  if (j.contains("intra_node_latency_us"))
    c.intra_node_latency_us = jf::number(j["intra_node_latency_us"], source + ".intra_node_latency_us");
  if (j.contains("inter_node_latency_us"))
    c.inter_node_latency_us = jf::number(j["inter_node_latency_us"], source + ".inter_node_latency_us");
  for (const auto& [key, field] : {std::pair{"intra_node_allreduce_bytes_per_s", &c.intra_node_allreduce_bytes_per_s},
                                   std::pair{"inter_node_allreduce_bytes_per_s", &c.inter_node_allreduce_bytes_per_s}})
    if (j.contains(key)) {
      *field = jf::number(j[key], source + "." + key);
      if (!(*field > 0)) fail("{}.{}: got {}, expected a bandwidth > 0 bytes/s", source, key, *field);
    }
  for (const auto& [key, field] : {std::pair{"intra_node_allreduce_latency_us", &c.intra_node_allreduce_latency_us},
                                   std::pair{"inter_node_allreduce_latency_us", &c.inter_node_allreduce_latency_us}})
    if (j.contains(key)) *field = jf::number(j[key], source + "." + key);
  if (j.contains("communication_overlaps_compute")) {
    if (!j["communication_overlaps_compute"].is_boolean())
      fail("{}.communication_overlaps_compute: got {}, expected true or false", source,
           j["communication_overlaps_compute"].dump());
    c.communication_overlaps_compute = j["communication_overlaps_compute"].get<bool>();
  }
  c.validate();
  return c;
}

std::string cluster_to_json(const Cluster& c) {
  nlohmann::ordered_json j;
  j["nodes"] = c.nodes;
  j["devices_per_node"] = c.devices_per_node;
  j["intra_node_bytes_per_s"] = c.intra_node_bytes_per_s;
  j["inter_node_bytes_per_s"] = c.inter_node_bytes_per_s;
  j["memory_bytes_per_device"] = c.memory_bytes_per_device;
  j["intra_node_latency_us"] = c.intra_node_latency_us;
  j["inter_node_latency_us"] = c.inter_node_latency_us;
  if (c.intra_node_allreduce_bytes_per_s > 0) j["intra_node_allreduce_bytes_per_s"] = c.intra_node_allreduce_bytes_per_s;
  if (c.inter_node_allreduce_bytes_per_s > 0) j["inter_node_allreduce_bytes_per_s"] = c.inter_node_allreduce_bytes_per_s;
  if (c.intra_node_allreduce_latency_us >= 0) j["intra_node_allreduce_latency_us"] = c.intra_node_allreduce_latency_us;
  if (c.inter_node_allreduce_latency_us >= 0) j["inter_node_allreduce_latency_us"] = c.inter_node_allreduce_latency_us;
  if (!c.communication_overlaps_compute) j["communication_overlaps_compute"] = false;
  return j.dump(2) + "\n";
}

Cluster load_cluster(const std::string& path) {
  return cluster_from_json(jf::read_file(path, "cluster"), "cluster " + path);
}

}  // namespace chorus::distributed::pipeline::planner
