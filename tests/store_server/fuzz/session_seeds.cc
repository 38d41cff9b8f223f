// Writes session_fuzz's seed corpus (tests/store_server/fuzz/session_corpus/) with
// the codec, so the seeds follow the protocol when it changes:
//
//   scripts/fuzz --target session_fuzz --regenerate-seeds
//
// Each seed is a client conversation (see session_input.h for the format) that
// reaches a part of the session the fuzzer would take long to find by itself.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/store/protocol.h"
#include "session_input.h"

namespace {

using namespace ddp;
using protocol::Op;
using protocol::Request;

std::string frame(const Request& request) {
  std::string out;
  protocol::encode_request(out, request);
  return out;
}

// Fixed, so that the seeds are the same on every regeneration.
const std::string kClientNonce(protocol::kNonceSize, 'n');
const std::string kClientId(protocol::kClientIdSize, 'c');

std::string hello() {
  Request r;
  r.op = Op::kHello;
  r.nonce = kClientNonce;
  r.client_id = kClientId;
  return frame(r);
}

std::string set(std::string_view key, std::string_view value, Op op = Op::kSet) {
  Request r;
  r.op = op;
  r.key = key;
  r.value = value;
  return frame(r);
}

std::string get(std::string_view key, std::uint64_t timeout_ms = protocol::kNoTimeout) {
  Request r;
  r.op = Op::kGet;
  r.key = key;
  r.timeout_ms = timeout_ms;
  return frame(r);
}

std::string with_keys(Op op, std::vector<std::string_view> keys,
                      std::uint64_t timeout_ms = protocol::kNoTimeout) {
  Request r;
  r.op = op;
  r.keys = std::move(keys);
  r.timeout_ms = timeout_ms;
  return frame(r);
}

// A whole input: the mode byte, then the chunks (the first read, the second, ...).
std::string input(std::uint8_t mode, const std::vector<std::string>& chunks) {
  std::string out(1, static_cast<char>(mode));
  for (const auto& chunk : chunks) {
    if (chunk.size() > fuzz::kMaxChunk) {
      std::fprintf(stderr, "session_seeds: a chunk of %zu bytes is over the format's %zu\n",
                   chunk.size(), fuzz::kMaxChunk);
      std::exit(1);
    }
    fuzz::append_chunk(out, chunk);
  }
  return out;
}

void write(const std::string& dir, const std::string& name, const std::string& bytes) {
  std::string path = dir + "/" + name;
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!file) {
    std::fprintf(stderr, "session_seeds: cannot write %s\n", path.c_str());
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: session_seeds <corpus directory>\n");
    return 2;
  }
  const std::string dir = argv[1];

  // A valid conversation, all in one read, and then one frame per read.
  write(dir, "hello-set-get", input(0, {hello() + set("k", "v") + get("k")}));
  write(dir, "hello-set-get-split", input(0, {hello(), set("k", "v"), get("k")}));
  // The hello cut into reads of one byte (the parser's partial header and payload).
  {
    std::vector<std::string> chunks;
    for (char c : hello()) chunks.emplace_back(1, c);
    chunks.push_back(set("k", "v") + get("k"));
    write(dir, "hello-bytewise", input(0, chunks));
  }

  // Issue 9's use-after-free: a first read exactly as large as the read buffer
  // (4 KiB) starting with a length prefix over the limit, then more bytes, which
  // landed in the freed buffer. With and without a token.
  {
    std::string first(4096, '\0');
    first.replace(0, 4, "\xff\xff\xff\xff");
    std::string second(512, 'x');
    write(dir, "uaf-4096-ffffffff", input(0, {first, second}));
    write(dir, "uaf-4096-ffffffff-token", input(fuzz::kModeToken, {first, second}));
    // The same after the handshake (a bad frame in a full read of a grown buffer).
    std::string grown(16384, '\0');
    grown.replace(0, 4, "\xff\xff\xff\xff");
    write(dir, "bad-frame-after-hello-16k",
          input(0, {hello(), std::string(4096, '\0'), grown, second}));
  }

