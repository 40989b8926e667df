#!/usr/bin/env bash
# A local, real Kubernetes cluster on this machine, offline, with nothing of the host touched:
#
#   sudo bash hack/cluster.sh up [--nodes N] [--dual-stack] [--subnets S]
#                                              brings it up (N nodes, default 1; IPv4, or IPv4 + IPv6;
#                                              the nodes in S subnets joined by a router, default 1);
#                                              prints the kubeconfig
#   sudo bash hack/cluster.sh down             removes everything `up` made
#   sudo bash hack/cluster.sh kubectl ARGS...  kubectl against it
#   sudo bash hack/cluster.sh restart kubelet|containerd|kube-proxy|etcd|kube-apiserver|... [NODE]
#                                              as a service restart (the control plane runs on node 1)
#   sudo bash hack/cluster.sh stop|start PART [NODE]   the same in two steps: a part away for a while
#
# Parts (hack/build-upstream.sh, pinned in hack/upstream/): etcd, kube-apiserver (Node + RBAC
# authorization, NodeRestriction, ServiceAccount tokens, privileged pods allowed), kube-controller-
# manager (--allocate-node-cidrs: Nodes get spec.podCIDR(s) from the cluster CIDR, as kubenet
# clusters do), kube-scheduler, and on every node containerd 2.x + runc (the locally built pause
# image pinned as its sandbox image; it, the agent's image and the add-ons' images of
# hack/build-addon-images.sh, CoreDNS and Prometheus, imported), kubelet and kube-proxy (iptables).
# Node 1 also runs the control plane, as a kubeadm control-plane node does. The cluster's DNS:
# CoreDNS as Service kube-system/kube-dns at kubelet's clusterDNS 10.96.0.10 (hack/cluster/
# coredns.yaml, applied once the nodes registered; no forwarding: nothing outside the cluster is
# looked up). No CNI is installed: nodes stay NotReady, and CoreDNS's pod Pending, until a network
# plugin writes its conflist (kubectl apply -f manifests/kubenet.yaml).
#
# Each node is a sandbox: a netns kcl-n<i> whose uplink kcl<i>u (198.18.252.<10+i>/24, with
# --dual-stack also fd00:4b:252::<10+i>/64) reaches a
# shared LAN bridge in netns kcl-lan, and a private mount namespace (held by a `sleep infinity`)
# with fresh tmpfs over the directories a node writes (/var/lib/kubelet, /var/lib/containerd,
# /run/containerd, /etc/cni/net.d, /opt/cni/bin, /var/lib/cni, /var/lib/kubenet, /run/kubenet,
# /run/netns, /var/log/pods, /var/log/containers), /sys as seen from its netns, and files of its own
# bind-mounted over the global sysctls kubelet sets (vm.overcommit_memory, vm.panic_on_oom,
# kernel.panic, kernel.panic_on_oops, kernel.keys.root_max*): kubelet reads and writes those, the
# host's stay as they are; /etc/resolv.conf names only 127.0.0.1 (no lookup leaves the cluster, and
# the API server reaches kubelets by their InternalIP, never a name). Pods' cgroups live under /kcl-n<i> in every hierarchy. The API server is
# reached from the host through 127.0.0.1:$KCL_API_PORT (default 16443), relayed into node 1.
# Everything else is under $KCL_DIR (default /tmp/kubenet-cluster): PKI, kubeconfigs, logs, etcd.
# KCL_EXTRA_IMAGES="A.oci.tar B.oci.tar" imports more images into every node's containerd;
# --subnets S puts the nodes in S subnets, in order (3 nodes, 2 subnets: n1 and n2 in the first, n3
# in the second): subnet s is 198.18.(252+s).0/24 (fd00:4b:(252+s)::/64) on a bridge of its own in
# kcl-lan, which forwards between them as a router with no route to any pod (a node's pods reach
# another subnet's only as a network plugin carries them: kubenet-ts's routes: auto, through VXLAN).
# KCL_CLUSTER_CIDR replaces the IPv4 cluster CIDR 10.244.0.0/16 (bench/routes: room for 1 000 Nodes). A failed
# `up` removes what it made; a second `up` while a cluster is up is refused.
# Host changes that remain: empty mount-point directories a tmpfs needed.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
DIR="${KCL_DIR:-/tmp/kubenet-cluster}"
API_PORT="${KCL_API_PORT:-16443}"
LAN=198.18.252
LAN6=fd00:4b:252:
CLUSTER_CIDR="${KCL_CLUSTER_CIDR:-10.244.0.0/16}"
SERVICE_CIDR=10.96.0.0/16
# --dual-stack: the IPv6 halves (a /64 per node out of a /56, as kubeadm's dual-stack defaults).
CLUSTER_CIDR6=fd00:10:244::/56
SERVICE_CIDR6=fd00:10:96::/112
B="$ROOT/native/build/upstream"
ADDON_IMPORTS=()
DUAL=0
SUBNETS=1
NODES=1
# subnet_of I: node I's subnet (0: the first, node 1's); node_ip4 / node_ip6 I, gw4 / gw6 I: its addresses and gateway.
subnet_of() { echo $((($1 - 1) * SUBNETS / NODES)); }
node_ip4() { echo "198.18.$((252 + $(subnet_of "$1"))).$((10 + $1))"; }
node_ip6() { echo "fd00:4b:$((252 + $(subnet_of "$1")))::$((10 + $1))"; }
gw4() { echo "198.18.$((252 + $(subnet_of "$1"))).1"; }
gw6() { echo "fd00:4b:$((252 + $(subnet_of "$1")))::1"; }
TMPFS_DIRS=(/var/lib/kubelet /var/lib/containerd /run/containerd /etc/cni/net.d /opt/cni/bin /var/lib/cni /var/lib/kubenet /run/kubenet /run/netns /var/log/pods /var/log/containers)
SYSCTLS=(vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops kernel/keys/root_maxkeys kernel/keys/root_maxbytes)
CGROUPS=(cpu cpuacct cpuset memory devices freezer blkio pids systemd unified)

