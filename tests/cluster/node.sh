#!/usr/bin/env bash
# A real one-node Kubernetes cluster for gpushare's tests, from the components
# scripts/build-cluster.sh builds: etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kube-proxy, kubelet and containerd 2, on this machine, as root.
#
#   tests/cluster/node.sh up     starts it (certificates made for this run); prints the
#                                kubeconfig to use (KUBECONFIG=...) as its last line
#   tests/cluster/node.sh down   stops it and removes everything it made: processes, pods'
#                                mounts, kubepods cgroups, iptables rules, the CNI bridge,
#                                its directories
#   tests/cluster/node.sh env    prints the variables a test reads (KUBECONFIG, BIN, NODE, ...)
#   tests/cluster/node.sh restart-kubelet
#                                kubelet stopped and started again, its pods left running
#   tests/cluster/node.sh power-off | power-on
#                                what a reboot does to the node (its control plane stays up):
#                                see power_off below
#
# Layout (everything under these, removed by `down`):
#   /run/gpushare-cluster        run state: pki/, kubeconfigs, logs/, pids/, containerd's socket
#                                and state, CNI configuration and IP allocations
#   /var/lib/gpushare-cluster    etcd's data, containerd's root (images)
#   /var/lib/kubelet             kubelet's root: where the DRA plugin of deployments/ expects it
# containerd 2 runs with its own socket, root and state, never Debian's containerd the other
# tests use. No systemd: each component runs under `tini -s` (this machine's PID 1 reaps
# nothing), its pid in pids/, its output in logs/.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
run=${GPUSHARE_CLUSTER_RUN:-/run/gpushare-cluster}
var=${GPUSHARE_CLUSTER_VAR:-/var/lib/gpushare-cluster}
kubelet_root=/var/lib/kubelet
pki=$run/pki
logs=$run/logs
pids=$run/pids
containerd_sock=$run/containerd/containerd.sock
bridge=gpushare0
pod_cidr=10.244.0.0/24
service_cidr=10.96.0.0/16
pause_image=gpushare.test/pause:local

say() { echo "node.sh: $*" >&2; }
die() { say "$*"; exit 1; }

node_ip() { ip -4 route get 1.1.1.1 2>/dev/null | awk '{ for (i = 1; i < NF; i++) if ($i == "src") { print $(i + 1); exit } }'; }

# An EKS-like node name, from the node's address (EC2's private DNS name form).
node_name() { echo "ip-$(node_ip | tr . -).ec2.internal"; }

bin_dir() { "$repo/scripts/build-cluster.sh" | tail -1; }

# cert NAME CN [O] [SANs]: a key and a certificate signed by the run's CA.
cert() {
  local name=$1 cn=$2 org=${3:-} sans=${4:-}
  local subj="/CN=$cn"
  [ -n "$org" ] && subj="/O=$org$subj"
  openssl genrsa -out "$pki/$name.key" 2048 2>/dev/null
  openssl req -new -key "$pki/$name.key" -subj "$subj" -out "$pki/$name.csr" 2>/dev/null
  local ext="$pki/$name.ext"
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=serverAuth,clientAuth"
    [ -n "$sans" ] && echo "subjectAltName=$sans"
  } >"$ext"
  openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 2 -sha256 -extfile "$ext" -out "$pki/$name.crt" 2>/dev/null
  rm -f "$pki/$name.csr" "$ext"
}

# kubeconfig NAME CERT: a kubeconfig for the API server with CERT's client certificate.
kubeconfig() {
  local name=$1 crt=$2 file=$run/$1.kubeconfig
  local k="$BIN/kubectl --kubeconfig=$file"
  $k config set-cluster node --server="https://$IP:6443" --certificate-authority="$pki/ca.crt" --embed-certs >/dev/null
  $k config set-credentials "$name" --client-certificate="$pki/$crt.crt" --client-key="$pki/$crt.key" --embed-certs >/dev/null
  $k config set-context node --cluster=node --user="$name" >/dev/null
  $k config use-context node >/dev/null
}

