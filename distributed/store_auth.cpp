#include "distributed/store_auth.h"

#include "distributed/job_token.h"
#include "distributed/sha256.h"
#include "distributed/store_protocol.h"
#include "tensor/error.h"

namespace chorus::distributed::store_auth {
namespace {

using namespace store_protocol;

Bytes proof(const std::string& token, const char* label, const Bytes& first, const Bytes& second) {
  std::string message = label;
  message.append(first.begin(), first.end());
  message.append(second.begin(), second.end());
  const Sha256Digest d = hmac_sha256(token, message);
  return Bytes(d.begin(), d.end());
}

Bytes reply_frame(const Bytes& body) {
  Bytes frame;
  put_u32(frame, static_cast<uint32_t>(body.size()));
  frame.insert(frame.end(), body.begin(), body.end());
  return frame;
}

Bytes with_status(uint8_t status, const Bytes& rest = {}) {
  Bytes body{status};
  body.insert(body.end(), rest.begin(), rest.end());
  return body;
}

const char* kWhereToSetIt = "CHORUS_JOB_TOKEN / --job-token-file";

}  // namespace

Bytes client_proof(const std::string& token, const Bytes& server_nonce, const Bytes& client_nonce) {
  return proof(token, kClientLabel, server_nonce, client_nonce);
}

Bytes server_proof(const std::string& token, const Bytes& client_nonce, const Bytes& server_nonce) {
  return proof(token, kServerLabel, client_nonce, server_nonce);
}

ServerHandshake::ServerHandshake(std::string token, std::function<Bytes()> new_nonce)
    : token_(std::move(token)), new_nonce_(std::move(new_nonce)) {
  if (!new_nonce_) new_nonce_ = [] { return random_bytes(kNonceBytes); };
}

ServerHandshake::State ServerHandshake::feed(Bytes& buffer, std::vector<Bytes>& replies, std::string& why) {
  auto refuse = [&](std::string reason) {
    why = std::move(reason);
    state_ = State::kRefused;
    return state_;
  };
  while (state_ == State::kWaiting && buffer.size() >= 4) {
    const uint32_t len = get_u32(buffer.data());
    if (len > kHandshakeFrameBytes) {
      return refuse(fmt::format("it sent a frame of {} bytes before the job-token handshake (at most {} are read from "
                                "a client not yet authenticated; a client without CHORUS_JOB_TOKEN, or not a chorus "
                                "store client?)",
                                len, kHandshakeFrameBytes));
    }
    if (buffer.size() - 4 < len) break;  // incomplete: wait for the rest
    const Bytes body(buffer.begin() + 4, buffer.begin() + 4 + static_cast<std::ptrdiff_t>(len));
    buffer.erase(buffer.begin(), buffer.begin() + 4 + static_cast<std::ptrdiff_t>(len));
    uint8_t command = 0;
    std::vector<Bytes> args;
    if (!decode(body, command, args)) return refuse("it sent a malformed frame before the job-token handshake");
    if (!challenged_) {
      if (command != kHello) {
        return refuse(fmt::format("it sent a request (command {}) without the job-token handshake (a client of another "
                                  "program, or an older chorus?)",
                                  static_cast<int>(command)));
      }
      if (args.size() != 1 || (!args[0].empty() && args[0].size() != kNonceBytes))
        return refuse("its hello was malformed (expected one nonce of 32 bytes, or none)");
      if (args[0].empty()) {
        replies.push_back(reply_frame(with_status(2)));
        return refuse(fmt::format("it has no job token ({})", kWhereToSetIt));
      }
      client_nonce_ = args[0];
      server_nonce_ = new_nonce_();
      challenged_ = true;
      replies.push_back(reply_frame(with_status(1, server_nonce_)));
      continue;
    }
    if (command != kAuth || args.size() != 1 || args[0].size() != 32)
      return refuse("it did not answer the job-token challenge with a proof");
    const Bytes expected = client_proof(token_, server_nonce_, client_nonce_);
    if (!equal_in_constant_time(expected.data(), args[0].data(), expected.size())) {
      replies.push_back(reply_frame(with_status(0)));
      return refuse(fmt::format("wrong job token (its proof does not match this store's token; {})", kWhereToSetIt));
    }
    replies.push_back(reply_frame(with_status(1, server_proof(token_, client_nonce_, server_nonce_))));
    state_ = State::kAccepted;
  }
  return state_;
}

void client_handshake(const std::string& token, const std::string& where,
                      const std::function<Bytes(uint8_t command, const std::vector<Bytes>& args)>& exchange) {
  const std::string refused = fmt::format(
      "the store at {} refused this process: wrong or missing job token ({}; every process of a job needs the same "
      "one)",
      where, kWhereToSetIt);
  const Bytes client_nonce = token.empty() ? Bytes() : random_bytes(kNonceBytes);
  const Bytes hello = exchange(kHello, {client_nonce});
  if (hello.empty() || hello[0] > 2) fail("the store at {} answered the job-token hello with something else", where);
  if (hello[0] == 0) {
    if (token.empty()) return;  // an open store, and a process without a token: as before
    fail("the store at {} has no job token, but this process has one ({}): start the store's host (rank 0, or node "
         "0's chorusrun) with the same token, or unset it here",
         where, kWhereToSetIt);
  }
  if (hello[0] == 2 || token.empty()) fail("{} (this process has none)", refused);
  if (hello.size() != 1 + kNonceBytes) fail("the store at {} sent a malformed job-token challenge", where);
  const Bytes server_nonce(hello.begin() + 1, hello.end());
  const Bytes answer = exchange(kAuth, {client_proof(token, server_nonce, client_nonce)});
  if (answer.size() == 1 && answer[0] == 0) fail("{}", refused);
  const Bytes expected = server_proof(token, client_nonce, server_nonce);
  if (answer.size() != 1 + expected.size() || answer[0] != 1 ||
      !equal_in_constant_time(expected.data(), answer.data() + 1, expected.size())) {
    fail("the store at {} let this process in but could not prove that it holds the job token: it is not this job's "
         "store (another program on MASTER_PORT?)",
         where);
  }
}

}  // namespace chorus::distributed::store_auth