die() { echo "cluster: $*" >&2; exit 1; }
log() { echo "cluster: $*" >&2; }
[ "$(id -u)" -eq 0 ] || die "run as root (network namespaces, mounts, cgroups)"

holder() { cat "$DIR/n$1/holder.pid"; }
# in I CMD...: CMD in node I's namespaces, in $DIR.
in_node() { local i="$1"; shift; nsenter -t "$(holder "$i")" -m -n --wdns="$DIR" "$@"; }
# start I NAME CMD...: a long-running process of node I, logged to $DIR/n<I>/NAME.log.
start() {
  local i="$1" name="$2"; shift 2
  printf '%s\0' "$@" >"$DIR/n$i/$name.cmd"
  setsid nsenter -t "$(holder "$i")" -m -n --wdns="$DIR" "$@" >>"$DIR/n$i/$name.log" 2>&1 </dev/null &
  echo $! >"$DIR/n$i/$name.pid"
}
# stop NAME [I]: SIGTERM (SIGKILL after 10 s) node I's NAME (kubelet, containerd, kube-proxy, etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler); what it ran (pods, shims) goes on.
stop_part() {
  local name="$1" i="${2:-1}" pid
  [ -f "$DIR/n$i/$name.cmd" ] || die "node $i runs no $name"
  pid="$(cat "$DIR/n$i/$name.pid")"
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
  log "stopped $name on node $i"
}
# resume NAME [I]: start node I's NAME again as it was started (after stop); a running one is left alone.
resume() {
  local name="$1" i="${2:-1}" args
  [ -f "$DIR/n$i/$name.cmd" ] || die "node $i runs no $name"
  if kill -0 "$(cat "$DIR/n$i/$name.pid")" 2>/dev/null; then log "$name on node $i is running"; return; fi
  mapfile -d '' args <"$DIR/n$i/$name.cmd"
  start "$i" "$name" "${args[@]}"
  log "started $name on node $i (pid $(cat "$DIR/n$i/$name.pid"))"
}
# restart NAME [I]: stop, then resume, as a service restart.
restart() {
  stop_part "$@"
  resume "$@"
}
kctl() { in_node 1 "$B/kubernetes/kubectl" --kubeconfig "$DIR/admin.kubeconfig" "$@"; }
wait_for() { # WHAT SECONDS CMD...
  local what="$1" s="$2"; shift 2
  local end=$((SECONDS + s))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $end ] || die "timed out after $s s waiting for $what (logs: $DIR)"
    sleep 0.5
  done
}