make_pki() {
  mkdir -p "$pki"
  openssl genrsa -out "$pki/ca.key" 2048 2>/dev/null
  openssl req -x509 -new -key "$pki/ca.key" -subj "/CN=gpushare-test-ca" -days 2 -out "$pki/ca.crt" 2>/dev/null
  cert apiserver kube-apiserver "" "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,IP:127.0.0.1,IP:$IP,IP:10.96.0.1"
  cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters
  cert admin kubernetes-admin system:masters
  cert controller-manager system:kube-controller-manager
  cert scheduler system:kube-scheduler
  cert kube-proxy system:kube-proxy
  cert kubelet "system:node:$NODE" system:nodes "DNS:$NODE,IP:$IP,IP:127.0.0.1"
  openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
  chmod 600 "$pki"/*.key
}

# start NAME COMMAND...: runs COMMAND under tini (reaping what it orphans), in its own session.
start() {
  local name=$1
  shift
  # Appended: a component started again (kubelet's restart, a reboot) keeps its earlier log.
  setsid /usr/bin/tini -s -- "$@" >>"$logs/$name.log" 2>&1 </dev/null &
  echo $! >"$pids/$name"
}

# wait_for WHAT SECONDS COMMAND...: until COMMAND succeeds, or fail naming WHAT and its log.
wait_for() {
  local what=$1 secs=$2
  shift 2
  local end=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $end ]; then
      say "$what not ready after $secs s; the end of its log:"
      tail -20 "$logs/$what.log" >&2 || true
      return 1
    fi
    sleep 0.5
  done
}


up() {
  [ "$(id -u)" -eq 0 ] || die "needs root"
  [ -e "$run" ] && die "$run exists: a node is up, or was not taken down (tests/cluster/node.sh down)"
  command -v tini >/dev/null || die "tini missing (scripts/install-test-deps.sh installs it)"
  BIN=$(bin_dir)
  IP=$(node_ip)
  NODE=$(node_name)
  [ -n "$IP" ] || die "no address with a route: the API server needs one pods can reach"
  mkdir -p "$run" "$logs" "$pids" "$var" "$run/containerd" "$run/cni/net.d" "$run/cni/ipam"
  cat >"$run/env" <<EOF
BIN=$BIN
IP=$IP
NODE=$NODE
KUBECONFIG=$run/admin.kubeconfig
CONTAINERD_ADDRESS=$containerd_sock
EOF
  make_pki
  # The shims' sockets go to /run/containerd/s whatever containerd's state directory (a
  # path containerd 2 fixes), beside Debian containerd's: those there before are not ours.
  ls /run/containerd/s >"$run/shim-sockets-before" 2>/dev/null || true
  kubeconfig admin admin
  kubeconfig controller-manager controller-manager
  kubeconfig scheduler scheduler
  kubeconfig kube-proxy kube-proxy
  kubeconfig kubelet kubelet

  start etcd "$BIN/etcd" --name node --data-dir "$var/etcd" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster node=http://127.0.0.1:2380 --log-level warn --quota-backend-bytes 1073741824
  wait_for etcd 30 curl -sf http://127.0.0.1:2379/health

  # No feature gate is set: Kubernetes 1.36.3's defaults serve what gpushare publishes and the
  # guides ask for (pkg/features/kube_features.go at v1.36.3: DRAPartitionableDevices GA;
  # DRADeviceTaints, DRAConsumableCapacity, DRAAdminAccess, DRAResourceClaimDeviceStatus and
  # ResourceHealthStatus beta and on; DRAExtendedResource alpha and DRADeviceBindingConditions
  # beta, both off). v1beta1 (the exclusive guide's template) and v1beta2 (DeviceTaintRule)
  # are served beside v1.
  start kube-apiserver "$BIN/kube-apiserver" \
    --etcd-servers=http://127.0.0.1:2379 \
    --bind-address="$IP" --advertise-address="$IP" --secure-port=6443 \
    --client-ca-file="$pki/ca.crt" \
    --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
    --kubelet-client-certificate="$pki/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$pki/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority="$pki/ca.crt" \
    --service-account-key-file="$pki/sa.pub" \
    --service-account-signing-key-file="$pki/sa.key" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-cluster-ip-range="$service_cidr" \
    --kubelet-preferred-address-types=InternalIP \
    --authorization-mode=Node,RBAC \
    --enable-admission-plugins=NodeRestriction \
    --runtime-config=resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true \
    --allow-privileged=true \
    --profiling=false
  wait_for kube-apiserver 120 "$BIN/kubectl" --kubeconfig="$run/admin.kubeconfig" get --raw=/readyz
  say "API server ready"

  start kube-controller-manager "$BIN/kube-controller-manager" \
    --kubeconfig="$run/controller-manager.kubeconfig" \
    --authentication-kubeconfig="$run/controller-manager.kubeconfig" \
    --authorization-kubeconfig="$run/controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --leader-elect=false \
    --service-account-private-key-file="$pki/sa.key" --root-ca-file="$pki/ca.crt" \
    --cluster-signing-cert-file="$pki/ca.crt" --cluster-signing-key-file="$pki/ca.key" \
    --use-service-account-credentials=true --controllers='*' \
    --service-cluster-ip-range="$service_cidr"
  start kube-scheduler "$BIN/kube-scheduler" \
    --kubeconfig="$run/scheduler.kubeconfig" \
    --authentication-kubeconfig="$run/scheduler.kubeconfig" \
    --authorization-kubeconfig="$run/scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --leader-elect=false

  cni_config >"$run/cni/net.d/10-gpushare.conflist"
  containerd_config >"$run/containerd.toml"
  kubelet_config >"$run/kubelet.yaml"
  start_containerd
  images
  say "containerd ready"
  start_kubelet
  start_kube_proxy
  wait_for kubelet 90 node_ready
  # Pods are refused until the controller-manager made the namespace's service account.
  wait_for kube-controller-manager 60 "$BIN/kubectl" --kubeconfig="$run/admin.kubeconfig" get serviceaccount default
  say "node $NODE ready"
  echo "KUBECONFIG=$run/admin.kubeconfig"
}

start_containerd() {
  mkdir -p "$run/containerd" "$run/cni/ipam"
  # The shim is found on PATH: containerd 2's own, never Debian's containerd 1.6 one.
  PATH="$BIN:$PATH" start containerd "$BIN/containerd" --config "$run/containerd.toml"
  wait_for containerd 30 "$BIN/ctr" --address "$containerd_sock" version
}

start_kubelet() {
  start kubelet "$BIN/kubelet" --config="$run/kubelet.yaml" \
    --kubeconfig="$run/kubelet.kubeconfig" --root-dir="$kubelet_root" \
    --hostname-override="$NODE" --node-ip="$IP" --v=2
}

start_kube_proxy() {
  start kube-proxy "$BIN/kube-proxy" --kubeconfig="$run/kube-proxy.kubeconfig" \
    --hostname-override="$NODE" --cluster-cidr="$pod_cidr" --proxy-mode=iptables \
    --conntrack-max-per-core=0 --metrics-bind-address=127.0.0.1:10249
}

# The variables of the node that is up.
load_env() {
  [ "$(id -u)" -eq 0 ] || die "needs root"
  [ -f "$run/env" ] || die "no node is up ($run/env missing)"
  BIN=$(sed -n 's/^BIN=//p' "$run/env")
  IP=$(sed -n 's/^IP=//p' "$run/env")
  NODE=$(sed -n 's/^NODE=//p' "$run/env")
}

# kubelet stopped (SIGTERM) and started again, pods left running; waits until it is back.
restart_kubelet() {
  load_env
  stop kubelet
  start_kubelet
  wait_kubelet_back
  say "kubelet restarted"
}

# Until the kubelet just started answers its health check and has reported the node Ready
# since: the Ready condition the API server holds outlives a stopped kubelet by the node
# monitor's grace period, so it alone says nothing.
wait_kubelet_back() {
  local since
  since=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  wait_for kubelet 90 curl -sf http://127.0.0.1:10248/healthz
  wait_for kubelet 90 ready_since "$since"
}

# ready_since TIME: the node is Ready with a heartbeat at TIME or later (RFC 3339, UTC).
ready_since() {
  local beat
  node_ready || return 1
  beat=$("$BIN/kubectl" --kubeconfig="$run/admin.kubeconfig" get node "$NODE" \
    -o jsonpath='{.status.conditions[?(@.type=="Ready")].lastHeartbeatTime}')
  [[ ! "$beat" < "$1" ]]
}

# What a reboot does to the node while its control plane (elsewhere, as on EKS) stays: every
# node process gone (kubelet, kube-proxy, containerd and its shims, the containers), then
# what lived in memory or under /run — containers' mounts and cgroups, containerd's state,
# pods' network namespaces and addresses, the bridge and the iptables rules. kubelet's pod
# directories are removed too, although a disk keeps them: the harder case (issue 27's
# reboot), where kubelet has only its checkpoints to go on. What stays: images, etcd,
# kubelet's checkpoints (its DRA manager's dra_manager_state among them).
power_off() {
  load_env
  stop kube-proxy
  stop kubelet
  kill_pods
  stop containerd
  # containerd 2's shims: they leave their tini's process group.
  kill_exe "$BIN/containerd-shim-runc-v2"
  remove_shim_sockets
  clean_network
  unmount_under "$run/containerd" "$kubelet_root/pods"
  remove_kubepods_cgroups
  rm -rf "$run/containerd" "$run/runc" "$run/cni/ipam" "$kubelet_root/pods"
  say "node powered off"
}

# The node's own processes started again after power_off; waits until the node is Ready.
power_on() {
  load_env
  [ -f "$pids/kubelet" ] && die "kubelet runs: power-off first"
  start_containerd
  start_kubelet
  start_kube_proxy
  wait_kubelet_back
  say "node powered on"
}

node_ready() {
  [ "$("$BIN/kubectl" --kubeconfig="$run/admin.kubeconfig" get --raw=/readyz 2>/dev/null)" = ok ] &&
  [ "$("$BIN/kubectl" --kubeconfig="$run/admin.kubeconfig" get node "$NODE" \
    -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ]
}

cni_config() {
  cat <<EOF
{
  "cniVersion": "1.0.0",
  "name": "gpushare-test",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$bridge",
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$run/cni/ipam",
        "ranges": [[{ "subnet": "$pod_cidr" }]],
        "routes": [{ "dst": "0.0.0.0/0" }]
      }
    },
    { "type": "portmap", "capabilities": { "portMappings": true } }
  ]
}
EOF
}

containerd_config() {
  cat <<EOF
version = 3
root = '$var/containerd'
state = '$run/containerd/state'
[grpc]
  address = '$containerd_sock'
[ttrpc]
  address = '$containerd_sock.ttrpc'
[debug]
  level = 'warn'
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = '$pause_image'
[plugins.'io.containerd.cri.v1.runtime']
  # CDI is always on in containerd 2.4 (its enable_cdi setting is gone); gpushared's specs are
  # in /var/run/cdi.
  cdi_spec_dirs = ['/etc/cdi', '/var/run/cdi']
  # Pods' network namespaces under the state directory, not /run/netns beside other tests'.
  netns_mounts_under_state_dir = true
  # These machines withhold CAP_SYS_RESOURCE: runc cannot lower a process's oom_score_adj
  # below containerd's own (a sandbox's -998 fails every pod), so it is raised to that.
  restrict_oom_score_adj = true
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  SystemdCgroup = false
  BinaryName = '/usr/sbin/runc'
  # runc's state beside containerd's, not in /run/containerd/runc with Debian containerd's.
  Root = '$run/runc'
[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = ['/usr/lib/cni']
  conf_dir = '$run/cni/net.d'
EOF
}

kubelet_config() {
  cat <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: { enabled: false }
  webhook: { enabled: true }
  x509: { clientCAFile: $pki/ca.crt }
authorization: { mode: Webhook }
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$containerd_sock
tlsCertFile: $pki/kubelet.crt
tlsPrivateKeyFile: $pki/kubelet.key
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
evictionHard: { memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1% }
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
podLogsDir: $var/log/pods
EOF
}

# images: the pause image (pinned as the sandbox image) and busybox-static, made here from
# Debian's static busybox and imported with ctr: nothing is pulled.
images() {
  local dir
  dir=$(mktemp -d)
  "$here/image.sh" "$dir/pause.tar" "$pause_image" sleep infinity
  "$here/image.sh" "$dir/busybox.tar" gpushare.test/busybox:local sh
  for t in "$dir"/*.tar; do
    # (ctr warns on every call that cgroup v1 is deprecated: these machines have no other.)
    "$BIN/ctr" --address "$containerd_sock" -n k8s.io images import "$t" 2>&1 >/dev/null | grep -v DEPRECATION >&2 || true
  done
  rm -rf "$dir"
}

# stop NAME: SIGTERM to the component's process group (tini forwards it), SIGKILL after 10 s.
stop() {
  local f=$pids/$1 pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM -- "-$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL -- "-$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

# The processes in every kubepods cgroup, killed until none is left (containers, whatever
# they started).
kill_pods() {
  local round procs
  for round in $(seq 1 50); do
    # (find fails for a hierarchy without kubepods: not every one has it.)
    procs=$({ find /sys/fs/cgroup/*/kubepods -name cgroup.procs -exec cat {} + 2>/dev/null || true; } | sort -u)
    [ -z "$procs" ] && return 0
    # shellcheck disable=SC2086
    kill -KILL $procs 2>/dev/null || true
    sleep 0.1
  done
  say "processes left in kubepods cgroups: $procs"
}

