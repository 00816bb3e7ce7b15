# A multi-host test bed on one machine (issue 34), sourced by the tests in tests/hosts/. It builds
# network namespaces that stand for hosts, each with one interface (eth0, 10.231.0.H/24) on a
# bridge that lives in a namespace of its own (the switch), so nothing is added to the machine's
# own network: the addresses exist only inside the bed. OpenMPI starts its daemons on the other
# "hosts" through an rsh agent that runs the command with `ip netns exec`, and talks TCP only
# (btl tcp,self; OOB and BTL on 10.231.0.0/24), as across real hosts. Everything is removed when
# the test exits, also on failure or a signal (trap).
#
#   source tests/hosts/netns_bed.sh
#   bed_require            exits 77 (CTest: skipped) with the reason when not root, no `ip`,
#                          namespaces not permitted, or no mpirun
#   bed_up N               N hosts: h0 (where mpirun runs) .. hN-1; writes $BED_DIR/hostfile
#                          (one slot each) and $BED_DIR/rsh_agent
#   bed_mpirun ARGS...     scripts/trex-mpirun inside h0 over the bed (TCP only, the agent,
#                          --hostfile), ARGS as for mpirun (-np N ...)
#   bed_cut H / bed_heal H every packet to and from host H dropped / delivered again (the link
#                          stays up: a failed switch or cable beyond the host's port)
#   bed_throttle H RATE BURST / bed_unthrottle H
#                          tc tbf on both ends of host H's link: RATE (e.g. 1gbit), a short queue
#                          (a slow RATE drops most packets: a loss burst; netem may be absent)
#   bed_down               removes the bed (the trap calls it)
# Variables: ROOT (the repository root), BED_DIR (set by bed_up: a temporary directory).

bed_require() {
  [ "$(id -u)" = 0 ] || { echo "SKIP: the namespace test bed needs root (ip netns)"; exit 77; }
  command -v ip > /dev/null || { echo "SKIP: no 'ip' command (Debian: iproute2)"; exit 77; }
  command -v "${MPIEXEC:-mpirun}" > /dev/null || { echo "SKIP: no mpirun"; exit 77; }
  local probe="trexprobe$$"
  if ! ip netns add "$probe" 2> /dev/null; then
    echo "SKIP: network namespaces are not permitted here (ip netns add failed)"
    exit 77
  fi
  local why
  if ! why=$(ip netns exec "$probe" ip link set lo up 2>&1); then
    ip netns del "$probe"
    echo "SKIP: cannot run commands in a network namespace here (ip netns exec: $why)"
    exit 77
  fi
  ip netns del "$probe"
}

BED_NS=()
bed_ns() { echo "trex$$h$1"; }  # the namespace of host H
bed_sw() { echo "trex$$sw"; }

bed_down() {
  local ns
  for ns in "${BED_NS[@]}"; do
    # Processes left in a host (a daemon waiting on a cut link) go with it.
    for p in $(ip netns pids "$ns" 2> /dev/null); do kill -9 "$p" 2> /dev/null || true; done
    ip netns del "$ns" 2> /dev/null || true
  done
  BED_NS=()
  [ -n "${BED_DIR:-}" ] && rm -rf "$BED_DIR"
  BED_DIR=
}

bed_up() {
  local n=$1 h sw ns
  trap bed_down EXIT
  trap 'bed_down; exit 130' INT TERM
  BED_DIR=$(mktemp -d "${TMPDIR:-/tmp}/trex_bed.XXXXXX")
  sw=$(bed_sw)
  ip netns add "$sw" && BED_NS+=("$sw")
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" link set br0 up
  : > "$BED_DIR/hostfile"
  for ((h = 0; h < n; ++h)); do
    ns=$(bed_ns $h)
    ip netns add "$ns" && BED_NS+=("$ns")
    ip -n "$ns" link set lo up
    # The pair is made inside the host's namespace; its switch end moves to the switch.
    ip -n "$ns" link add eth0 type veth peer name "p$h"
    ip -n "$ns" link set "p$h" netns "$sw"
    ip -n "$sw" link set "p$h" master br0
    ip -n "$sw" link set "p$h" up
    ip -n "$ns" addr add "10.231.0.$((h + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    echo "10.231.0.$((h + 1)) slots=1" >> "$BED_DIR/hostfile"
  done
  # Fixed neighbour entries, as behind a router that answers for the hosts: a cut host is then
  # silent (packets go unanswered) rather than unknown (an ARP failure, reported at once).
  local a b mac
  for ((a = 0; a < n; ++a)); do
    mac=$(ip -n "$(bed_ns $a)" -o link show eth0 | sed -n 's/.*link\/ether \([0-9a-f:]*\).*/\1/p')
    for ((b = 0; b < n; ++b)); do
      ((a == b)) || ip -n "$(bed_ns $b)" neigh replace "10.231.0.$((a + 1))" lladdr "$mac" dev eth0 nud permanent
    done
  done
  # OpenMPI calls the agent as `agent HOST COMMAND...` (like ssh); the host is its address.
  cat > "$BED_DIR/rsh_agent" <<AGENT
#!/bin/sh
host=\$1
shift
exec ip netns exec "trex$$h\$((\${host##*.} - 1))" /bin/sh -c "\$*"
AGENT
  chmod +x "$BED_DIR/rsh_agent"
}

bed_mpirun() {
  ip netns exec "$(bed_ns 0)" "$ROOT/scripts/trex-mpirun" --allow-run-as-root --oversubscribe \
    --hostfile "$BED_DIR/hostfile" --mca plm_rsh_agent "$BED_DIR/rsh_agent" \
    --mca btl tcp,self --mca btl_tcp_if_include 10.231.0.0/24 --mca oob_tcp_if_include 10.231.0.0/24 "$@"
}

# A cut: every packet to and from host H dropped (a pfifo queue of length 0 at both ends of its
# link) while the link stays up, as when a switch or cable beyond the host's port fails.
bed_cut() {
  ip netns exec "$(bed_sw)" tc qdisc replace dev "p$1" root pfifo limit 0
  ip netns exec "$(bed_ns "$1")" tc qdisc replace dev eth0 root pfifo limit 0
}
bed_heal() { bed_unthrottle "$1"; }
bed_throttle() {
  ip netns exec "$(bed_sw)" tc qdisc replace dev "p$1" root tbf rate "$2" burst "$3" latency 20ms
  ip netns exec "$(bed_ns "$1")" tc qdisc replace dev eth0 root tbf rate "$2" burst "$3" latency 20ms
}
bed_unthrottle() {  # and checks that no tbf / pfifo is left on either end (a few tries, then fails loudly)
  local try
  for try in 1 2 3 4 5; do
    ip netns exec "$(bed_sw)" tc qdisc del dev "p$1" root 2> /dev/null || true
    ip netns exec "$(bed_ns "$1")" tc qdisc del dev eth0 root 2> /dev/null || true
    if ! ip netns exec "$(bed_sw)" tc qdisc show dev "p$1" | grep -Eq 'qdisc (tbf|pfifo) ' &&
      ! ip netns exec "$(bed_ns "$1")" tc qdisc show dev eth0 | grep -Eq 'qdisc (tbf|pfifo) '; then
      return 0
    fi
    sleep 0.2
  done
  echo "bed_unthrottle: host $1's link still has a tbf / pfifo qdisc:" >&2
  ip netns exec "$(bed_sw)" tc qdisc show dev "p$1" >&2
  ip netns exec "$(bed_ns "$1")" tc qdisc show dev eth0 >&2
  return 1
}
