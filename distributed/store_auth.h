// The TCP store's job-token handshake, without sockets: store.cpp's server runs a ServerHandshake
// on each new connection before it reads any request from it, and its client runs
// client_handshake() right after connecting. Only the job's processes get in (issue 35).
//
// [Job token handshake] Frames as every request and reply (store_protocol.h); K is the job token,
// Nc and Ns 32 bytes from getrandom, made anew for every connection:
//   client -> server  kHello [Nc]                   Nc empty when the client has no token
//   server -> client  [0]                           the server has no token: an open store
//                     [1][Ns]                       a challenge
//                     [2], then closes              the server has a token, the client none
//   client -> server  kAuth [HMAC-SHA256(K, "chorus-store client v1" || Ns || Nc)]
//   server -> client  [1][HMAC-SHA256(K, "chorus-store server v1" || Nc || Ns)]   accepted
//                     [0], then closes              a wrong proof
// Why this shape:
// - The server's fresh Ns makes every proof good for one connection only: a proof seen on the wire
//   cannot be replayed. The token itself never crosses the wire.
// - Mutual: the server proves it holds K too, after the client did (so a client with a wrong
//   token is refused, and logged, by the server rather than giving up silently on its own). A
//   process listening on MASTER_PORT in the job's place cannot pass as its store. The two proofs
//   carry different labels, so one cannot be turned into the other.
// - Every client says hello, with a token or without: a server with a token then tells a client
//   without one that it was refused ([2]) instead of closing on its first request, and a server
//   without a token tells a client with one ([0]), which then stops instead of waiting for a
//   challenge that never comes. A server without a token still answers requests sent without a
//   hello (raw clients, the fuzz target), exactly as before the handshake existed.
// - Before the proof the server reads nothing but these two frames, each at most
//   kHandshakeFrameBytes: an unauthenticated client cannot make it buffer a large frame, nor reach
//   the table.
// The proofs authenticate the connection; nothing is encrypted (docs/reliability.md, "Job token").
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "distributed/store.h"

namespace chorus::distributed::store_auth {

inline constexpr size_t kNonceBytes = 32;
inline constexpr uint32_t kHandshakeFrameBytes = 256;
inline constexpr const char* kClientLabel = "chorus-store client v1";
inline constexpr const char* kServerLabel = "chorus-store server v1";

// The two proofs (HMAC-SHA256, 32 bytes each).
Bytes client_proof(const std::string& token, const Bytes& server_nonce, const Bytes& client_nonce);
Bytes server_proof(const std::string& token, const Bytes& client_nonce, const Bytes& server_nonce);

// One connection's handshake, server side (the server has a token).
class ServerHandshake {
 public:
  enum class State { kWaiting, kAccepted, kRefused };

  // `new_nonce` makes Ns (random_bytes; a test may pass its own).
  explicit ServerHandshake(std::string token, std::function<Bytes()> new_nonce = {});

  // Answers the handshake frames at the front of `buffer` (what the client has sent so far),
  // removing them and appending reply frames to `replies`. kAccepted: the client proved it holds the
  // token, and what is left in `buffer` are its first requests. kRefused: `why` says why, for the
  // server's log; the server sends `replies`, then closes. An incomplete frame waits (kWaiting).
  State feed(Bytes& buffer, std::vector<Bytes>& replies, std::string& why);

 private:
  std::string token_;
  std::function<Bytes()> new_nonce_;
  Bytes client_nonce_, server_nonce_;
  bool challenged_ = false;
  State state_ = State::kWaiting;
};

// The client side: `exchange` sends one request and returns its reply body. `token` may be empty
// (the client then only learns whether the store lets it in). chorus::Error naming `where`
// ("host:port") when the store refuses this process, wants a token this process lacks, has none
// while this process has one, or cannot prove it holds the token.
void client_handshake(const std::string& token, const std::string& where,
                      const std::function<Bytes(uint8_t command, const std::vector<Bytes>& args)>& exchange);

}  // namespace chorus::distributed::store_auth