pki() {
  local o="openssl"
  mkdir -p "$DIR/pki"
  cd "$DIR/pki"
  $o req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ca.key -out ca.crt -days 7 -subj /CN=kubenet-cluster-ca 2>/dev/null
  $o genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out sa.key 2>/dev/null
  $o pkey -in sa.key -pubout -out sa.pub 2>/dev/null
  cd "$ROOT"
}
# cert NAME SUBJECT EXT: a key and certificate signed by the cluster CA.
cert() {
  (cd "$DIR/pki" && printf '%b\n' "$3" >"$1.ext" &&
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null &&
    openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$1.crt" -days 7 -extfile "$1.ext" 2>/dev/null)
}
# kubeconfig NAME SERVER: $DIR/NAME.kubeconfig with the client certificate NAME.
kubeconfig() {
  cat >"$DIR/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: kubenet-cluster, cluster: {server: "$2", certificate-authority: $DIR/pki/ca.crt}}]
users: [{name: $1, user: {client-certificate: $DIR/pki/$1.crt, client-key: $DIR/pki/$1.key}}]
contexts: [{name: kubenet-cluster, context: {cluster: kubenet-cluster, user: $1}}]
current-context: kubenet-cluster
EOF
}

# node_sandbox I: node I's netns on the LAN, its mount namespace, cgroups and credentials.
node_sandbox() {
  local i="$1" ip nd="$DIR/n$1" br=kcl-br
  ip="$(node_ip4 "$i")"
  [ "$(subnet_of "$i")" -eq 0 ] || br="kcl-br$(subnet_of "$i")"
  mkdir -p "$nd"
  ip netns add "kcl-n$i"
  ip -n "kcl-n$i" link set lo up
  ip -n "kcl-n$i" link add "kcl${i}u" type veth peer name "kcl${i}l" netns kcl-lan
  ip -n "kcl-n$i" addr add "$ip/24" dev "kcl${i}u"
  ip -n "kcl-n$i" link set "kcl${i}u" up
  ip -n "kcl-n$i" route add default via "$(gw4 "$i")"
  if [ "$DUAL" = 1 ]; then
    ip -n "kcl-n$i" addr add "$(node_ip6 "$i")/64" dev "kcl${i}u" nodad
    ip -n "kcl-n$i" route add default via "$(gw6 "$i")"
  fi
  ip -n kcl-lan link set "kcl${i}l" master "$br" up
  for f in "${SYSCTLS[@]}"; do cat "/proc/sys/$f" >"$nd/sysctl-${f//\//_}"; done
  echo "nameserver 127.0.0.1" >"$nd/resolv.conf"
  for d in "${TMPFS_DIRS[@]}"; do mkdir -p "$d"; done
  cat >"$nd/holder.sh" <<EOF
set -eu
for d in ${TMPFS_DIRS[*]}; do mount -t tmpfs -o mode=0755 kcl-node "\$d"; mount --make-shared "\$d"; done
for f in ${SYSCTLS[*]}; do mount --bind "$nd/sysctl-\$(echo \$f | tr / _)" "/proc/sys/\$f"; done
# No DNS server the node could reach: nothing it looks up leaves the cluster's namespaces.
mount --bind "$nd/resolv.conf" /etc/resolv.conf
mkdir -p "$nd/sys"; mount -t sysfs kcl-sysfs "$nd/sys"
if mountpoint -q /sys/fs/cgroup; then mount --move /sys/fs/cgroup "$nd/sys/fs/cgroup"; fi
umount -l /sys; mount --move "$nd/sys" /sys
echo ready
exec sleep infinity
EOF
  setsid unshare --mount --propagation slave -- nsenter --net="/var/run/netns/kcl-n$i" -- sh "$nd/holder.sh" >"$nd/holder.log" 2>&1 </dev/null &
  wait_for "node $i's mount namespace" 10 grep -q ready "$nd/holder.log"
  # The holder: the `sleep infinity` in node i's netns.
  local net p
  net="net:[$(stat -L -c %i "/var/run/netns/kcl-n$i")]"
  for p in $(pgrep -x sleep); do
    [ "$(readlink "/proc/$p/ns/net" 2>/dev/null)" = "$net" ] && [ "$(tr '\0' ' ' <"/proc/$p/cmdline")" = "sleep infinity " ] && echo "$p" >"$nd/holder.pid"
  done
  [ -s "$nd/holder.pid" ] || die "node $i: no holder process"
  for c in "${CGROUPS[@]}"; do
    [ -d "/sys/fs/cgroup/$c" ] || continue
    mkdir -p "/sys/fs/cgroup/$c/kcl-n$i"
    if [ "$c" = cpuset ]; then
      cat /sys/fs/cgroup/cpuset/cpuset.cpus >"/sys/fs/cgroup/cpuset/kcl-n$i/cpuset.cpus"
      cat /sys/fs/cgroup/cpuset/cpuset.mems >"/sys/fs/cgroup/cpuset/kcl-n$i/cpuset.mems"
    fi
  done
  cert "node-$i" "/O=system:nodes/CN=system:node:kcl-n$i" 'extendedKeyUsage=clientAuth'
  cert "kubelet-$i" "/CN=kcl-n$i" "subjectAltName=IP:$ip,$([ "$DUAL" = 1 ] && echo "IP:$(node_ip6 "$i"),")DNS:kcl-n$i\nextendedKeyUsage=serverAuth"
  kubeconfig "node-$i" "https://$LAN.11:6443"
}

# node_services I: containerd (images imported), kubelet and kube-proxy of node I.
node_services() {
  local i="$1" ip nd="$DIR/n$1"
  ip="$(node_ip4 "$i")"
  cat >"$nd/containerd.toml" <<EOF
version = 3
root = "/var/lib/containerd"
state = "/run/containerd"
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.nri.v1.nri"]
  disable = true
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "kubenet-ts.local/sandbox:1"
[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
    BinaryName = "$B/runc/runc"
EOF
  start "$i" containerd env PATH="$B/containerd:$PATH" "$B/containerd/containerd" --config "$nd/containerd.toml"
  wait_for "node $i's containerd" 30 in_node "$i" "$B/containerd/ctr" --address /run/containerd/containerd.sock version
  for img in native/build/sandbox-image.oci.tar native/build/kubenet-image.oci.tar; do
    in_node "$i" "$B/containerd/ctr" --address /run/containerd/containerd.sock -n k8s.io images import "$ROOT/$img" >/dev/null
  done
  # The add-ons' images (CoreDNS, Prometheus): no pod runs them before a network plugin does, so
  # they are imported in the background while `up` goes on (~3 s a node), and waited for at its end.
  (for img in native/build/coredns-image.oci.tar native/build/prometheus-image.oci.tar; do
    in_node "$i" "$B/containerd/ctr" --address /run/containerd/containerd.sock -n k8s.io images import "$ROOT/$img" >/dev/null || exit 1
  done) >"$nd/addon-images.log" 2>&1 &
  ADDON_IMPORTS+=($!)
  for img in "${KCL_IMAGES[@]}"; do
    in_node "$i" "$B/containerd/ctr" --address /run/containerd/containerd.sock -n k8s.io images import "$img" >/dev/null
  done
  cat >"$nd/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
failSwapOn: false
cgroupDriver: cgroupfs
cgroupRoot: /kcl-n$i
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $DIR/pki/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: $DIR/pki/kubelet-$i.crt
tlsPrivateKeyFile: $DIR/pki/kubelet-$i.key
address: $ip
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
clusterDomain: cluster.local
clusterDNS: [10.96.0.10]
resolvConf: /etc/resolv.conf
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {}
rotateCertificates: false
serializeImagePulls: false
EOF
  local node_ip="$ip"
  [ "$DUAL" = 1 ] && node_ip="$ip,$(node_ip6 "$i")"
  start "$i" kubelet "$B/kubernetes/kubelet" --config "$nd/kubelet.yaml" --kubeconfig "$DIR/node-$i.kubeconfig" --hostname-override "kcl-n$i" --node-ip "$node_ip" --root-dir /var/lib/kubelet
  cat >"$nd/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {kubeconfig: $DIR/kube-proxy.kubeconfig}
clusterCIDR: $(cluster_cidrs)
hostnameOverride: kcl-n$i
bindAddress: $ip
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
nodePortAddresses: [primary]
# The conntrack timeouts are upstream's (established 24h, close-wait 1h): kube-proxy sets them in
# the node's netns, where they are per network namespace (the host's stay as they are). Only the
# table size is left alone: nf_conntrack_max is global, read-only outside the host's netns (a
# write fails, and kube-proxy exits where the host's value is below the one it computes), and the
# hash size kube-proxy would raise with it is the host's (/sys/module/nf_conntrack/parameters).
conntrack: {maxPerCore: 0}
EOF
  start "$i" kube-proxy "$B/kubernetes/kube-proxy" --config "$nd/kube-proxy.yaml"
}

cluster_cidrs() { if [ "$DUAL" = 1 ]; then echo "$CLUSTER_CIDR,$CLUSTER_CIDR6"; else echo "$CLUSTER_CIDR"; fi; }
# The controller-manager refuses the per-family mask flags in a single-stack cluster.
mask_sizes() { if [ "$DUAL" = 1 ]; then echo "--node-cidr-mask-size-ipv4 24 --node-cidr-mask-size-ipv6 64"; else echo "--node-cidr-mask-size 24"; fi; }
service_cidrs() { if [ "$DUAL" = 1 ]; then echo "$SERVICE_CIDR,$SERVICE_CIDR6"; else echo "$SERVICE_CIDR"; fi; }

up() {
  local nodes=1
  while [ $# -gt 0 ]; do
    case "$1" in
      --nodes) nodes="${2:?--nodes N}"; shift 2 ;;
      --dual-stack) DUAL=1; shift ;;
      --subnets) SUBNETS="${2:?--subnets S}"; shift 2 ;;
      *) die "unknown argument $1 (up [--nodes N] [--dual-stack] [--subnets S])" ;;
    esac
  done
  [[ "$nodes" =~ ^[1-9]$ ]] || die "--nodes: 1..9"
  [[ "$SUBNETS" =~ ^[1-9]$ ]] && [ "$SUBNETS" -le "$nodes" ] || die "--subnets: 1..$nodes (at most one per node)"
  NODES="$nodes"
  [ ! -e "$DIR" ] || die "$DIR exists: a cluster is up (or was not taken down): hack/cluster.sh down"
  ! ip netns list | grep -q '^kcl-' || die "network namespaces kcl-* exist: another cluster is up (its KCL_DIR's down removes it)"
  local t0=$SECONDS
  bash hack/build-upstream.sh etcd kubernetes containerd runc >/dev/null
  bash hack/build-sandbox-image.sh >/dev/null
  bash hack/build-image.sh >/dev/null
  bash hack/build-addon-images.sh coredns prometheus >/dev/null
  mkdir -p "$DIR"
  echo "$nodes" >"$DIR/nodes"
  echo "$DUAL" >"$DIR/dual-stack"
  echo "$SUBNETS" >"$DIR/subnets"
  # A failed `up` takes down what it made.
  trap 'rc=$?; if [ $rc -ne 0 ]; then log "up failed: removing what it made (its logs go too; KCL_KEEP=1 keeps $DIR)"; [ -n "${KCL_KEEP:-}" ] || down; fi' EXIT
  read -r -a KCL_IMAGES <<<"${KCL_EXTRA_IMAGES:-}"
  pki
  cert apiserver /CN=kube-apiserver "subjectAltName=IP:127.0.0.1,IP:$LAN.11,IP:10.96.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:localhost\nextendedKeyUsage=serverAuth"
  cert admin "/O=system:masters/CN=kubernetes-admin" 'extendedKeyUsage=clientAuth'
  cert kube-controller-manager /CN=system:kube-controller-manager 'extendedKeyUsage=clientAuth'
  cert kube-scheduler /CN=system:kube-scheduler 'extendedKeyUsage=clientAuth'
  cert kube-proxy /CN=system:kube-proxy 'extendedKeyUsage=clientAuth'
  cert apiserver-kubelet-client "/O=kubeadm:cluster-admins/CN=kube-apiserver-kubelet-client" 'extendedKeyUsage=clientAuth'
  for c in admin kube-controller-manager kube-scheduler kube-proxy; do kubeconfig "$c" "https://$LAN.11:6443"; done
  # The LAN: a bridge in its own netns, with the nodes' gateway address; one per subnet, routed
  # between (forwarding on; no route to any pod CIDR).
  ip netns add kcl-lan
  ip -n kcl-lan link set lo up
  local s br
  for ((s = 0; s < SUBNETS; s++)); do
    br=kcl-br
    [ "$s" -eq 0 ] || br="kcl-br$s"
    ip -n kcl-lan link add "$br" type bridge
    ip -n kcl-lan addr add "198.18.$((252 + s)).1/24" dev "$br"
    [ "$DUAL" = 1 ] && ip -n kcl-lan addr add "fd00:4b:$((252 + s))::1/64" dev "$br" nodad
    ip -n kcl-lan link set "$br" up
  done
  if [ "$SUBNETS" -gt 1 ]; then
    ip netns exec kcl-lan sysctl -q -w net.ipv4.ip_forward=1
    [ "$DUAL" = 1 ] && ip netns exec kcl-lan sysctl -q -w net.ipv6.conf.all.forwarding=1
  fi
  for ((i = 1; i <= nodes; i++)); do
    node_sandbox "$i"
    [ "$i" -eq 1 ] && control_plane_up
    node_services "$i"
  done
  # The host's way in: 127.0.0.1:API_PORT -> a unix socket -> node 1 -> the API server.
  start 1 api-relay-in node -e "require('net').createServer((c)=>{const u=require('net').connect(6443,'$LAN.11');c.pipe(u).pipe(c);c.on('error',()=>u.destroy());u.on('error',()=>c.destroy())}).listen('$DIR/api.sock')"
  wait_for "the API relay in node 1" 10 test -S "$DIR/api.sock"
  setsid node -e "require('net').createServer((c)=>{const u=require('net').connect('$DIR/api.sock');c.pipe(u).pipe(c);c.on('error',()=>u.destroy());u.on('error',()=>c.destroy())}).listen($API_PORT,'127.0.0.1')" >"$DIR/api-relay-out.log" 2>&1 </dev/null &
  echo $! >"$DIR/api-relay-out.pid"
  sed "s#https://$LAN.11:6443#https://127.0.0.1:$API_PORT#" "$DIR/admin.kubeconfig" >"$DIR/kubeconfig"
  wait_for "$nodes node(s) registered" 120 nodes_registered "$nodes"
  # The controller-manager works (a part that exited would show here, not later): every Node has its pod CIDR(s).
  wait_for "pod CIDRs of every node (kube-controller-manager: $DIR/n1/kube-controller-manager.log)" 60 cidrs_allocated
  dns_up
  local p
  for p in "${ADDON_IMPORTS[@]}"; do wait "$p" || die "importing the add-ons' images failed ($DIR/n*/addon-images.log)"; done
  log "up in $((SECONDS - t0)) s: $nodes node(s), Kubernetes $("$B/kubernetes/kubectl" version --client -o json | sed -n 's/.*"gitVersion": "\(.*\)".*/\1/p' | head -1); nodes are NotReady until a network plugin runs (kubectl apply -f manifests/kubenet.yaml)"
  trap - EXIT
  echo "$DIR/kubeconfig"
}

