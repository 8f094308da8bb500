// What the sharded checkpoint folders share (a pipeline's stage files, FSDP's rank files): each
// writer saves its file, one allreduce makes a failure end the call on every rank, rank 0 writes
// the JSON index naming the files atomically, then each writer removes its older files. Re-saving
// the step the index already names writes the other "generation" of file names ("" or "b"), so a
// crash midway leaves the complete previous set named.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "distributed/process_group.h"

namespace chorus::distributed {

// The JSON object at `path` (an index), with every key of `required`. `kind` and `what` name it in
// errors ("pipeline checkpoint", "manifest"); `folder` is the folder it should be in.
nlohmann::json read_checkpoint_index(const std::string& path, const std::string& folder, const std::string& kind,
                                     const std::string& what, const std::vector<std::string>& required);

// One allreduce of failures over `group`: this rank's `error` (empty: none) is raised here, and a
// failure on any other rank too, naming how many failed. `who` and `what` prefix the message.
void agree_on_failure(ProcessGroup& group, const std::string& error, const std::string& who, const std::string& what);

// The generation to write on every rank: "b" when rank 0 says `reuse_names` (it found the index
// naming this step's first-generation files), else "" (one allreduce).
std::string agree_generation(ProcessGroup& group, bool reuse_names);

// Removes the files of `dir` whose names start with `prefix` and end with `suffix`, except `keep`
// (errors ignored: a leftover file is harmless, the index names the current ones).
void remove_superseded(const std::string& dir, const std::string& prefix, const std::string& suffix,
                       const std::string& keep);

}  // namespace chorus::distributed