# kill_exe PATH...: SIGKILL to every process whose executable is one of PATHs or under one of
# them (a directory ending in /).
kill_exe() {
  local p exe prefix
  for p in /proc/[0-9]*; do
    exe=$(readlink "$p/exe" 2>/dev/null) || continue
    for prefix in "$@"; do
      case "$exe" in "$prefix"*) kill -KILL "${p#/proc/}" 2>/dev/null || true ;; esac
    done
  done
}

# The iptables rules and chains of kube-proxy, kubelet and the test network's CNI plugins,
# and the bridge.
clean_network() {
  # kube-proxy's own clean-up of its rules, then what kubelet and the CNI plugins left.
  "$BIN/kube-proxy" --cleanup >/dev/null 2>&1 || true
  local ipt table chain
  for ipt in iptables ip6tables; do
    command -v $ipt >/dev/null || continue
    for table in filter nat mangle; do
      # Rules of gpushare's test network, and every KUBE- chain (no one else makes them).
      $ipt-save -t $table 2>/dev/null | grep -E '^-A ' | grep -E 'gpushare-test|KUBE-' | sed 's/^-A /-D /' |
        while read -r rule; do eval "$ipt -t $table $rule" 2>/dev/null || true; done || true
      for chain in $($ipt-save -t $table 2>/dev/null | sed -n 's/^:\(\(KUBE\|CNI\)-[^ ]*\).*/\1/p' || true); do
        # A CNI- chain goes only when nothing refers to it any more (podman's may).
        if [ "${chain#CNI-}" != "$chain" ] && $ipt-save -t $table | grep -qE "^-A .* -j $chain( |$)"; then continue; fi
        $ipt -t $table -F "$chain" 2>/dev/null || true
        $ipt -t $table -X "$chain" 2>/dev/null || true
      done
    done
  done
  ip link del "$bridge" 2>/dev/null || true
}