  // A first read larger than the buffer: the hello and a 5 KiB value.
  write(dir, "large-first-read",
        input(0, {hello() + set("big", std::string(5000, 'b')) + get("big")}));

  // Pipelined gets of a large value: replies pile up (read or not by the client).
  {
    std::string gets;
    for (int i = 0; i < 64; ++i) gets += get("big");
    std::string conversation[] = {hello(), set("big", std::string(64 * 1024 - 32, 'v')), gets};
    std::vector<std::string> chunks(std::begin(conversation), std::end(conversation));
    write(dir, "pipelined-gets", input(0, chunks));
    write(dir, "pipelined-gets-no-read", input(fuzz::kModeNoRead, chunks));
    std::string multi = with_keys(Op::kMultiGet, {"big", "big", "big", "big", "big", "big"}, 0);
    write(dir, "multi-get-repeated-key",
          input(fuzz::kModeNoRead, {hello(), chunks[1], multi + multi}));
  }

  // A parked get (1 ms timeout), more frames while it is parked (the backlog),
  // the timeout (an empty chunk lets 2 ms pass), then more requests.
  write(dir, "parked-get-then-frames",
        input(0, {hello(), get("later", 1), set("a", "1") + get("a"), set("later", "now"), "",
                  with_keys(Op::kCheck, {"a", "later"}) + get("later")}));
  // A parked wait that the client abandons (EOF while parked), and gets with
  // short timeouts.
  write(dir, "parked-wait-eof", input(0, {hello(), with_keys(Op::kWait, {"never"})}));
  write(dir, "parked-get-timeout",
        input(0, {hello(), get("never", 0), "", get("never", 1), "",
                  with_keys(Op::kMultiGet, {"never", "x"}, 1), ""}));

  // Every other operation once.
  {
    Request add;
    add.op = Op::kAdd;
    add.key = "n";
    add.delta = 5;
    add.request_id = 1;
    Request cas;
    cas.op = Op::kCompareSet;
    cas.key = "k";
    cas.value = "v";
    cas.desired = "w";
    cas.request_id = 3;
    Request multi_set;
    multi_set.op = Op::kMultiSet;
    multi_set.keys = {"x", "y"};
    multi_set.values = {"1", "2"};
    Request num_keys;
    num_keys.op = Op::kNumKeys;
    Request del;
    del.op = Op::kDeleteKey;
    del.key = "x";
    del.request_id = 4;
    write(dir, "all-ops",
          // The second add repeats the first one's request id: a retry, answered from the record.
          input(0, {hello(),
                    set("k", "v") + frame(add) + frame(add) + frame(cas) + frame(multi_set) +
                        set("k", "tail", Op::kAppend) + frame(num_keys) + frame(del) +
                        with_keys(Op::kMultiGet, {"k", "y"}) + with_keys(Op::kCheck, {"k", "x"})}));
  }

  // Handshake errors: a second hello, an operation before the hello, a token
  // server given a wrong MAC and an operation before auth, tiny limits.
  write(dir, "second-hello", input(0, {hello() + hello()}));
  write(dir, "op-before-hello", input(0, {get("k")}));
  {
    Request auth;
    auth.op = Op::kAuth;
    std::string mac(protocol::kMacSize, 'm');
    auth.mac = mac;
    write(dir, "token-wrong-mac", input(fuzz::kModeToken, {hello(), frame(auth)}));
    write(dir, "token-op-before-auth", input(fuzz::kModeToken, {hello(), set("k", "v")}));
    // The harness authenticates after the hello: the rest runs authenticated.
    write(dir, "token-authenticated",
          input(fuzz::kModeToken | fuzz::kModeAuthenticate,
                {hello(), set("k", "v") + get("k"), get("later"), set("later", "x")}));
  }
  write(dir, "tiny-limits-value-too-large",
        input(fuzz::kModeTinyLimits, {hello(), set("k", std::string(300, 'v'))}));
  return 0;
}