# dns_up: CoreDNS as kube-dns (hack/cluster/coredns.yaml), at 10.96.0.10 (and fd00:10:96::a).
dns_up() {
  local policy=SingleStack ips=10.96.0.10
  [ "$DUAL" = 1 ] && policy=RequireDualStack ips="10.96.0.10, fd00:10:96::a"
  sed -e "s#@IMAGE@#$(bash hack/build-addon-images.sh --print-name coredns)#" -e "s#@IP_FAMILY_POLICY@#$policy#" -e "s#@CLUSTER_IPS@#$ips#" \
    hack/cluster/coredns.yaml | kctl apply -f - >/dev/null
}

nodes_registered() { [ "$(kctl get nodes -o name | wc -l)" -eq "$1" ]; }
cidrs_allocated() { ! kctl get nodes -o jsonpath='{range .items[*]}{.metadata.name}={.spec.podCIDR}{"\n"}{end}' | grep -q '=$'; }

# The control plane, in node 1's sandbox (before its containerd, kubelet and kube-proxy).
control_plane_up() {
  start 1 etcd "$B/etcd/etcd" --data-dir "$DIR/etcd" --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 --listen-peer-urls http://127.0.0.1:2380
  start 1 kube-apiserver "$B/kubernetes/kube-apiserver" --etcd-servers http://127.0.0.1:2379 \
    --bind-address 0.0.0.0 --advertise-address "$LAN.11" --secure-port 6443 --allow-privileged=true \
    --tls-cert-file "$DIR/pki/apiserver.crt" --tls-private-key-file "$DIR/pki/apiserver.key" --client-ca-file "$DIR/pki/ca.crt" \
    --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
    --service-account-issuer https://kubernetes.default.svc --service-account-key-file "$DIR/pki/sa.pub" --service-account-signing-key-file "$DIR/pki/sa.key" \
    --service-cluster-ip-range "$(service_cidrs)" --kubelet-preferred-address-types InternalIP \
    --kubelet-client-certificate "$DIR/pki/apiserver-kubelet-client.crt" --kubelet-client-key "$DIR/pki/apiserver-kubelet-client.key" --kubelet-certificate-authority "$DIR/pki/ca.crt"
  wait_for "the API server" 90 kctl get --raw /readyz
  # kube-apiserver's kubelet client (logs, exec) gets the role kubeadm gives it.
  kctl create clusterrolebinding kubeadm:cluster-admins --clusterrole cluster-admin --group kubeadm:cluster-admins >/dev/null
  start 1 kube-controller-manager "$B/kubernetes/kube-controller-manager" --kubeconfig "$DIR/kube-controller-manager.kubeconfig" \
    --authentication-kubeconfig "$DIR/kube-controller-manager.kubeconfig" --authorization-kubeconfig "$DIR/kube-controller-manager.kubeconfig" \
    --allocate-node-cidrs --cluster-cidr "$(cluster_cidrs)" $(mask_sizes) --service-cluster-ip-range "$(service_cidrs)" \
    --service-account-private-key-file "$DIR/pki/sa.key" --root-ca-file "$DIR/pki/ca.crt" --use-service-account-credentials \
    --bind-address 127.0.0.1 --leader-elect=false
  start 1 kube-scheduler "$B/kubernetes/kube-scheduler" --kubeconfig "$DIR/kube-scheduler.kubeconfig" \
    --authentication-kubeconfig "$DIR/kube-scheduler.kubeconfig" --authorization-kubeconfig "$DIR/kube-scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --leader-elect=false
}

