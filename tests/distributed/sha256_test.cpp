// SHA-256 and HMAC-SHA256 (distributed/sha256.h) against two oracles that share no code with them:
// the published vectors (FIPS 180-4's examples, RFC 4231's HMAC cases) and Python's hashlib and hmac,
// run at test time on messages and keys of every length around the block boundaries.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "distributed/sha256.h"

namespace chorus::distributed {
namespace {

std::string hex(const Sha256Digest& d) { return to_hex(d); }

std::string unhex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  return out;
}

TEST_CASE("SHA-256 of the FIPS 180-4 examples", "[distributed][sha256]") {
  CHECK(hex(sha256("")) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(hex(sha256("abc")) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(hex(sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")) ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // One million 'a', fed in uneven pieces: the incremental interface gives the one-shot answer.
  Sha256 h;
  const std::string chunk(997, 'a');
  size_t left = 1000000;
  while (left > 0) {
    const size_t n = std::min(left, chunk.size());
    h.update(std::string_view(chunk).substr(0, n));
    left -= n;
  }
  CHECK(hex(h.finish()) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("HMAC-SHA256 of RFC 4231's test cases", "[distributed][sha256]") {
  struct Case {
    std::string key, data, mac;
  };
  const std::vector<Case> cases = {
      {std::string(20, '\x0b'), "Hi There", "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
      {"Jefe", "what do ya want for nothing?", "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
      {std::string(20, '\xaa'), std::string(50, '\xdd'),
       "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
      {unhex("0102030405060708090a0b0c0d0e0f10111213141516171819"), std::string(50, '\xcd'),
       "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
      // Case 5 (a 128-bit truncation) is left out: the store uses the whole MAC.
      {std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First",
       "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
      {std::string(131, '\xaa'),
       "This is a test using a larger than block-size key and a larger than block-size data. The key needs to be "
       "hashed before being used by the HMAC algorithm.",
       "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
  };
  for (const Case& c : cases) {
    INFO(c.data);
    CHECK(hex(hmac_sha256(c.key, c.data)) == c.mac);
  }
}

TEST_CASE("SHA-256 and HMAC-SHA256 agree with Python's hashlib and hmac on every length around a block",
          "[distributed][sha256]") {
  // Keys and messages of lengths 0..200 (every padding case: 55, 56, 63, 64, 65 bytes...), keys
  // past the block size too, random bytes from a fixed seed.
  std::mt19937 rng(35);
  std::vector<std::pair<std::string, std::string>> inputs;
  for (size_t n = 0; n <= 200; ++n) {
    std::string key(n % 3 == 0 ? n : (n * 7) % 150, '\0'), message(n, '\0');
    for (char& c : key) c = static_cast<char>(rng());
    for (char& c : message) c = static_cast<char>(rng());
    inputs.emplace_back(key, message);
  }
  const std::string dir = std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp";
  const std::string in_path = dir + "/sha256_inputs.txt", out_path = dir + "/sha256_python.txt";
  {
    std::ofstream in(in_path);
    for (const auto& [key, message] : inputs) {
      in << to_hex(reinterpret_cast<const uint8_t*>(key.data()), key.size()) << " "
         << to_hex(reinterpret_cast<const uint8_t*>(message.data()), message.size()) << "\n";
    }
  }
  const std::string script =
      "import hashlib, hmac, sys\n"
      "for line in open(sys.argv[1]):\n"
      "    k, m = (bytes.fromhex(x) for x in line.rstrip('\\n').split(' '))\n"
      "    print(hashlib.sha256(m).hexdigest(), hmac.new(k, m, hashlib.sha256).hexdigest())\n";
  const std::string script_path = dir + "/sha256_oracle.py";
  std::ofstream(script_path) << script;
  const int status = std::system(("/usr/bin/python3 " + script_path + " " + in_path + " > " + out_path).c_str());
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  std::ifstream out(out_path);
  size_t checked = 0;
  for (const auto& [key, message] : inputs) {
    std::string digest, mac;
    REQUIRE(out >> digest >> mac);
    INFO("key of " << key.size() << " bytes, message of " << message.size() << " bytes");
    CHECK(hex(sha256(message)) == digest);
    CHECK(hex(hmac_sha256(key, message)) == mac);
    ++checked;
  }
  CHECK(checked == inputs.size());
}

TEST_CASE("equal_in_constant_time tells equal from unequal at every position", "[distributed][sha256]") {
  std::array<uint8_t, 32> a{}, b{};
  for (size_t i = 0; i < a.size(); ++i) a[i] = b[i] = static_cast<uint8_t>(i * 13);
  CHECK(equal_in_constant_time(a.data(), b.data(), a.size()));
  for (size_t i = 0; i < a.size(); ++i) {
    b[i] ^= 1;
    CHECK_FALSE(equal_in_constant_time(a.data(), b.data(), a.size()));
    b[i] ^= 1;
  }
}

}  // namespace
}  // namespace chorus::distributed
