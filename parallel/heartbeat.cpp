#include "parallel/heartbeat.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <tuple>
#include <utility>

namespace trex::parallel {

namespace {

constexpr uint32_t kMagic = 0x54524842;  // "TRHB"
constexpr uint8_t kPing = 1, kBye = 2;
constexpr int kMaxAddrs = 16;

// What each rank publishes at start (one all-gather of these, fixed size).
struct Record {
  uint64_t key;  // rank 0's is the job's
  int32_t rank;
  uint16_t port;  // network byte order
  uint8_t naddr;
  uint8_t pad;
  uint32_t addrs[kMaxAddrs];  // network byte order
  char host[128];
  uint64_t netns_dev, netns_ino;  // the network namespace (/proc/self/ns/net), 0 if unknown
};

// One datagram.
struct Datagram {
  uint32_t magic;
  uint8_t kind;
  uint8_t pad[3];
  uint64_t key;
  int32_t src, dst;
  uint64_t seq;
};

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// The IPv4 addresses of the interfaces that are up: others first, loopback last.
std::vector<uint32_t> local_addresses() {
  std::vector<uint32_t> out, lo;
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) == 0) {
    for (ifaddrs* i = ifs; i; i = i->ifa_next) {
      if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
      const uint32_t a = reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr;
      auto& v = (i->ifa_flags & IFF_LOOPBACK) ? lo : out;
      if (std::find(v.begin(), v.end(), a) == v.end()) v.push_back(a);
    }
    freeifaddrs(ifs);
  }
  if (lo.empty()) lo.push_back(htonl(INADDR_LOOPBACK));
  out.insert(out.end(), lo.begin(), lo.end());
  if (out.size() > (size_t)kMaxAddrs) out.erase(out.begin() + kMaxAddrs - 1, out.end() - 1);  // keep loopback
  return out;
}

// The identity of this process's network namespace ({0, 0} if it cannot be read).
std::pair<uint64_t, uint64_t> net_namespace() {
  struct stat st{};
  if (::stat("/proc/self/ns/net", &st) != 0) return {0, 0};
  return {(uint64_t)st.st_dev, (uint64_t)st.st_ino};
}

std::string addr_text(uint32_t a) {
  char b[INET_ADDRSTRLEN] = {};
  in_addr ia{};
  ia.s_addr = a;
  inet_ntop(AF_INET, &ia, b, sizeof b);
  return b;
}

}  // namespace

Heartbeat::Heartbeat(Communicator& comm, double timeout_s, std::function<void(const PeerLost&)> lost)
    : rank_(comm.rank()), size_(comm.size()), timeout_s_(timeout_s), lost_(std::move(lost)) {
  TREX_CHECK(timeout_s > 0, "Heartbeat: timeout_s must be > 0");
  interval_s_ = std::max(0.01, timeout_s / 6);
  fd_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  TREX_CHECK(fd_ >= 0, "Heartbeat: socket(): ", std::strerror(errno));
  sockaddr_in any{};
  any.sin_family = AF_INET;
  any.sin_addr.s_addr = htonl(INADDR_ANY);
  any.sin_port = 0;
  TREX_CHECK(::bind(fd_, reinterpret_cast<sockaddr*>(&any), sizeof any) == 0, "Heartbeat: bind(): ",
             std::strerror(errno));
  socklen_t len = sizeof any;
  TREX_CHECK(::getsockname(fd_, reinterpret_cast<sockaddr*>(&any), &len) == 0, "Heartbeat: getsockname(): ",
             std::strerror(errno));
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  TREX_CHECK(wake_fd_ >= 0, "Heartbeat: eventfd(): ", std::strerror(errno));

  Record me{};
  me.key = std::random_device{}() * 0x9E3779B97F4A7C15ull ^ (uint64_t)::getpid() << 20 ^ (uint64_t)now_s();
  me.rank = rank_;
  me.port = any.sin_port;
  const std::vector<uint32_t> mine = local_addresses();
  me.naddr = (uint8_t)mine.size();
  std::copy(mine.begin(), mine.end(), me.addrs);
  ::gethostname(me.host, sizeof me.host - 1);
  std::tie(me.netns_dev, me.netns_ino) = net_namespace();
  std::vector<Record> all(size_);
  comm.all_gather(&me, all.data(), sizeof(Record), DType::U8);
  key_ = all[0].key;
  peers_.resize(size_);
  for (int r = 0; r < size_; ++r) {
    Peer& p = peers_[r];
    const Record& rec = all[r];
    p.host.assign(rec.host, strnlen(rec.host, sizeof rec.host));
    p.port = rec.port;
    for (int i = 0; i < std::min<int>(rec.naddr, kMaxAddrs); ++i) {
      if (i) p.addr_text += ',';
      p.addr_text += addr_text(rec.addrs[i]);
    }
    // A peer in this process's own network namespace on this host is reached over loopback only
    // (no datagram goes to an interface address); any other peer at every address it published.
    const bool same_net = rec.netns_ino != 0 && rec.netns_ino == me.netns_ino && rec.netns_dev == me.netns_dev &&
                          std::strncmp(rec.host, me.host, sizeof rec.host) == 0;
    if (same_net) p.addrs.push_back(htonl(INADDR_LOOPBACK));
    else p.addrs.assign(rec.addrs, rec.addrs + std::min<int>(rec.naddr, kMaxAddrs));
  }
  th_ = std::thread([this] { run(); });
}