down() {
  [ -d "$DIR" ] || { log "no cluster at $DIR"; return 0; }
  local n i
  n="$(cat "$DIR/nodes" 2>/dev/null || echo 9)"
  [ -f "$DIR/api-relay-out.pid" ] && kill "$(cat "$DIR/api-relay-out.pid")" 2>/dev/null || true
  for ((i = n; i >= 1; i--)); do
    [ -f "$DIR/n$i/holder.pid" ] || continue
    local h mnt
    h="$(holder "$i")"
    mnt="$(readlink "/proc/$h/ns/mnt" 2>/dev/null || true)"
    # Every process of the node: its mount namespace's, and whatever runs in its cgroups (pods).
    for round in 1 2 3 4 5; do
      local pids=()
      if [ -n "$mnt" ]; then
        for p in /proc/[0-9]*; do [ "$(readlink "$p/ns/mnt" 2>/dev/null)" = "$mnt" ] && [ "${p#/proc/}" != "$h" ] && pids+=("${p#/proc/}"); done
      fi
      for c in "${CGROUPS[@]}"; do
        [ -d "/sys/fs/cgroup/$c/kcl-n$i" ] && while read -r p; do pids+=("$p"); done < <(find "/sys/fs/cgroup/$c/kcl-n$i" -name cgroup.procs -exec cat {} + 2>/dev/null)
      done
      [ ${#pids[@]} -eq 0 ] && break
      kill -9 "${pids[@]}" 2>/dev/null || true
      sleep 0.5
    done
    kill -9 "$h" 2>/dev/null || true
    for c in "${CGROUPS[@]}"; do
      [ -d "/sys/fs/cgroup/$c/kcl-n$i" ] && find "/sys/fs/cgroup/$c/kcl-n$i" -depth -type d -exec rmdir {} + 2>/dev/null || true
    done
    ip netns del "kcl-n$i" 2>/dev/null || true
  done
  ip netns del kcl-lan 2>/dev/null || true
  local left=""
  for c in "${CGROUPS[@]}"; do for d in /sys/fs/cgroup/$c/kcl-n*; do [ -d "$d" ] && left+=" $d"; done; done
  ip netns list | grep -q '^kcl-' && left+=" $(ip netns list | grep '^kcl-' | cut -d' ' -f1 | tr '\n' ' ')"
  rm -rf "$DIR"
  [ -z "$left" ] || die "left behind:$left"
  log "down: nothing left"
}

case "${1:-}" in
  up) shift; up "$@" ;;
  down) down ;;
  kubectl) shift; in_node 1 "$B/kubernetes/kubectl" --kubeconfig "$DIR/admin.kubeconfig" "$@" ;;
  restart) shift; restart "$@" ;;
  stop) shift; stop_part "$@" ;;
  start) shift; resume "$@" ;;
  *) die "usage: hack/cluster.sh up [--nodes N] [--dual-stack] [--subnets S] | down | kubectl ARGS... | restart|stop|start PART [NODE]" ;;
esac
