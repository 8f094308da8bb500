// The cluster a plan is made for: `nodes` machines of `devices_per_node` identical devices, one
// bandwidth (and latency) between two devices of the same node and one between devices of
// different nodes, and the memory of each device. Global rank of local device l on node n:
// n * devices_per_node + l (as chorusrun numbers processes).
//
// JSON (cluster_from_json / cluster_to_json; the `plan` tool also builds one from flags):
//   {"nodes": 2, "devices_per_node": 8, "intra_node_bytes_per_s": 150e9,
//    "inter_node_bytes_per_s": 3.125e9, "memory_bytes_per_device": 32e9,
//    "intra_node_latency_us": 5, "inter_node_latency_us": 10,       // latencies optional (0)
//    // optional: the allreduce's own figures in the ring form (default: the point-to-point ones;
//    // `calibrate` measures both), and whether communication runs beside computation (false where
//    // every core is busy computing and the backend's threads take cycles from it, as CPU
//    // processes filling a machine; default true, as GPUs with a copy engine / NCCL)
//    "intra_node_allreduce_bytes_per_s": 1.7e9, "intra_node_allreduce_latency_us": 100,
//    "inter_node_allreduce_bytes_per_s": 1e9, "inter_node_allreduce_latency_us": 100,
//    "communication_overlaps_compute": true}
#pragma once

#include <cstdint>
#include <string>

namespace chorus::distributed::pipeline::planner {

struct Cluster {
  int nodes = 1;
  int devices_per_node = 1;
  double intra_node_bytes_per_s = 0;
  double inter_node_bytes_per_s = 0;
  int64_t memory_bytes_per_device = 0;
  double intra_node_latency_us = 0;  // per message
  double inter_node_latency_us = 0;
  // The allreduce's ring-form figures (0: use the point-to-point ones above).
  double intra_node_allreduce_bytes_per_s = 0;
  double inter_node_allreduce_bytes_per_s = 0;
  double intra_node_allreduce_latency_us = -1;  // < 0: use the point-to-point latency
  double inter_node_allreduce_latency_us = -1;
  bool communication_overlaps_compute = true;

  double allreduce_bytes_per_s(bool inter_node) const;
  double allreduce_latency_us(bool inter_node) const;

  int num_devices() const { return nodes * devices_per_node; }
  int node_of(int rank) const { return rank / devices_per_node; }
  // chorus::Error naming the field when a count is < 1, a bandwidth or memory is not > 0, or a
  // latency is negative.
  void validate() const;
};

Cluster cluster_from_json(const std::string& text, const std::string& source = "cluster");
std::string cluster_to_json(const Cluster& cluster);
Cluster load_cluster(const std::string& path);

}  // namespace chorus::distributed::pipeline::planner
