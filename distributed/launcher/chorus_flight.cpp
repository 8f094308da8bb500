// chorus_flight: prints flight-recorder dumps (distributed/flight_recorder.h) side by side, a row per
// collective and a column per rank, marking the collectives the ranks disagree on or did not all
// enter.
//
//   chorus_flight /tmp/chorus_flight_rank_*.json
//
// A file that is not a dump is refused with a message naming it and what was expected (exit 2).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "distributed/flight_recorder.h"
#include "tensor/error.h"

int main(int argc, char** argv) {
  CLI::App app{"chorus_flight: print flight-recorder dumps (one per rank) as a table"};
  std::vector<std::string> files;
  app.add_option("dumps", files, "the ranks' dump files ($CHORUS_FLIGHT_RECORDER_FILE<rank>.json)")->required();
  CLI11_PARSE(app, argc, argv);
  try {
    std::vector<chorus::distributed::FlightDump> dumps;
    for (const std::string& path : files) {
      std::ifstream in(path);
      if (!in) chorus::fail("chorus_flight: cannot read '{}': no such file, or not readable", path);
      std::stringstream text;
      text << in.rdbuf();
      dumps.push_back(chorus::distributed::parse_flight_dump(text.str(), path));
    }
    std::fputs(chorus::distributed::flight_table(dumps).c_str(), stdout);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  return 0;
}