Heartbeat::~Heartbeat() {
  stop_.store(true);
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t w = ::write(wake_fd_, &one, sizeof one);
  if (th_.joinable()) th_.join();
  for (int i = 0; i < 3; ++i) send_all(kBye);  // the peers stop watching this rank
  ::close(wake_fd_);
  ::close(fd_);
}

void Heartbeat::send_all(uint8_t kind) {
  static_assert(sizeof(Datagram) == 32);
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    Datagram d{};
    d.magic = kMagic, d.kind = kind, d.key = key_, d.src = rank_, d.dst = r;
    for (uint32_t a : peers_[r].addrs) {
      sockaddr_in to{};
      to.sin_family = AF_INET;
      to.sin_addr.s_addr = a;
      to.sin_port = peers_[r].port;
      // Errors (no route, a full buffer) are what a lost peer looks like: the silence decides.
      ::sendto(fd_, &d, sizeof d, MSG_DONTWAIT | MSG_NOSIGNAL, reinterpret_cast<sockaddr*>(&to), sizeof to);
    }
  }
}

void Heartbeat::run() {
  const double start = now_s();
  std::vector<double> last(size_, start);
  std::vector<char> heard(size_, 0), gone(size_, 0);
  gone[rank_] = 1;
  double next_send = start;
  const double tick = std::clamp(timeout_s_ / 20, 0.01, 0.5);
  double prev = start;
  while (!stop_.load()) {
    double now = now_s();
    // This thread itself did not run for a while (the process was stopped and continued, a job
    // suspended by its scheduler, a paused VM): the silence it sees is its own, so every peer
    // gets a fresh timeout instead of being reported.
    if (now - prev > std::max(timeout_s_ / 2, 4 * tick))
      std::fill(last.begin(), last.end(), now);
    prev = now;
    if (now >= next_send) {
      send_all(kPing);
      next_send = now + interval_s_;
    }
    for (int r = 0; r < size_; ++r) {
      if (gone[r] || now - last[r] < timeout_s_) continue;
      PeerLost info;
      info.rank = r, info.host = peers_[r].host, info.addresses = peers_[r].addr_text;
      info.silent_s = now - last[r], info.never_heard = !heard[r];
      lost_(info);
      return;
    }
    pollfd pf[2] = {{fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    const int ms = (int)std::ceil(1000 * std::clamp(std::min(next_send - now, tick), 0.0, 1.0));
    if (::poll(pf, 2, ms) < 0 && errno != EINTR) break;
    now = now_s();
    Datagram d{};
    ssize_t n;
    while ((n = ::recv(fd_, &d, sizeof d, MSG_DONTWAIT)) >= 0) {
      if (n != (ssize_t)sizeof d || d.magic != kMagic || d.key != key_ || d.dst != rank_ || d.src < 0 ||
          d.src >= size_ || d.src == rank_)
        continue;
      last[d.src] = now, heard[d.src] = 1;
      received_.fetch_add(1);
      if (d.kind == kBye) gone[d.src] = 1;
    }
  }
}

}  // namespace trex::parallel
