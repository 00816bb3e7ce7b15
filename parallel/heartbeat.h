// Heartbeat: tells a dead or unreachable peer from a slow one (issue 34). Every rank runs a thread
// that sends a small UDP datagram to every other rank every timeout_s / 6 seconds and notes when
// it last heard from each. A peer unheard for timeout_s seconds is lost: lost(PeerLost) runs once,
// on the heartbeat thread (train/loop.cpp: log and end the job). A rank busy in a long step, a
// checkpoint write or a collective waiting for a slow peer keeps answering, because the thread
// needs no MPI call and no progress of the training collectives: only that the process is
// scheduled and the network carries its datagrams.
//
// Why UDP and not an MPI communicator: trex initializes MPI_THREAD_SERIALIZED (one thread in MPI
// at a time), and OpenMPI advances its traffic only inside MPI calls of the thread that makes
// them; a heartbeat over MPI would need MPI_THREAD_MULTIPLE (a lock on every MPI call of the
// training) and would share the connections and progress engine whose failure it should detect.
//
// Addresses: each rank binds one UDP socket to an ephemeral port on every interface and publishes
// its IPv4 addresses (all interfaces that are up, loopback included), port and host name to the
// others through one all-gather on the communicator at construction (a collective). A peer on the
// same host in the same network namespace gets its datagrams over loopback only; any other peer
// at every address it published; those that land elsewhere are ignored (each carries a per-job key
// and the destination rank), so an address a peer cannot reach costs nothing. A rank that ends
// normally says goodbye (three datagrams) and is no longer watched. When the heartbeat thread
// itself has not run for half the timeout (the whole process stopped and continued, a suspended
// job, a paused VM), every peer's timeout starts over rather than all of them being reported.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "parallel/comm.h"

namespace trex::parallel {

struct PeerLost {
  int rank = -1;              // the peer's rank in the communicator
  std::string host;           // its host name (gethostname)
  std::string addresses;      // its IPv4 addresses, comma-separated
  double silent_s = 0;        // seconds since its last datagram (or since the start)
  bool never_heard = false;   // not one datagram arrived since the start (a firewall? UDP blocked?)
};

class Heartbeat {
 public:
  // Collective over `comm` (all ranks construct it at the same point). timeout_s > 0.
  Heartbeat(Communicator& comm, double timeout_s, std::function<void(const PeerLost&)> lost);
  // Says goodbye to the peers and stops the thread (within milliseconds).
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  double interval_s() const { return interval_s_; }
  // The peers' host names and addresses, by rank (for messages and tests).
  const std::string& host_of(int rank) const { return peers_[rank].host; }
  // Datagrams received from peers so far (tests).
  int64_t received() const { return received_.load(); }

 private:
  struct Peer {
    std::string host, addr_text;
    std::vector<uint32_t> addrs;  // network byte order
    uint16_t port = 0;            // network byte order
  };
  void run();
  void send_all(uint8_t kind);

  int rank_ = 0, size_ = 1;
  double timeout_s_ = 30, interval_s_ = 5;
  uint64_t key_ = 0;
  std::vector<Peer> peers_;
  std::function<void(const PeerLost&)> lost_;
  int fd_ = -1, wake_fd_ = -1;
  std::atomic<int64_t> received_{0};
  std::atomic<bool> stop_{false};
  std::thread th_;
};

}  // namespace trex::parallel