# unmount_under DIR...: every mount under the DIRs, deepest first.
unmount_under() {
  local m
  for m in $(findmnt -rn -o TARGET | grep -E "^($(IFS="|"; echo "$*"))(/|$)" | sort -r); do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || say "cannot unmount $m"
  done
}

# The sockets our shims left in /run/containerd/s (all of them are killed by now): those not
# there before up.
remove_shim_sockets() {
  local f
  [ -f "$run/shim-sockets-before" ] || return 0
  for f in /run/containerd/s/*; do
    [ -S "$f" ] || continue
    grep -qxF "${f##*/}" "$run/shim-sockets-before" || rm -f "$f"
  done
}

# Every kubepods cgroup, deepest first, under every hierarchy.
remove_kubepods_cgroups() {
  local d
  for d in $(find /sys/fs/cgroup/*/kubepods -depth -type d 2>/dev/null); do
    rmdir "$d" 2>/dev/null || say "cannot remove cgroup $d"
  done
}

down() {
  [ "$(id -u)" -eq 0 ] || die "needs root"
  local BIN NODE
  BIN=$(sed -n 's/^BIN=//p' "$run/env" 2>/dev/null || true)
  NODE=$(sed -n 's/^NODE=//p' "$run/env" 2>/dev/null || true)
  [ -n "$BIN" ] || BIN=$(bin_dir)
  # Pods deleted through the API first, while kubelet runs: it stops their containers,
  # unprepares their claims and runs CNI's DEL (which removes the bridge plugin's iptables
  # rules).
  if [ -f "$run/admin.kubeconfig" ] && [ -f "$pids/kubelet" ] && kill -0 "$(cat "$pids/kubelet")" 2>/dev/null &&
    curl -sf http://127.0.0.1:10248/healthz >/dev/null 2>&1 && node_ready; then
    local k="$BIN/kubectl --kubeconfig=$run/admin.kubeconfig"
    # Workloads before the DRA plugin's own pods: their claims are unprepared through it.
    local err
    err=$($k delete pods -A --field-selector=metadata.namespace!=gpushare --wait=true --timeout=60s 2>&1 >/dev/null) ||
      say "pods not all deleted in 60 s ($err); killing what is left"
    $k delete daemonsets --all -A --wait=true --timeout=30s >/dev/null 2>&1 || true
    $k delete pods --all -A --wait=true --timeout=30s >/dev/null 2>&1 || say "pods not all deleted in 30 s; killing what is left"
  fi
  stop kube-proxy
  stop kubelet
  kill_pods
  stop containerd
  kill_exe "$BIN/"
  stop kube-scheduler
  stop kube-controller-manager
  stop kube-apiserver
  stop etcd
  kill_exe "$BIN/"
  remove_shim_sockets
  clean_network
  unmount_under "$run" "$var" "$kubelet_root"
  remove_kubepods_cgroups
  rm -f /var/lib/cni/results/gpushare-test-* 2>/dev/null || true
  for l in /var/log/containers/*; do
    case "$(readlink "$l" 2>/dev/null)" in "$var"/*) rm -f "$l" ;; esac
  done
  rm -rf "$run" "$var" "$kubelet_root"
  say "node down"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  env) [ -f "$run/env" ] || die "no node is up (tests/cluster/node.sh up)"; cat "$run/env" ;;
  restart-kubelet) restart_kubelet ;;
  power-off) power_off ;;
  power-on) power_on ;;
  *) die "usage: $0 up|down|env|restart-kubelet|power-off|power-on" ;;
esac
